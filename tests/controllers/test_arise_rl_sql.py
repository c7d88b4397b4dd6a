"""ARISE-RL with the generator domain over the SQL env (``configs/arise_rl.py:sql,smoke``): one
generator step, one pool refresh and one solver step through the real pipeline, Services, agent
loop, SQL env, spaced tokenizer and programmatic judge, with a scripted engine standing in for
the tiny policy (deterministic, seconds). The interface's flag and its errors."""

import dataclasses
import math
import re

import numpy as np
import pytest

from configs import arise_rl as arise_rl_config
from rubric_rl.config import builders
from rubric_rl.envs import constraint_writer, sql_writer
from rubric_rl.envs.constraint_writer import ConstraintTaskWriter
from rubric_rl.envs.sql_data import SYSTEM_PROMPT, database_rows
from rubric_rl.envs.sql_writer import COACH_HINTS, SqlTaskWriter, format_generated
from rubric_rl.envs.tool_calls import render_tool_call
from rubric_rl.loop.trainer_batch import rollouts_to_batch
from rubric_rl.methods.arise_rl.arise_rl import SIGNAL, AriseRLConfig, AriseRLController
from rubric_rl.methods.arise_rl.arise_rl_domain import build_generator_domain
from rubric_rl.services.sampler import _STREAM_STRIDE, stream_base
from tests.controllers.test_arise_rl import ScriptEngine, scripted_steps

K = 4
J = 5
COUNT = render_tool_call("sql", {"query": "SELECT COUNT(*) FROM employees"})
QUESTION = "How many employees does the company have?"
_OBSERVED = re.compile(r"COUNT\(\*\)\s*\n(\d+)")
STREAMS = ("arise_rl/attempts", "arise_rl/memory", "arise_rl/refresh", "arise_rl/base_probe")


def _stream(task_index: int) -> str:
    for s in STREAMS:
        if stream_base(s) <= task_index < stream_base(s) + _STREAM_STRIDE:
            return s
    return "train"


class SqlScriptEngine(ScriptEngine):
    """The stand-in policy, reading the SQL env's observations from its prompt.

    Generator sample j of 5: 0 runs ``SELECT COUNT(*) FROM employees`` and then asks for that count
    (grounded); 1 and 4 write no question; 2 writes a parseable task whose answer it never saw;
    3 names a table the database lacks (a majority fails the format: the coach's format memory);
    with a ``<coach>`` block every sample is grounded. Solver: counts the employees, then answers
    that count when right, count + 1 otherwise: right with a ``<coach>`` block, on even K-attempt
    samples (c = K/2), on base-probe samples, and on trained sample 0 only."""

    def respond(self, r, text, j):
        seen = _OBSERVED.findall(text)
        if "You write tasks" in text:
            if "<coach>" in text:
                j = 0
            if j == 0:
                if not seen:
                    return COUNT
                crits = [f"answer_equals: {seen[-1]}", "queried_tables: employees", "no_write"]
                return format_generated(QUESTION, crits)
            if j == 2:
                return format_generated(QUESTION, ["answer_equals: 999"])
            if j == 3:
                return format_generated(QUESTION, ["answer_equals: 5", "queried_tables: staff"])
            return "hello"
        assert SYSTEM_PROMPT[:40] in text
        if not seen:
            return COUNT
        stream = _stream(r.task_index)
        right = (
            "<coach>" in text
            or stream == "arise_rl/base_probe"
            or (stream == "arise_rl/attempts" and j % 2 == 0)
            or (stream == "train" and j == 0)
        )
        n = int(seen[-1])
        return f"Answer: {n if right else n + 1}"


def _config():
    c = arise_rl_config.get_config("sql,smoke")
    c.unlock()
    c.calibration.enabled = False
    c.rollout.update(samples_per_task=J, tasks_per_step=2)
    c.arise_rl.update(
        cycles=1, generator_steps=1, solver_steps=1, k_attempts=K, pool_min=1, refresh_rollouts=4,
        refresh_batch=2, memory_rollouts=2, warmup_steps=0, solver_policy="frozen",
        base_probe_tasks=1, n_negatives=2,
    )  # fmt: skip
    c.domain.update(n_train=16, n_heldout=8, n_ood=8)
    c.lock()
    return c


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = _config()
    workdir = str(tmp_path_factory.mktemp("arise_rl_sql"))
    services, controllers, domain, steps, engine = scripted_steps(
        workdir, config, SqlScriptEngine, (1, 2)
    )
    yield config, services, controllers, domain, steps
    engine.close()


def _ctl(controllers) -> AriseRLController:
    (ctl,) = controllers.controllers
    return ctl


