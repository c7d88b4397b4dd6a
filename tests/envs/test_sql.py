"""SQL environment: generated databases, ground truth, read-only enforcement, rubrics."""

import dataclasses
import re
import time

import pytest

from rubric_rl.envs.constraints import ConstraintDomain
from rubric_rl.envs.sql import SqlEnv
from rubric_rl.envs.sql_data import database_bytes, database_rows
from rubric_rl.envs.tool_calls import render_tool_call
from rubric_rl.envs.tool_envs import (
    ENVS,
    env_for_task,
    is_tool_env,
    make_env,
    mixed_task_bank,
    task_bank,
)
from rubric_rl.envs.trajectory import score_rules
from rubric_rl.rubrics.rewards import rubric_reward
from rubric_rl.rubrics.types import Task


def sql(query):
    return render_tool_call("sql", {"query": query})


def verdicts(task, response):
    return {k: v.met for k, v in score_rules(task, response).items()}


def reward(task, response):
    return rubric_reward("weighted", task.rubric, score_rules(task, response)).value


def find_task(task_type, pattern, n=80):
    rx = re.compile(pattern)
    for t in task_bank("sql", "train" if task_type != "group" else "ood", n, 0):
        if t.task_type == task_type and rx.search(t.question):
            return t, rx.search(t.question)
    raise AssertionError(f"no {task_type} task matching {pattern!r}")


@pytest.fixture
def env():
    e = SqlEnv(time_limit_s=0.2)
    yield e
    e.close()


# ---------------------------------------------------------------------------------------------
# Task bank


def test_task_bank_reproducible_typed_and_split():
    a, b = task_bank("sql", "train", 30, 7), task_bank("sql", "train", 30, 7)
    assert a == b and [t.raw for t in a] == [t.raw for t in b]
    assert [t.question for t in task_bank("sql", "train", 30, 8)] != [t.question for t in a]
    held = task_bank("sql", "heldout", 30, 7)
    assert {t.raw["db_seed"] for t in held}.isdisjoint({t.raw["db_seed"] for t in a})
    assert {t.task_type for t in a} == {"lookup", "aggregate", "join", "filter_order"}
    assert {t.task_type for t in task_bank("sql", "ood", 10, 7)} == {"group"}
    for t in a:
        assert t.env_name == "sql" and t.domain == "sql"
        assert t.capabilities == SqlEnv.TASK_TYPES[t.task_type] and t.capabilities
        assert len({t.id for t in a}) == len(a)
        assert all(c.verifier.kind == "rule" for c in t.rubric)
    with pytest.raises(ValueError, match="unknown split"):
        task_bank("sql", "test", 3, 0)
    mixed = mixed_task_bank(["sql", "inventory"], "train", 4, 0)
    assert [t.env_name for t in mixed] == ["sql"] * 4 + ["inventory"] * 4
    assert ENVS.names() == ["inventory", "sql"]
    with pytest.raises(KeyError, match="unknown env 'bash'"):
        make_env("bash")


def test_only_registered_names_are_tool_envs():
    # Every task has an env_name; only registered tool environments get multi-turn rollouts.
    assert is_tool_env("sql") and is_tool_env("inventory")
    assert not is_tool_env(None) and not is_tool_env("list") and not is_tool_env("healthbench")
    sql_task = task_bank("sql", "train", 1, 0)[0]
    assert isinstance(env_for_task(sql_task), SqlEnv)
    list_task = next(t for t in ConstraintDomain(0).tasks("train", 16) if t.task_type == "list")
    assert list_task.env_name == "list"
    with pytest.raises(ValueError, match="env_name 'list' is not a tool environment"):
        env_for_task(list_task)
    # reset refuses another tool env's task, not a task named after an evaluation environment.
    with pytest.raises(ValueError, match="is for env 'inventory', not 'sql'"):
        SqlEnv().reset(task_bank("inventory", "train", 1, 0)[0])
    relabelled = dataclasses.replace(sql_task, env_name="list")
    assert SqlEnv().reset(relabelled).messages == sql_task.prompt


@pytest.mark.parametrize("split", ["train", "heldout", "ood"])
def test_reference_solution_passes_its_rubric(split):
    for task in task_bank("sql", split, 40, 3):
        env = make_env("sql")
        env.reset(task)
        for turn in SqlEnv.reference_turns(task):
            res = env.step(turn)
        assert res.done and res.info["status"] == "answered"
        v = verdicts(task, res.info["response"])
        assert all(v[c.id] is (c.weight > 0) for c in task.rubric), (task.id, v)
        assert reward(task, res.info["response"]) == 1.0
        env.close()


