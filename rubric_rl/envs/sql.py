"""A DBBench-like SQL environment: answer questions by querying a generated sqlite3 database.

Every task carries a database seed; ``reset`` rebuilds that database in memory (the serialized
bytes are cached per seed, so an env per rollout is cheap). The model explores it with
``list_tables()`` / ``describe(table)`` and runs ``sql(query)``; the final answer is plain text
ending in ``Answer: ...``. Ground truth comes from executing the task's reference SQL.

Read-only is enforced by sqlite itself, not by parsing the query: ``PRAGMA query_only=ON`` plus an
authorizer (``set_authorizer``) that allows only SELECT / READ / FUNCTION / RECURSIVE and a list
of read-only PRAGMAs, and denies everything else (INSERT, UPDATE, DELETE, CREATE, DROP, ALTER,
ATTACH — which also covers ``VACUUM INTO`` —, transactions, writing PRAGMAs...). The read-only
PRAGMAs also work as table-valued functions (``SELECT name FROM pragma_table_info('orders')``):
their virtual tables are created before the authorizer is installed (creating one asks to update
``sqlite_master``), and reading them is a schema look-up. ``REINDEX`` never reaches the
authorizer, so it is refused by its leading keyword and scored as the write it is. A progress
handler aborts a statement past its deadline (checked every ``PROGRESS_EVERY`` VM instructions,
and between fetched rows), results are capped in rows and characters, ``SQLITE_LIMIT_LENGTH``
bounds blob/string sizes, ``SQLITE_LIMIT_COLUMN`` the columns, and the fetched cells' bytes are
capped (``max_result_bytes``): with one cell of at most ``max_blob_bytes`` per instruction, a
wide row of large cells can neither outrun the deadline nor fill memory. A refused or aborted
statement comes back as a clear observation; the database is byte-for-byte unchanged
(``db_fingerprint``).
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
import time
from typing import Any

from rubric_rl.envs.base import ENVS, Env, ToolOutput, tool_error
from rubric_rl.envs.sql_data import GENERATORS, SYSTEM_PROMPT, database_rows, open_database
from rubric_rl.envs.tool_calls import Param, ToolSpec, render_tool_call
from rubric_rl.envs.trajectory import (
    answer_criterion,
    common_criteria,
    format_answer,
    transcript_of,
)
from rubric_rl.rubrics import checkers
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verifier

# --------------------------------------------------------------------------------------------
# The environment

_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{n}"): n
    for n in (
        "CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER "
        "CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX "
        "DROP_TEMP_TABLE DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA "
        "READ SELECT TRANSACTION UPDATE ATTACH DETACH ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE "
        "DROP_VTABLE FUNCTION SAVEPOINT RECURSIVE"
    ).split()
}
_ALLOWED_ACTIONS = frozenset(
    (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE)
)
# Functions a query may not call although SELECT may call functions: fts3_tokenizer(name) returns
# the address of a tokenizer module in this process (and with two arguments installs one from an
# address); load_extension loads code.
_REFUSED_FUNCTIONS = frozenset(("fts3_tokenizer", "load_extension"))
# VM instructions between deadline checks: one instruction may build a cell of up to
# max_blob_bytes (printf('%.*c', n, 'x')), so checking every 1000 let a wide row of such cells
# run seconds past the limit; 100 bounds that to ~100 cells of work.
PROGRESS_EVERY = 100
_READ_ONLY_PRAGMAS = frozenset(
    "table_info table_xinfo table_list index_list index_info index_xinfo foreign_key_list "
    "database_list collation_list function_list module_list pragma_list compile_options".split()
)
# Statements sqlite runs without consulting the authorizer (sqlite 3.40: REINDEX rebuilds every
# index and asks nothing): refused by their leading keyword.
_UNAUTHORIZED_WRITES = frozenset({"REINDEX"})
_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*", re.DOTALL)


@ENVS.register("sql")
class SqlEnv(Env):
    name = "sql"
    TOOLS = (
        ToolSpec("list_tables", "List the tables of the database with their row counts."),
        ToolSpec(
            "describe",
            "Show the columns (name, type, keys) of one table.",
            (("table", Param("string", "Table name.")),),
        ),
        ToolSpec(
            "sql",
            "Run one read-only SQL statement (SELECT) and return its rows.",
            (("query", Param("string", "A single SQLite SELECT statement.")),),
        ),
    )
    TASK_TYPES = {
        "lookup": ("schema_exploration", "filtering"),
        "aggregate": ("aggregation", "filtering"),
        "join": ("join", "schema_exploration"),
        "filter_order": ("filtering", "ordering"),
        "group": ("aggregation", "grouping", "ordering"),
    }
    OOD_TASK_TYPES = ("group",)
    TASKS_PER_WORLD = 8  # questions per generated database
    WORLD_KIND = "db"

    def __init__(
        self,
        *,
        time_limit_s: float = 1.0,
        max_rows: int = 50,
        max_blob_bytes: int = 100_000,
        max_columns: int = 64,
        max_result_bytes: int = 1_000_000,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if time_limit_s <= 0 or max_rows < 1:
            raise ValueError(
                f"SqlEnv: need time_limit_s > 0 and max_rows >= 1 (got {time_limit_s}, {max_rows})"
            )
        if min(max_blob_bytes, max_columns, max_result_bytes) < 1:
            raise ValueError(
                "SqlEnv: max_blob_bytes, max_columns and max_result_bytes must be >= 1 (got "
                f"{max_blob_bytes}, {max_columns}, {max_result_bytes})"
            )
        self.time_limit_s = time_limit_s
        self.max_rows = max_rows
        self.max_blob_bytes = max_blob_bytes
        self.max_columns = max_columns
        self.max_result_bytes = max_result_bytes
        self._conn: sqlite3.Connection | None = None
        self._deadline: float | None = None
        self._timed_out = False
        self._tables_read: set[str] = set()
        self._schema_read = False
        self._denied: list[str] = []

    # -- lifecycle ----------------------------------------------------------------------------

    def _setup(self, task: Task, seed: int | None) -> None:
        raw = task.raw or {}
        if "db_seed" not in raw:
            raise ValueError(f"task {task.id!r}: raw['db_seed'] is missing (not an sql task?)")
        conn = open_database(int(raw["db_seed"]))
        conn.execute("PRAGMA query_only = ON")
        for name in sorted(_READ_ONLY_PRAGMAS):  # create the pragma_* tables (module docstring)
            conn.execute(f"SELECT * FROM pragma_{name} LIMIT 0").fetchall()
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.max_blob_bytes)
        conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, self.max_columns)
        conn.set_authorizer(self._authorize)
        conn.set_progress_handler(self._progress, PROGRESS_EVERY)
        self._conn = conn

    def _teardown(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def db_fingerprint(self) -> str:
        """sha256 of the live database's bytes: unchanged by anything the model runs."""
        if self._conn is None:
            raise RuntimeError("SqlEnv.db_fingerprint() before reset()")
        return hashlib.sha256(self._conn.serialize()).hexdigest()

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
        if action == sqlite3.SQLITE_READ and arg1:
            if arg1.lower().startswith(("sqlite_", "pragma_")):
                self._schema_read = True
            else:
                self._tables_read.add(arg1.lower())
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _REFUSED_FUNCTIONS:
            self._denied.append(f"FUNCTION {arg2}")
            return sqlite3.SQLITE_DENY
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _READ_ONLY_PRAGMAS:
            self._schema_read = True
            return sqlite3.SQLITE_OK
        what = _ACTION_NAMES.get(action, f"action {action}")
        self._denied.append(f"{what} {arg1}" if arg1 else what)
        return sqlite3.SQLITE_DENY

    def _progress(self) -> int:
        if self._deadline is not None and time.monotonic() > self._deadline:
            self._timed_out = True
            return 1  # non-zero aborts the running statement
        return 0

    # -- tools --------------------------------------------------------------------------------

    def _tables(self) -> list[str]:
        rows = self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall()
        return [r[0] for r in rows]

    def _tool_list_tables(self) -> ToolOutput:
        parts = []
        for t in self._tables():
            n = self._conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0]
            parts.append(f"{t} ({n} rows)")
        return ToolOutput("Tables: " + ", ".join(parts))

    def _tool_describe(self, table: str) -> ToolOutput:
        tables = self._tables()
        match = next((t for t in tables if t.lower() == table.strip().lower()), None)
        if match is None:
            raise tool_error(
                f"no table named {table!r}; tables: {', '.join(tables)}", reason="unknown_table"
            )
        fks = {
            r[3]: f"{r[2]}({r[4]})"
            for r in self._conn.execute(f'PRAGMA foreign_key_list("{match}")')
        }
        cols = []
        for _, cname, ctype, _notnull, _default, pk in self._conn.execute(
            f'PRAGMA table_info("{match}")'
        ):
            extra = " PRIMARY KEY" if pk else ""
            extra += f" REFERENCES {fks[cname]}" if cname in fks else ""
            cols.append(f"  {cname} {ctype}{extra}")
        return ToolOutput(f"Table {match}:\n" + "\n".join(cols), {"table": match})

    def _tool_sql(self, query: str) -> ToolOutput:
        if not query.strip():
            raise tool_error("the query is empty", reason="sql_error")
        self._tables_read, self._schema_read, self._denied = set(), False, []
        self._timed_out = False
        self._deadline = time.monotonic() + self.time_limit_s
        verb = leading_keyword(query)
        if verb in _UNAUTHORIZED_WRITES:
            self._denied.append(verb)
            raise self._refusal(None)
        try:
            cur = self._conn.execute(query)
            rows, size = [], 0
            for row in cur:  # row by row: the deadline and the byte budget hold between rows
                size += sum(len(v) if isinstance(v, str | bytes) else 8 for v in row)
                if size > self.max_result_bytes:
                    raise tool_error(
                        f"query result too large: more than {self.max_result_bytes} bytes in "
                        f"its first {len(rows) + 1} row(s); select fewer or narrower columns "
                        "(length(...), substr(...)) or add LIMIT. The database is unchanged.",
                        reason="result_too_large",
                    )
                self._progress()
                if self._timed_out:
                    raise sqlite3.OperationalError("interrupted")
                rows.append(row)
                if len(rows) > self.max_rows:
                    break
            columns = [d[0] for d in cur.description or ()]
        except (sqlite3.Error, sqlite3.Warning) as e:
            raise self._refusal(e) from None
        finally:
            self._deadline = None
        truncated = len(rows) > self.max_rows
        rows = rows[: self.max_rows]
        lines = [" | ".join(columns)] if columns else []
        lines += [" | ".join(_cell(v) for v in row) for row in rows]
        if truncated:
            lines.append(
                f"(showing the first {self.max_rows} rows; more rows exist - "
                "narrow the query or add LIMIT)"
            )
        else:
            lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
        details = {
            "tables": sorted(self._tables_read),
            "schema_read": self._schema_read,
            "rows": len(rows),
            "truncated": truncated,
        }
        return ToolOutput("\n".join(lines), details)

    def _refusal(self, e: Exception | None) -> Exception:
        tables = sorted(self._tables_read)
        if self._timed_out:
            return tool_error(
                f"query aborted: it ran longer than the {self.time_limit_s:g} s time limit. "
                "The database is unchanged.",
                reason="timeout",
                tables=tables,
            )
        if self._denied:
            return tool_error(
                "query refused: the database is read-only and only SELECT statements may run "
                f"(not allowed: {', '.join(self._denied)}). The database is unchanged.",
                reason="write_refused",
                refused=list(self._denied),
                tables=tables,
            )
        if "one statement at a time" in str(e):
            return tool_error("only one SQL statement per call is allowed", reason="sql_error")
        return tool_error(f"sqlite error: {e}", reason="sql_error", tables=tables)

    # -- task bank ----------------------------------------------------------------------------

    @classmethod
    def make_task(cls, task_id: str, task_type: str, db_seed: int, rng: random.Random) -> Task:
        """One question of ``task_type`` over database ``db_seed``, with its programmatic rubric."""
        if task_type not in GENERATORS:
            raise ValueError(f"unknown sql task type {task_type!r}; known: {sorted(GENERATORS)}")
        db = database_rows(db_seed)
        conn = open_database(db_seed)
        try:
            for _ in range(100):
                question, ref_sql, tables, ordered, tie_sql = GENERATORS[task_type](rng, db)
                rows = conn.execute(ref_sql).fetchall()
                if not rows or len(rows) > 10 or any(r[0] is None for r in rows):
                    continue
                if tie_sql is not None:
                    keys = [r[0] for r in conn.execute(tie_sql).fetchall()]
                    if len(keys) > 1 and keys[0] == keys[1]:
                        continue  # "the most" must be unique
                break
            else:
                raise RuntimeError(f"could not generate a {task_type} question for db {db_seed}")
        finally:
            conn.close()
        expected = tuple(r[0] for r in rows)
        caps = cls.TASK_TYPES[task_type]
        rubric = Rubric(
            (
                answer_criterion(
                    expected,
                    ordered=ordered,
                    weight=5.0,
                    capability=caps[0],
                    text="The final answer equals the result of the question's "
                    "query over the database.",
                ),
                Criterion(
                    id="read_required_tables",
                    title="Queried the right tables",
                    text="Successfully queried every table the question needs: "
                    + ", ".join(tables)
                    + ".",
                    weight=2.0,
                    verifier=Verifier.rule("sql_read_tables", tables=tables),
                    capability="join" if len(tables) > 1 else "schema_exploration",
                    tags=("trajectory",),
                ),
                Criterion(
                    id="explored_schema",
                    title="Explored the schema first",
                    text="Looked at the schema (tables or columns) before querying the data.",
                    weight=1.0,
                    verifier=Verifier.rule("sql_explored_schema"),
                    capability="schema_exploration",
                    tags=("trajectory",),
                ),
                Criterion(
                    id="write_attempted",
                    title="Tried to modify the database",
                    text="Ran a statement that would modify the read-only database.",
                    weight=-2.0,
                    verifier=Verifier.rule("sql_write_attempted"),
                    capability="tool_use",
                    tags=("trajectory",),
                ),
            )
            + common_criteria()
        )
        return Task(
            id=task_id,
            prompt=(Message("system", SYSTEM_PROMPT), Message("user", question)),
            rubric=rubric,
            reference_answer=format_answer(expected),
            domain="sql",
            task_type=task_type,
            capabilities=caps,
            env_name=cls.name,
            raw={
                "db_seed": db_seed,
                "reference_sql": ref_sql,
                "tables": list(tables),
                "expected": list(expected),
                "ordered": ordered,
            },
        )

    @classmethod
    def reference_turns(cls, task: Task) -> list[str]:
        return [
            render_tool_call("list_tables"),
            render_tool_call("sql", {"query": task.raw["reference_sql"]}),
            task.reference_answer or "",
        ]


