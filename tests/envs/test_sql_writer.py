"""The SQL env's task writer, ARISE-RL's generator domain (envs/sql_writer.py): parsing of good and
malformed answers with their reasons, grounding (R_tool) on the episode's own observations, the
produced solver task's verifier and rubric on right and wrong SQL-env answers, deduplication."""

import pytest

from rubric_rl.envs.sql import SqlEnv
from rubric_rl.envs.sql_data import database_rows
from rubric_rl.envs.sql_writer import (
    REASONS,
    SQL_GENERATOR_ENV,
    SqlGeneratorEnv,
    SqlTaskWriter,
    forbidden_signatures,
    format_generated,
    generator_task,
    parse_generated,
    role_prompt,
    task_signature,
)
from rubric_rl.envs.tool_calls import render_tool_call
from rubric_rl.envs.tool_domain import verify_sql
from rubric_rl.envs.trajectory import score_rules
from rubric_rl.methods.arise_rl.arise_rl_domain import GeneratorRole, gate_outcome
from rubric_rl.methods.arise_rl.arise_rl_rewards import tool_observed


def SqlGeneratorDomain(*args, **kw):  # noqa: N802 - the writer as ARISE-RL's controller sees it
    return GeneratorRole(SqlTaskWriter(*args, observed=tool_observed, **kw))


# An episode's parse with the gates' input, as ARISE-RL's controller sees it (any db seed: the
# writer reads it from the transcript).
episode_outcome = SqlGeneratorDomain([0]).episode_outcome

DB = 7
N_EMP = len(database_rows(DB)["employees"])  # 22 on db 7
COUNT_SQL = "SELECT COUNT(*) FROM employees"
QUESTION = "How many employees does the company have?"
GOOD = format_generated(
    QUESTION, [f"answer_equals: {N_EMP}", "queried_tables: employees", "no_write", "be nice"]
)


def test_parse_good_answer_makes_a_checkable_sql_task():
    p = parse_generated(GOOD, db_seed=DB)
    assert p.reason is None and p.expected == (N_EMP,)
    assert (p.num_listed, p.num_unknown, p.unknown) == (4, 1, ("be nice",))  # dropped, counted
    t = p.task
    assert t.env_name == "sql" and t.raw["db_seed"] == DB and t.raw["split"] == "generated"
    assert [m.role for m in t.prompt] == ["system", "user"] and t.prompt[1].content == QUESTION
    got = {c.id: (c.weight, c.verifier.checker, dict(c.verifier.args)) for c in t.rubric.criteria}
    assert got == {
        "answer_correct": (5.0, "env_answer_matches", {"expected": (N_EMP,), "ordered": True}),
        "read_required_tables": (2.0, "sql_read_tables", {"tables": ("employees",)}),
        "write_attempted": (-2.0, "sql_write_attempted", {}),
    }
    assert t.reference_answer == f"Answer: {N_EMP}"
    # strings, decimals and several values (',' separates values)
    p2 = parse_generated(
        format_generated("Which three?", ["answer_equals: Sales, 23.97, 1250", "answer_line"]),
        db_seed=DB,
    )
    assert p2.reason is None and p2.expected == ("Sales", 23.97, 1250)
    # a string answer may be named in the question (choices); a number inside a word is no number
    choice = ["answer_equals: Sales"]
    assert parse_generated(format_generated("Sales or Legal?", choice), db_seed=DB).reason is None
    hired = format_generated("Hired in 2022 or in Q3?", ["answer_equals: 3"])
    assert parse_generated(hired, db_seed=DB).reason is None


@pytest.mark.parametrize(
    "text, reason",
    [
        ("no tags at all", "no_question"),
        ("<question>   </question> <rubric> <criterion> no_write </criterion> </rubric>",
         "empty_question"),
        ("<question> " + "x " * 300 + "</question>", "long_question"),
        (f"<question> {QUESTION} </question>", "no_rubric"),
        (f"<question> {QUESTION} </question> <rubric> answer_equals: 3 </rubric>",
         "stray_rubric_text"),
        (f"<question> {QUESTION} </question> <rubric> <criterion> </criterion> </rubric>",
         "empty_rubric"),
        (format_generated(QUESTION, ["the answer is good"]), "unknown_criterion"),
        (format_generated(QUESTION, ["no_write", "explored_schema"]), "no_answer_criterion"),
        (format_generated(QUESTION, ["answer_equals: 3", "answer_equals: 4"]),
         "conflicting_answers"),
        (format_generated(QUESTION, ["answer_equals: " + ", ".join("1" * 11)]), "bad_answer"),
        (format_generated("Is it 22 employees?", ["answer_equals: 22"]), "answer_in_question"),
        (format_generated("Is it 22.50?", ["answer_equals: 22.5"]), "answer_in_question"),
        (format_generated(QUESTION, ["answer_equals: 3", "queried_tables: staff"]),
         "unknown_table"),
    ],
)  # fmt: skip
def test_malformed_answers_give_a_reason_never_an_exception(text, reason):
    p = parse_generated(text, db_seed=DB)
    assert p.task is None and p.reason == reason and reason in REASONS
    assert gate_outcome(p, True).reason == reason  # R_fmt = 0 with the reason