def test_ground_truth_matches_plain_python():
    """Recompute answers from the generated rows, without sqlite."""
    checked = 0
    for t in task_bank("sql", "train", 120, 1):
        db = database_rows(t.raw["db_seed"])
        emps, depts = db["employees"], db["departments"]
        dept_id = {d[1]: d[0] for d in depts}
        q, exp = t.question, t.raw["expected"]
        if m := re.fullmatch(r"What is the salary of (.+)\?", q):
            assert exp == [next(e[4] for e in emps if e[1] == m[1])]
        elif m := re.fullmatch(r"How many employees work in the (\w+) department\?", q):
            assert exp == [sum(e[2] == dept_id[m[1]] for e in emps)]
        elif m := re.match(r"List the names of the (\d) highest-paid employees in the (\w+) ", q):
            staff = sorted((e for e in emps if e[2] == dept_id[m[2]]), key=lambda e: -e[4])
            assert exp == [e[1] for e in staff[: int(m[1])]] and len(exp) == int(m[1])
        elif m := re.fullmatch(r"How many units of (\w+) were ordered in total\?", q):
            assert exp == [sum(o[4] for o in db["orders"] if o[3] == m[1])]
        else:
            continue
        checked += 1
    assert checked >= 20


# ---------------------------------------------------------------------------------------------
# Scripted episodes


def test_scripted_exploration_observations(env):
    task, _ = find_task("join", r"How many employees work in the (\w+) department")
    db = database_rows(task.raw["db_seed"])
    obs = env.reset(task)
    assert [s["function"]["name"] for s in obs.tools] == ["list_tables", "describe", "sql"]
    r = env.step(render_tool_call("list_tables"))
    counts = {k: len(v) for k, v in db.items()}
    assert r.tool_messages[0].content == "Tables: " + ", ".join(
        f"{k} ({counts[k]} rows)" for k in ("customers", "departments", "employees", "orders")
    )
    r = env.step(render_tool_call("describe", {"table": "EMPLOYEES"}))
    assert r.tool_messages[0].content == (
        "Table employees:\n  id INTEGER PRIMARY KEY\n  name TEXT\n"
        "  department_id INTEGER REFERENCES departments(id)\n  title TEXT\n  salary INTEGER\n"
        "  hire_year INTEGER"
    )
    r = env.step(render_tool_call("describe", {"table": "staff"}))
    assert r.tool_messages[0].content.startswith("Error (tool_error): no table named 'staff'")
    r = env.step(sql("SELECT name, city FROM departments ORDER BY id LIMIT 2"))
    d = db["departments"]
    assert r.tool_messages[0].content == (
        f"name | city\n{d[0][1]} | {d[0][2]}\n{d[1][1]} | {d[1][2]}\n(2 rows)"
    )
    assert r.info["tool_calls"][0]["details"]["tables"] == ["departments"]


def test_partial_trajectory_scores(env):
    """Explored, queried only one of the two needed tables, answered wrongly: 2 of 9 points."""
    task, _ = find_task("join", r"How many employees work in the (\w+) department")
    env.reset(task)
    env.step(render_tool_call("list_tables"))
    env.step(sql("SELECT COUNT(*) FROM employees"))
    res = env.step(f"Answer: {len(database_rows(task.raw['db_seed'])['employees'])}")
    assert verdicts(task, res.info["response"]) == {
        "answer_correct": False,
        "read_required_tables": False,
        "explored_schema": True,
        "write_attempted": False,
        "answer_format": True,
        "malformed_tool_call": False,
        "tool_call_after_answer": False,
    }
    assert reward(task, res.info["response"]) == pytest.approx(2 / 9)


def test_correct_answer_without_exploration_and_with_a_write_attempt(env):
    task, _ = find_task("lookup", r"What is the salary of")
    env.reset(task)
    env.step(sql("DELETE FROM employees"))
    env.step(sql(task.raw["reference_sql"]))
    res = env.step(f"It is {task.raw['expected'][0]}.")
    v = verdicts(task, res.info["response"])
    assert v["answer_correct"] and v["read_required_tables"] and v["write_attempted"]
    assert not v["explored_schema"] and not v["answer_format"]
    assert reward(task, res.info["response"]) == pytest.approx((5 + 2 - 2) / 9)