def leading_keyword(query: str) -> str:
    """The statement's first keyword, upper-cased, after whitespace and comments ("" if none)."""
    m = re.match(r"[A-Za-z]+", query[_LEADING_NOISE.match(query).end() :])
    return m.group(0).upper() if m else ""


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.12g}"
    if isinstance(v, bytes):
        return f"<blob {len(v)} bytes>"
    return str(v)


# --------------------------------------------------------------------------------------------
# SQL trajectory checkers


@checkers.register("sql_read_tables")
def check_read_tables(response: str, *, task: Task | None = None, tables: tuple = ()) -> bool:
    """Every table in ``tables`` was read by some successful ``sql`` call."""
    tr = transcript_of(response, task)
    read = {t for r in tr.calls("sql", ok=True) for t in r.details.get("tables", ())}
    return bool(tables) and {t.lower() for t in tables} <= read


@checkers.register("sql_explored_schema")
def check_explored_schema(response: str, *, task: Task | None = None) -> bool:
    """A schema look-up (list_tables, describe, or a query on sqlite_master) came before the
    first successful query over the data."""
    tr = transcript_of(response, task)
    first_schema = first_data = None
    for k, r in enumerate(tr.tool_calls):
        if not r.ok:
            continue
        schema = r.name in ("list_tables", "describe") or bool(r.details.get("schema_read"))
        if schema and first_schema is None:
            first_schema = k
        if r.name == "sql" and r.details.get("tables") and first_data is None:
            first_data = k
    return first_schema is not None and (first_data is None or first_schema < first_data)


@checkers.register("sql_write_attempted")
def check_write_attempted(response: str, *, task: Task | None = None) -> bool:
    """Pitfall: some statement was refused for trying to modify the database."""
    tr = transcript_of(response, task)
    return any(r.details.get("reason") == "write_refused" for r in tr.tool_calls)