def test_generator_step_on_sql(run):
    _, _, controllers, domain, steps = run
    rollouts, ctx, requests = steps[1]
    ctl = _ctl(controllers)
    assert isinstance(ctl.generator_domain.writer, SqlTaskWriter)
    train_dbs = {t.raw["db_seed"] for t in domain.train}
    assert set(ctl.generator_domain.writer.db_seeds) == train_dbs
    # the embedded tokenizer has the generator's words (config.domain.generator_units)
    assert set(sql_writer.generator_units()) <= set(domain.vocabulary)
    assert [g.role for g in rollouts.groups] == ["generator", "generator"]
    for g in rollouts.groups:
        assert g.task.env_name == "sql_generator" and g.task.raw["db_seed"] in train_dbs
        infos = [t.info["arise_rl"] for t in g.trajectories]
        # grounded, c = K/2 (R_diff = 2): R_G = 3; the rest 0 with their reasons counted
        assert [i["r_g"] for i in infos] == [3.0, 0.0, 0.0, 0.0, 0.0]
        assert [i["fmt_reason"] for i in infos] == [
            None, "no_question", None, "unknown_table", "no_question"
        ]  # fmt: skip
        assert [i["tool"] for i in infos] == [True, False, False, False, False]
        assert [i["c"] for i in infos] == [K // 2, None, None, None, None]
        assert all(math.isnan(t.signals["task_verifier"]) for t in g.trajectories)
        assert g.trajectories[0].info["tool_calls"] == 1  # the SQL env ran the query
    m = ctx.metrics
    for k in ("fmt_rate", "tool_rate", "gates_rate", "solved", "difficulty_rate"):
        assert 0.0 <= m[f"arise_rl/generator/{k}"] <= 1.0
    assert m["arise_rl/generator/fmt_rate"] == pytest.approx(2 / 5)
    assert m["arise_rl/generator/tool_rate"] == pytest.approx(1 / 5)
    assert m["arise_rl/generator/reason/no_question"] == pytest.approx(2 / 5)
    assert m["arise_rl/generator/reason/unknown_table"] == pytest.approx(1 / 5)
    assert m[f"arise_rl/generator/c/{K // 2}"] == 1.0
    # The K attempts are agent episodes in the SQL env (a query turn and an answer turn each) on
    # the frozen solver: 2 grounded trained episodes + 2 groups x J' = 2 grounded memory ones.
    attempts = [(t, h) for rid, t, h in requests if "/turn" in rid and SYSTEM_PROMPT[:40] in t]
    assert len(attempts) == (2 + 4) * K * 2
    assert {h for _, h in attempts} == {"snapshot2"}
    # The format memory (COACH_HINTS), Δr = 3 − 3/5, teachers see the memory after the tools.
    assert m["arise_rl/rgsed/delta_r"] == pytest.approx(3.0 - 3.0 / 5.0)
    for g in rollouts.groups:
        for t in g.trajectories:
            system = t.teacher_prompt[0]["content"]
            assert system.startswith(g.messages[0]["content"])
            assert "<coach> remember : " + COACH_HINTS["format"] in system
            assert system.index("<coach>") < system.index('"name": "list_tables"')
    assert ctl.recent[-1] == QUESTION


def test_refresh_pool_holds_sql_tasks_with_db_seeds(run):
    _, _, controllers, domain, steps = run
    rollouts, ctx, requests = steps[2]
    ctl = _ctl(controllers)
    # the refresh's role prompts carry the recent questions as in-context negatives (App. D.5)
    refresh = [t for _, t, _ in requests if "You write tasks" in t]
    assert len(refresh) == 4 * 2  # 4 rollouts, one per prompt: a query turn and a final turn
    negative = f"Do not repeat or paraphrase these questions: <question> {QUESTION} </question>"
    assert all(negative in t for t in refresh)
    train_dbs = {t.raw["db_seed"] for t in domain.train}
    assert 1 <= len(ctl.pool) <= 2  # 4 grounded rollouts over 2 databases, deduplicated
    for t in ctl.pool:
        raw = t.raw
        assert t.env_name == "sql" and raw["split"] == "generated" and raw["db_seed"] in train_dbs
        assert raw["expected"] == [len(database_rows(raw["db_seed"])["employees"])]
        assert {c.id for c in t.rubric.criteria} == {
            "answer_correct", "read_required_tables", "write_attempted"
        }  # fmt: skip
    s = ctl.pool_stats
    assert s["rollouts"] == 4.0 and s["parse_rate"] == 1.0 and s["filled"] == 0.0
    assert s["generated"] == len(ctl.pool) and s["duplicates"] == 4 - len(ctl.pool)
    assert s["base_pass_rate"] == 1.0 and s["base_probe_tasks"] == 1.0
    m = ctx.metrics
    assert 0.0 <= m["arise_rl/pool/parse_rate"] <= 1.0
    assert {g.task.id for g in rollouts.groups} <= {t.id for t in ctl.pool}
    # the pool survives a checkpoint round trip (re-parsed from its records)
    fresh = AriseRLController(
        ctl.cfg, fallback_tasks=ctl.fallback_tasks, tasks_per_step=2,
        generator_domain=ctl.generator_domain,
    )  # fmt: skip
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.pool == ctl.pool


def test_solver_step_on_sql(run):
    config, services, controllers, _, steps = run
    rollouts, ctx, requests = steps[2]
    assert [g.role for g in rollouts.groups] == ["solver", "solver"]
    wrong = 0.8 * 2 / 3  # answer missed, tables read, no write: eq. 7's unweighted s = 2/3
    for g in rollouts.groups:
        assert g.trajectories[0].info["tool_calls"] == 1  # agent episodes in the SQL env
        np.testing.assert_allclose([t.signals[SIGNAL] for t in g.trajectories], [1.0] + [wrong] * 4)
        assert [t.signals["task_verifier"] for t in g.trajectories] == [1.0, 0, 0, 0, 0]
    m = ctx.metrics
    assert m["arise_rl/solver/success_rate"] == pytest.approx(1 / 5)
    assert 0.0 <= m["arise_rl/solver/reward"] <= 1.0
    # memory rollouts: agent episodes with the coach's memory, all right: Δr = 1 − mean(standard)
    assert m["arise_rl/rgsed/delta_r"] == pytest.approx(1.0 - (1.0 + 4 * wrong) / 5)
    mem = [t for rid, t, _ in requests if "<coach>" in t and SYSTEM_PROMPT[:40] in t]
    assert len(mem) == 2 * 2 * 2  # 2 groups x J' = 2 episodes x 2 turns
    for g in rollouts.groups:
        system = g.trajectories[0].teacher_prompt[0]["content"]
        coach = system[system.index("<coach>") : system.index("</coach>")]
        # the missed answer criterion, without its value (the memory never states the answer)
        assert "remember : The final answer equals the result of the question's query" in coach
        assert str(g.task.raw["expected"][0]) not in coach
        assert system.index("</coach>") < system.index('"name": "list_tables"')
    # Teacher alignment: the student's exact completion tokens after the teacher's prompt.
    tb = rollouts_to_batch(rollouts, services, True, None)
    ids, tids = np.asarray(tb.input_ids), np.asarray(tb.teacher_input_ids)
    p = services.prompt_len([len(g.prompt_ids) for g in rollouts.groups])
    rows = [t for g in rollouts.groups for t in g.trajectories]
    for b, t in enumerate(rows):
        n, tp = len(t.tokens), p + int(np.asarray(tb.teacher_offset)[b])
        assert list(ids[b, p : p + n]) == list(t.tokens)
        assert list(tids[b, tp : tp + n]) == list(t.tokens)


# --- the flag -----------------------------------------------------------------------------------


def test_generator_domain_flag_and_errors():
    constraints = builders.build_domain(arise_rl_config.get_config("smoke"))
    role = build_generator_domain("constraint", constraints)
    assert isinstance(role.writer, ConstraintTaskWriter) and role.writer.complete
    assert role.env_name == constraint_writer.GENERATOR_ENV and not role.solver_agent
    assert not build_generator_domain(
        "constraint", constraints, rubric_completion="as_written"
    ).writer.complete
    with pytest.raises(ValueError, match="config.arise_rl.generator_domain must name"):
        AriseRLConfig(generator_domain="")
    with pytest.raises(ValueError, match="writes tasks of another domain.*writer is 'constraint'"):
        build_generator_domain("web", constraints)
    with pytest.raises(ValueError, match="rubric_completion must be one of"):
        build_generator_domain("constraint", constraints, rubric_completion="some")
    with pytest.raises(ValueError, match="has no task writer"):
        build_generator_domain("constraint", dataclasses.replace(constraints, task_writer=None))
    with pytest.raises(ValueError, match="needs the SQL domain's training tasks"):
        SqlTaskWriter.from_tasks(constraints.train[:4], observed=lambda *a, **k: True)
    c = arise_rl_config.get_config("smoke")
    c.unlock()
    c.arise_rl.generator_domain = "sql"  # without the sql domain
    with pytest.raises(ValueError, match="generator_domain='sql' writes tasks of another domain"):
        builders.build_controllers(c, builders.build_domain(c))
    c = arise_rl_config.get_config("sql,smoke")
    c.unlock()
    c.rollout.mode = "single"
    with pytest.raises(ValueError, match="config.rollout.mode must be 'agent'"):
        builders.build_controllers(c, builders.build_domain(c))
    with pytest.raises(ValueError, match="'gpu' is for the 'sql' variant"):
        arise_rl_config.get_config("gpu")
    for v in ("sql", "sql,seed_scale", "sql,protocol", "sql,no_rgsed", "sql,current_solver"):
        c = arise_rl_config.get_config(v)
        a = c.arise_rl
        assert a.generator_domain == "sql" and c.domain.name == "sql" and c.domain.generator_units
        assert c.train.steps == a.cycles * (a.generator_steps + a.solver_steps)
        AriseRLConfig(**{**a.to_dict(), "rgsed_roles": tuple(a.rgsed_roles)})
    assert arise_rl_config.get_config("").arise_rl.generator_domain == "constraint"
    g = arise_rl_config.get_config("sql,gpu")
    assert g.arise_rl.generator_domain == "sql" and g.rollout.mode == "agent"
    assert g.rollout.engine == "sglang" and g.judge.kind == "programmatic"
    assert g.arise_rl.generator_max_new_tokens == g.rollout.max_new_tokens