# ---------------------------------------------------------------------------------------------
# Read-only, time limit, caps

WRITES = [
    "INSERT INTO employees (id, name, department_id, title, salary, hire_year) "
    "VALUES (999, 'X', 1, 'Analyst', 1, 2020)",
    "REPLACE INTO departments VALUES (1, 'X', 'Y', 0)",
    "UPDATE employees SET salary = salary * 2",
    "DELETE FROM orders",
    "WITH doomed AS (SELECT id FROM orders) DELETE FROM orders WHERE id IN doomed",
    "DROP TABLE customers",
    "CREATE TABLE notes (x TEXT)",
    "CREATE TEMP TABLE scratch AS SELECT * FROM employees",
    "CREATE INDEX idx ON employees(name)",
    "CREATE VIEW v AS SELECT 1",
    "ALTER TABLE employees ADD COLUMN bonus INTEGER",
    "ATTACH DATABASE ':memory:' AS other",
    "PRAGMA query_only = OFF",
    "PRAGMA user_version = 7",
    "BEGIN",
    "ANALYZE",
]


@pytest.mark.parametrize("statement", WRITES)
def test_writes_are_refused_and_db_unchanged(env, statement):
    task = task_bank("sql", "train", 1, 0)[0]
    env.reset(task)
    before = env.db_fingerprint()
    res = env.step(sql(statement))
    out = res.tool_messages[0].content
    assert out.startswith("Error (tool_error): query refused: the database is read-only"), out
    assert out.endswith("The database is unchanged.")
    assert res.info["tool_calls"][0]["details"]["reason"] == "write_refused"
    assert env.db_fingerprint() == before
    res = env.step(sql("SELECT COUNT(*) FROM orders"))
    n_orders = len(database_rows(task.raw["db_seed"])["orders"])
    assert res.tool_messages[0].content == f"COUNT(*)\n{n_orders}\n(1 row)"
    assert score_rules(task, env.response())["write_attempted"].met is True


def test_vacuum_into_writes_no_file(env, tmp_path):
    env.reset(task_bank("sql", "train", 1, 0)[0])
    target = tmp_path / "copy.db"
    res = env.step(sql(f"VACUUM INTO '{target}'"))
    assert "query refused" in res.tool_messages[0].content and not target.exists()


def test_long_query_is_aborted_and_env_recovers(env):
    task = task_bank("sql", "train", 1, 0)[0]
    env.reset(task)
    before = env.db_fingerprint()
    t0 = time.monotonic()
    res = env.step(
        sql(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
        )
    )
    elapsed = time.monotonic() - t0
    assert 0.2 <= elapsed < 2.0
    assert res.tool_messages[0].content == (
        "Error (tool_error): query aborted: it ran longer than the 0.2 s time limit. "
        "The database is unchanged."
    )
    assert res.info["tool_calls"][0]["details"]["reason"] == "timeout"
    assert env.db_fingerprint() == before
    res = env.step(sql("SELECT 1 + 1 AS two"))
    assert res.tool_messages[0].content == "two\n2\n(1 row)"


def test_row_char_and_blob_caps():
    task = task_bank("sql", "train", 1, 0)[0]
    env = SqlEnv(max_rows=3)
    env.reset(task)
    res = env.step(sql("SELECT id FROM orders ORDER BY id"))
    assert res.tool_messages[0].content == (
        "id\n1\n2\n3\n(showing the first 3 rows; more rows exist - narrow the query or add LIMIT)"
    )
    assert res.info["tool_calls"][0]["details"]["truncated"] is True
    env = SqlEnv(max_output_chars=200, max_blob_bytes=10_000)
    env.reset(task)
    res = env.step(sql("SELECT * FROM orders"))
    assert len(res.tool_messages[0].content) <= 200
    assert "[output truncated:" in res.tool_messages[0].content
    res = env.step(sql("SELECT length(randomblob(100000))"))
    assert res.tool_messages[0].content == (
        "Error (tool_error): sqlite error: string or blob too big"
    )


def _wide(columns: int, cell: int) -> str:
    return "SELECT " + ", ".join(f"printf('%.*c', {cell}, 'x') AS c{i}" for i in range(columns))