def _episode(turns, db=DB):
    env = SqlGeneratorEnv(max_turns=4)
    env.reset(generator_task(db, index=0))
    for turn in turns:
        if env.step(turn).done:
            break
    return env.response()


def test_grounding_needs_the_answer_in_an_earlier_observation():
    call = render_tool_call("sql", {"query": COUNT_SQL})
    p, o = episode_outcome(_episode([call, GOOD]))
    assert p.reason is None and o.tool_observed  # 22 was a cell of the sql result
    # a tool call whose result does not show the value: not grounded
    other = render_tool_call("sql", {"query": "SELECT COUNT(*) FROM departments"})
    p, o = episode_outcome(_episode([other, GOOD]))
    assert p.reason is None and not o.tool_observed
    # no tool call at all, and a refused write (an error, not an observation)
    assert not episode_outcome(_episode([GOOD]))[1].tool_observed
    write = render_tool_call("sql", {"query": f"DELETE FROM employees WHERE id > {N_EMP}"})
    assert not episode_outcome(_episode([write, GOOD]))[1].tool_observed
    # list_tables' row counts are observations too
    assert episode_outcome(_episode([render_tool_call("list_tables"), GOOD]))[1].tool_observed
    # an episode cut before a final answer: R_fmt = 0
    p, o = episode_outcome(_episode([call] * 4))
    assert p.reason == "no_final_answer" and o.tool_observed


def _solve(task, turns):
    env = SqlEnv()
    env.reset(task)
    for turn in turns:
        if env.step(turn).done:
            break
    return env.response()


def test_generated_task_verifier_and_rubric_score_sql_env_answers():
    task = parse_generated(GOOD, db_seed=DB).task
    call = render_tool_call("sql", {"query": COUNT_SQL})
    right = _solve(task, [call, f"Answer: {N_EMP}"])
    wrong = _solve(task, [call, f"Answer: {N_EMP + 1}"])
    write = render_tool_call("sql", {"query": "DROP TABLE employees"})
    bad = _solve(task, [write, f"Answer: {N_EMP}"])
    assert verify_sql(task, right) and not verify_sql(task, wrong) and verify_sql(task, bad)
    met = {k: v.met for k, v in score_rules(task, right).items()}
    assert met == {"answer_correct": True, "read_required_tables": True, "write_attempted": False}
    assert not score_rules(task, wrong)["answer_correct"].met
    bad_met = score_rules(task, bad)
    assert bad_met["write_attempted"].met and not bad_met["read_required_tables"].met


def test_signature_deduplicates_and_forbids():
    a = parse_generated(GOOD, db_seed=DB).task
    b = parse_generated(GOOD.replace(QUESTION, "how many  employees does the company have"),
                        db_seed=DB).task  # fmt: skip
    c = parse_generated(GOOD, db_seed=DB + 1).task
    assert a.id != b.id and task_signature(a) == task_signature(b) != task_signature(c)
    held = SqlEnv.task_bank("heldout", 4, 0)
    forbidden = forbidden_signatures(held)
    h = held[0]
    text = format_generated(h.prompt[-1].content, [f"answer_equals: {h.raw['expected'][0]}"])
    assert parse_generated(text, db_seed=h.raw["db_seed"], forbidden=forbidden).reason == (
        "heldout_task"
    )
    dom = GeneratorRole(
        SqlTaskWriter.from_tasks(SqlEnv.task_bank("train", 16, 0), observed=tool_observed)
    )
    assert dom.signature(a) == task_signature(a)
    # a pool record re-parses to the same task
    assert dom.task_from_record(dom.task_record(a), frozenset()) == a


def test_role_prompt_negatives_and_generator_tasks():
    system, user = role_prompt(["q one", "q  two", "q three"], n_negatives=2)
    assert "<question> q two </question> <question> q three </question>" in system.content
    assert "q one" not in system.content and user.role == "user"
    assert "answer_equals" in system.content and "queried_tables" in system.content
    assert "Do not repeat" not in role_prompt([], n_negatives=2)[0].content
    import numpy as np

    dom = SqlGeneratorDomain([3, 5])
    tasks = dom.generator_tasks(np.random.default_rng(0), 4, ["q"], first_index=8, n_negatives=1)
    assert [t.raw["index"] for t in tasks] == [8, 9, 10, 11]
    assert {t.raw["db_seed"] for t in tasks} <= {3, 5}
    assert all(t.env_name == SQL_GENERATOR_ENV and not t.rubric.criteria for t in tasks)
    # the env's task bank: task i over the SQL env's database i of the split
    bank = SqlGeneratorEnv.task_bank("train", 9, 0)
    sql_dbs = [t.raw["db_seed"] for t in SqlEnv.task_bank("train", 9, 0)]
    assert [t.raw["db_seed"] for t in bank][:2] == [sql_dbs[0], sql_dbs[8]]
    # the env's demonstration is a grounded, parseable episode
    t = tasks[0]
    p, o = episode_outcome(_episode(SqlGeneratorEnv.reference_turns(t), db=t.raw["db_seed"]))
    assert p.reason is None and o.tool_observed