def test_a_wide_row_of_large_cells_holds_the_time_limit_and_the_result_budget():
    # One row of 200 one-megabyte cells ran 3.9 s past a 1 s limit (the deadline was checked
    # every 1000 VM instructions, each building a cell), 1000 of them 24 s and 1.9 GB.
    task = task_bank("sql", "train", 1, 0)[0]
    env = SqlEnv(time_limit_s=1.0)
    env.reset(task)
    before = env.db_fingerprint()
    t0 = time.monotonic()
    res = env.step(sql(_wide(200, 1_000_000)))
    assert time.monotonic() - t0 < 1.0
    assert res.tool_messages[0].content == (
        "Error (tool_error): sqlite error: too many columns in result set"
    )
    # Within the column limit, 60 cells of 90 kB (5.4 MB) pass the 1 MB result budget.
    t0 = time.monotonic()
    res = env.step(sql(_wide(60, 90_000)))
    assert time.monotonic() - t0 < 1.0
    assert res.tool_messages[0].content == (
        "Error (tool_error): query result too large: more than 1000000 bytes in its first 1 "
        "row(s); select fewer or narrower columns (length(...), substr(...)) or add LIMIT. The "
        "database is unchanged."
    )
    assert res.info["tool_calls"][0]["details"]["reason"] == "result_too_large"
    # Many rows of narrower cells: the budget holds across rows.
    res = env.step(sql(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 40) "
        "SELECT printf('%.*c', 60000, 'x') FROM n"
    ))  # fmt: skip
    assert "more than 1000000 bytes in its first 17 row(s)" in res.tool_messages[0].content
    assert env.db_fingerprint() == before
    res = env.step(sql("SELECT length(printf('%.*c', 90000, 'x')) AS n"))
    assert res.tool_messages[0].content == "n\n90000\n(1 row)"


@pytest.mark.parametrize("call", ["fts3_tokenizer('simple')", "FTS3_TOKENIZER('porter')"])
def test_pointer_returning_functions_are_refused(env, call):
    # fts3_tokenizer(name) answered with the address of the tokenizer module in this process.
    env.reset(task_bank("sql", "train", 1, 0)[0])
    res = env.step(sql(f"SELECT hex({call})"))
    name = call.split("(")[0].lower()
    assert res.tool_messages[0].content == (
        "Error (tool_error): query refused: the database is read-only and only SELECT statements "
        f"may run (not allowed: FUNCTION {name}). The database is unchanged."
    )


def test_sql_errors_are_observations(env):
    task = task_bank("sql", "train", 1, 0)[0]
    env.reset(task)
    outs = [
        env.step(sql(q)).tool_messages[0].content
        for q in ("SELECT * FROM staff", "SELECT 1; SELECT 2", "   ")
    ]
    assert outs == [
        "Error (tool_error): sqlite error: no such table: staff",
        "Error (tool_error): only one SQL statement per call is allowed",
        "Error (tool_error): the query is empty",
    ]
    assert score_rules(task, env.response())["malformed_tool_call"].met is False


def test_tables_read_are_recorded_on_every_execution(env):
    env.reset(task_bank("sql", "train", 1, 0)[0])
    q = "SELECT e.name FROM employees e JOIN departments d ON d.id = e.department_id LIMIT 1"
    for _ in range(2):  # a cached statement would skip the authorizer
        res = env.step(sql(q))
        assert res.info["tool_calls"][0]["details"]["tables"] == ["departments", "employees"]
    res = env.step(sql("SELECT name FROM sqlite_master"))
    d = res.info["tool_calls"][0]["details"]
    assert d["tables"] == [] and d["schema_read"] is True


def test_envs_are_isolated_and_cache_is_untouched():
    task = task_bank("sql", "train", 1, 0)[0]
    pristine = database_bytes(task.raw["db_seed"])
    a, b = SqlEnv(), SqlEnv()
    a.reset(task)
    b.reset(task)
    assert a.db_fingerprint() == b.db_fingerprint()
    a.step(sql("DROP TABLE orders"))
    assert database_bytes(task.raw["db_seed"]) == pristine
    assert (
        b.step(sql("SELECT COUNT(*) > 0 FROM orders"))
        .tool_messages[0]
        .content.endswith("1\n(1 row)")
    )


def test_bad_tasks_are_rejected():
    task = task_bank("sql", "train", 1, 0)[0]
    bare = Task(id="t1", prompt=task.prompt, rubric=task.rubric, env_name="sql", raw={})
    with pytest.raises(ValueError, match=r"task 't1': raw\['db_seed'\] is missing"):
        SqlEnv().reset(bare)
    with pytest.raises(RuntimeError, match="before reset"):
        SqlEnv().step("hi")
    with pytest.raises(ValueError, match="unknown sql task type"):
        SqlEnv.make_task("x", "pivot", 1, None)


# ---------------------------------------------------------------------------------------------
# Read-only pragma functions, REINDEX, malformed input

PRAGMA_READS = [
    ("SELECT name FROM pragma_table_info('customers') ORDER BY cid", "name\nid\nname\ncountry"),
    ("SELECT COUNT(*) FROM pragma_index_list('orders')", "COUNT(*)\n0"),
    ("SELECT name FROM pragma_table_list WHERE name = 'orders'", "name\norders"),
    (
        "SELECT \"table\" FROM pragma_foreign_key_list('orders') ORDER BY id",
        "table\nemployees\ncustomers\n(2 rows)",
    ),
]


@pytest.mark.parametrize("query, head", PRAGMA_READS)
def test_read_only_pragma_functions_are_reads_not_write_attempts(env, query, head):
    task = task_bank("sql", "train", 1, 0)[0]
    env.reset(task)
    before = env.db_fingerprint()
    res = env.step(sql(query))
    out = res.tool_messages[0].content
    assert out.startswith(head), out
    details = res.info["tool_calls"][0]["details"]
    assert "reason" not in details and details["schema_read"] is True, details
    assert details["tables"] == []  # a schema look-up, not a read of the data
    assert env.db_fingerprint() == before
    v = verdicts(task, env.response())
    assert v["write_attempted"] is False and v["explored_schema"] is True


def test_pragma_functions_join_the_data_tables(env):
    task = task_bank("sql", "train", 1, 0)[0]
    env.reset(task)
    res = env.step(
        sql(
            "SELECT m.name, COUNT(p.name) FROM sqlite_master AS m, pragma_table_info(m.name) AS p "
            "WHERE m.type = 'table' GROUP BY m.name ORDER BY m.name"
        )
    )
    assert res.tool_messages[0].content.splitlines()[1:5] == [
        "customers | 3",
        "departments | 4",
        "employees | 6",
        "orders | 7",
    ]


@pytest.mark.parametrize("statement", ["REINDEX", "reindex orders", "/* x */ -- y\n  ReIndex"])
def test_reindex_is_refused_as_a_write(env, statement):
    task = task_bank("sql", "train", 1, 0)[0]
    env.reset(task)
    before = env.db_fingerprint()
    res = env.step(sql(statement))
    assert res.tool_messages[0].content == (
        "Error (tool_error): query refused: the database is read-only and only SELECT "
        "statements may run (not allowed: REINDEX). The database is unchanged."
    )
    assert res.info["tool_calls"][0]["details"]["refused"] == ["REINDEX"]
    assert env.db_fingerprint() == before
    assert verdicts(task, env.response())["write_attempted"] is True


@pytest.mark.parametrize(
    "body, message",
    [
        (
            '{"name": "sql", "arguments": {"query": ' + "[" * 100_000 + "]" * 100_000 + "}}",
            "nests JSON more than 32 levels deep",
        ),
        (
            '{"name": "sql", "arguments": {"query": ' + "[" * 500 + "]" * 500 + "}}",
            "nests JSON more than 32 levels deep",
        ),
        (
            '{"name": "sql", "arguments": "' + '{\\"a\\": ' * 3000 + "1" + "}" * 3000 + '"}',
            "nests JSON more than 32 levels deep",
        ),
        ('{"name": "sql", "arguments": {"query": 1' + "0" * 5000 + "}}", "not usable JSON"),
    ],
    ids=["deep-100000", "deep-500", "deep-string-arguments", "huge-integer"],
)
def test_malformed_tool_call_input_is_an_error_observation(env, body, message):
    task = task_bank("sql", "train", 1, 0)[0]
    env.reset(task)
    res = env.step(f"<tool_call>{body}</tool_call>")
    (out,) = [m.content for m in res.tool_messages]
    assert out.startswith("Error (malformed_json): the tool call ") and message in out, out[:200]
    assert not res.done and res.info["tool_calls"][0]["error_kind"] == "malformed_json"
    res = env.step(sql("SELECT 1 + 1 AS two"))  # the episode goes on
    assert res.tool_messages[0].content == "two\n2\n(1 row)"
    assert verdicts(task, env.response())["malformed_tool_call"] is True
