"""The SQL environment's task writer (``Domain.task_writer``): ARISE-RL's generator role over
the SQL environment (seed 002 §3.1, App. D.5, E.1), the same role prompts, on a real model on a
GPU, with the SQL env as the tool.

The generator gets a role prompt and a database (a db seed of the domain's training split), explores
it with the SQL env's read-only tools (``list_tables``, ``describe``, ``sql``: the same
:class:`~rubric_rl.envs.sql.SqlEnv`, so writes are refused by sqlite itself) and ends with a turn
without a tool call::

    <question> How many employees were hired in 2020 or later? </question>
    <rubric>
    <criterion> answer_equals: 7 </criterion>
    <criterion> queried_tables: employees </criterion>
    <criterion> no_write </criterion>
    </rubric>

**The checkable set** (ours: the seed's rubrics are free text judged by an LLM; here every item is
one of these forms, each a rule checker of the SQL env, so nothing is left unchecked):

================================  =====================================  ======
item                              checker (``rubric_rl.rubrics.checkers``)  weight
================================  =====================================  ======
``answer_equals: v1[, v2 …]``     ``env_answer_matches`` (in order)      5
``queried_tables: t1[, t2 …]``    ``sql_read_tables``                    2
``explored_schema``               ``sql_explored_schema``                1
``answer_line``                   ``env_answer_line``                    1
``no_write``                      ``sql_write_attempted`` (a pitfall)    −2
================================  =====================================  ======

The weights are :meth:`SqlEnv.make_task`'s (ours). ``answer_equals`` is required (the solver
task's verifier, ``tool_domain.verify_sql``, reads its values); the tables must exist in the
database; an item of no known form is dropped and counted (``num_unknown``), never kept as free
text. Values are numbers when they read as one (matched within ``NUMERIC_TOLERANCE``), else
strings (case-folded); ours: at most ``MAX_VALUES`` values, and no numeric value may appear as a
number in the question (it would state its answer; a string value may, as in a question offering
choices).

**Parsing** (:func:`parse_generated`, text only, never raises on model output): a reason string
from ``REASONS`` when R_fmt = 0; else a solver ``Task`` of the SQL env on the same database
(``raw["db_seed"]``, ``raw["expected"]``, ``env_name="sql"``, the env's system prompt), so the
trained solver runs it through the agent loop like any SQL task.

**R_tool** (:func:`episode_outcome`, seed eq. 2 "the corresponding tool observation"): every
value of ``answer_equals`` appears as a cell of a successful tool observation (an ``sql`` result
row, or a ``list_tables`` row count) in a turn before the final answer — the answer is grounded
in what the generator saw, not recalled. Ours: the check is value-level; whether the observed
value answers the question is not checked (no LLM judge here).

**Deduplication** (:func:`task_signature`): the database and the question, case-folded with
punctuation and spacing dropped (ours). **Negatives** (seed App. D.5): the most recent accepted
questions in the role prompt's system message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rubric_rl.envs.base import ToolEvent, check_split, derive_seed
from rubric_rl.envs.constraint_writer import (  # the constraint domain's tags
    _CRITERION_RE,
    _QUESTION_RE,
    _RUBRIC_RE,
    GeneratedTask,
)
from rubric_rl.envs.sql import SqlEnv
from rubric_rl.envs.sql_data import SYSTEM_PROMPT, database_rows
from rubric_rl.envs.tool_calls import render_tool_call, strip_reasoning
from rubric_rl.envs.trajectory import (
    ToolRecord,
    Transcript,
    format_answer,
    format_value,
    transcript_of,
    value_matches,
)
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verifier

__all__ = [
    "CRITERION_FORMS",
    "REASONS",
    "SQL_GENERATOR_ENV",
    "GeneratedSqlTask",
    "SqlGeneratorEnv",
    "SqlTaskWriter",
    "episode_outcome",
    "forbidden_signatures",
    "format_generated",
    "generator_task",
    "generator_units",
    "grounded",
    "observed_cells",
    "parse_generated",
    "role_prompt",
    "task_signature",
]

SQL_GENERATOR_ENV = "sql_generator"
GENERATOR_ROLE = "generator"  # Task.domain of a generator-role task
GENERATED_SPLIT = "generated"  # Task.raw["split"] of a parsed task
N_NEGATIVES = 10  # seed App. D.5
MAX_VALUES = 10  # ours: SqlEnv.make_task's questions have at most 10 result rows
MAX_QUESTION_CHARS = 400  # ours

# Every reason ``parse_generated`` / ``episode_outcome`` gives for R_fmt = 0.
REASONS: tuple[str, ...] = (
    "no_final_answer",  # the episode ended without a turn free of tool calls
    "no_question",  # no <question> … </question>
    "empty_question",
    "long_question",  # more than MAX_QUESTION_CHARS characters
    "no_rubric",  # no <rubric> … </rubric>
    "stray_rubric_text",  # text inside <rubric> outside every <criterion> … </criterion>
    "empty_rubric",  # <rubric> holds no criterion
    "unknown_criterion",  # every listed criterion is of no known form
    "no_answer_criterion",  # no answer_equals item
    "conflicting_answers",  # two answer_equals items with different values
    "bad_answer",  # answer_equals with no value or more than MAX_VALUES
    "answer_in_question",  # a numeric value of the answer is a number in the question
    "unknown_table",  # queried_tables names a table the database lacks
    "heldout_task",  # one of the ``forbidden`` signatures (an evaluation task)
)

# form -> (criterion id, title, weight, checker, description); weights as SqlEnv.make_task.
CRITERION_FORMS: dict[str, tuple[str, str, float, str, str]] = {
    "answer_equals": (
        "answer_correct", "Correct final answer", 5.0, "env_answer_matches",
        # the designed tasks' wording: the values stay out of the text (the coach quotes it)
        "The final answer equals the result of the question's query over the database.",
    ),
    "queried_tables": (
        "read_required_tables", "Queried the right tables", 2.0, "sql_read_tables",
        "Successfully queried every one of these tables: {args}.",
    ),
    "explored_schema": (
        "explored_schema", "Explored the schema first", 1.0, "sql_explored_schema",
        "Looked at the schema (tables or columns) before querying the data.",
    ),
    "answer_line": (
        "answer_format", "Answer line", 1.0, "env_answer_line",
        "The final message states the result on an 'Answer:' line.",
    ),
    "no_write": (
        "write_attempted", "Tried to modify the database", -2.0, "sql_write_attempted",
        "Ran a statement that would modify the read-only database.",
    ),
}  # fmt: skip
_ARG_FORMS = frozenset({"answer_equals", "queried_tables"})

# Hints of the generator's coach (``arise_rl.generator_memory``); ours, like the constraint
# domain's.
COACH_HINTS: dict[str, str] = {
    "format": (
        "write the question in <question> </question> and each check in <criterion> "
        "</criterion>, all inside <rubric> </rubric>, with one answer_equals item"
    ),
    "tool": "run the sql query that answers the question before writing answer_equals",
    "too_easy": "ask a question that needs a join or an aggregate over several rows",
    "too_hard": "ask a question about a single table with one filter",
    "keep": "run the sql query first and ask a question like: {question}",
}


# --- the role prompt ----------------------------------------------------------------------------


def role_prompt(recent: Sequence[str] = (), *, n_negatives: int = N_NEGATIVES):
    """The generator's (system, user) messages (seed App. E.1 figs. 14-16's role: call the tools
    before writing tool-dependent criteria; question and rubric in tags), with the last
    ``n_negatives`` of ``recent`` as in-context negatives (App. D.5). Ours: the wording."""
    if n_negatives < 0:
        raise ValueError(f"role_prompt: n_negatives must be >= 0, got {n_negatives}")
    forms = ", ".join(
        f"'{f}: ...'" if f in _ARG_FORMS else f"'{f}'" for f in CRITERION_FORMS
    )  # fmt: skip
    system = (
        "You write tasks for a data analyst who answers questions about a read-only SQLite "
        "database with the tools list_tables, describe and sql. First explore the database with "
        "the tools and run the SQL query that answers your question: every value of the answer "
        "must appear in a tool result you saw. Then reply without a tool call: the question in "
        "<question> </question>, then <rubric> </rubric> holding one <criterion> </criterion> per "
        f"check, each one of {forms}. 'answer_equals: v1, v2' (required) gives the exact result "
        "in the order asked; 'queried_tables: t1, t2' the tables the question needs. Ask a "
        "question with a short answer, and do not state the answer in the question."
    )
    negatives = [" ".join(q.split()) for q in list(recent)[-n_negatives:]] if n_negatives else []
    if negatives:
        system += " Do not repeat or paraphrase these questions: " + " ".join(
            f"<question> {q} </question>" for q in negatives
        )
    return (Message("system", system), Message("user", "Write a task about this database."))


def generator_task(
    db_seed: int, recent: Sequence[str] = (), *, index: int = 0, n_negatives: int = N_NEGATIVES
) -> Task:
    """A generator-role episode's task over database ``db_seed`` (env ``SQL_GENERATOR_ENV``): its
    prompt is :func:`role_prompt`; no rubric (the generator is scored by R_G)."""
    prompt = role_prompt(recent, n_negatives=n_negatives)
    key = hashlib.sha1(json.dumps([db_seed, *[m.content for m in prompt]]).encode()).hexdigest()
    return Task(
        id=f"sqlgen-{index:05d}-{key[:10]}",
        prompt=prompt,
        rubric=Rubric(()),
        domain=GENERATOR_ROLE,
        task_type="sql",
        env_name=SQL_GENERATOR_ENV,
        raw={"role": "generator", "db_seed": int(db_seed), "index": int(index)},
    )


class SqlGeneratorEnv(SqlEnv):
    """The generator's tool environment: the SQL env's read-only tools over the role task's
    database; the final answer (a turn without a tool call) is the generated task. Its transcript
    state carries the db seed, which parsing needs."""

    name: ClassVar[str] = SQL_GENERATOR_ENV

    def _state(self) -> dict[str, Any]:
        return {"db_seed": int((self._task.raw or {})["db_seed"])} if self._task else {}

    @classmethod
    def task_bank(cls, split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
        """``n`` generator tasks, task i over the SQL env's ``split`` database i (the world seeds
        ``Env.task_bank`` derives; no negatives)."""
        check_split(split)
        world = f"{SqlEnv.name}-{SqlEnv.WORLD_KIND}"
        return [generator_task(derive_seed(world, split, seed, i), index=i) for i in range(n)]

    @classmethod
    def reference_turns(cls, task: Task) -> list[str]:
        """A demonstration (ours): count the employees with ``sql``, then ask for that count."""
        db = int(task.raw["db_seed"])
        n = len(database_rows(db)["employees"])
        query = "SELECT COUNT(*) FROM employees"
        final = format_generated(
            "How many employees does the company have?",
            [f"answer_equals: {n}", "queried_tables: employees", "no_write"],
        )
        return [render_tool_call("sql", {"query": query}), final]


def generator_units() -> tuple[str, ...]:
    """The units (``tool_domain.UNIT_PATTERN``) of what the generator reads and writes beyond the
    SQL domain's texts — the role prompt, the tags, the criterion forms, the coach's hints — for
    the embedded tokenizer of a run with this generator (``config.domain.generator_units``; a
    unit outside the vocabulary would be spelled out character by character)."""
    from rubric_rl.envs.tool_domain import units

    texts = [m.content for m in role_prompt(["q"], n_negatives=1)]
    texts += [
        format_generated("q", [f"{f}: v" for f in CRITERION_FORMS]),
    ]
    texts += [h.format(question="q") for h in COACH_HINTS.values()]
    texts += ["<coach> remember : </coach>"]
    return tuple(sorted({u for t in texts for u in units(t)}))


# --- the output format --------------------------------------------------------------------------


def format_generated(question: str, criteria: Iterable[str]) -> str:
    """The generator's final answer for ``question`` and criterion items (as written)."""
    items = "\n".join(f"<criterion> {c.strip()} </criterion>" for c in criteria)
    return f"<question> {question.strip()} </question>\n<rubric>\n{items}\n</rubric>"


_ITEM_RE = re.compile(r"^\s*([A-Za-z_]+)\s*(?::\s*(.*?))?\s*$", re.DOTALL)
_NUMBER_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)$")
_QUESTION_NUMBER_RE = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w.]*\w)")


@dataclasses.dataclass(frozen=True)
class GeneratedSqlTask(GeneratedTask):
    """What :func:`parse_generated` made of a generator's answer: the constraint domain's
    ``GeneratedTask`` plus ``expected``, the answer's values."""

    expected: tuple[Any, ...] = ()


def _failed(reason: str, question: str = "", num_listed: int = 0, **kw: Any) -> GeneratedSqlTask:
    return GeneratedSqlTask(None, question, num_listed, reason=reason, **kw)


def _value(text: str) -> Any:
    """A value as the answer checker compares it: int / float when it reads as a number."""
    t = text.strip().strip("`'\"").strip()
    if _NUMBER_RE.match(t):  # no thousands separators: "," separates values (ours)
        f = float(t)
        return int(f) if f.is_integer() and "." not in t else f
    return t


def _split_args(args: str) -> list[str]:
    return [a.strip() for a in re.split(r"[,;]", args) if a.strip()]


def _norm_question(question: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", question.casefold()).split())


def task_signature(task_or_db: Task | int, question: str | None = None) -> str:
    """A task's identity for deduplication: its database and its question (case, punctuation and
    spacing aside; ours). Takes a task (its db seed and last user message) or both parts."""
    if isinstance(task_or_db, Task):
        db = int((task_or_db.raw or {})["db_seed"])
        question = [m.content for m in task_or_db.prompt if m.role == "user"][-1]
    else:
        db = int(task_or_db)
    return json.dumps([db, _norm_question(question or "")])


def forbidden_signatures(tasks: Iterable[Task]) -> frozenset[str]:
    """Signatures of ``tasks`` (SQL tasks: held-out and validation) for ``parse_generated``."""
    return frozenset(task_signature(t) for t in tasks if "db_seed" in (t.raw or {}))


def parse_generated(
    text: str, *, db_seed: int, forbidden: frozenset[str] = frozenset()
) -> GeneratedSqlTask:
    """The checkable SQL task a generator's answer states over database ``db_seed``, or the
    reason it states none (module docstring); never raises on model output."""
    if not isinstance(text, str):
        raise TypeError(f"parse_generated: text must be a str, got {type(text).__name__}")
    text = strip_reasoning(text)
    qm = _QUESTION_RE.search(text)
    if qm is None:
        return _failed("no_question")
    question = " ".join(qm.group(1).split())
    if not question:
        return _failed("empty_question")
    if len(question) > MAX_QUESTION_CHARS:
        return _failed("long_question", question)
    rm = _RUBRIC_RE.search(text)
    if rm is None:
        return _failed("no_rubric", question)
    listed = [" ".join(c.split()) for c in _CRITERION_RE.findall(rm.group(1))]
    if _CRITERION_RE.sub(" ", rm.group(1)).strip():
        return _failed("stray_rubric_text", question, len(listed))
    listed = [c for c in listed if c]
    if not listed:
        return _failed("empty_rubric", question)
    tables = set(database_rows(int(db_seed)))
    kept: dict[str, tuple[str, tuple[Any, ...]]] = {}  # form -> (item, args)
    unknown, duplicates = [], 0
    for item in listed:
        m = _ITEM_RE.match(item)
        form = m.group(1).lower() if m else None
        if form not in CRITERION_FORMS or (form in _ARG_FORMS) != bool(m.group(2)):
            unknown.append(item)
            continue
        if form == "answer_equals":
            args = tuple(_value(a) for a in _split_args(m.group(2)))
        elif form == "queried_tables":
            args = tuple(sorted({a.lower() for a in _split_args(m.group(2))}))
        else:
            args = ()
        if form in kept:
            if form == "answer_equals" and kept[form][1] != args:
                return _failed("conflicting_answers", question, len(listed))
            duplicates += 1
            continue
        kept[form] = (item, args)
    extra = {"num_unknown": len(unknown), "unknown": tuple(unknown), "num_duplicates": duplicates}
    if not kept:
        return _failed("unknown_criterion", question, len(listed), **extra)
    if "answer_equals" not in kept:
        return _failed("no_answer_criterion", question, len(listed), **extra)
    expected = kept["answer_equals"][1]
    if not 1 <= len(expected) <= MAX_VALUES:
        return _failed("bad_answer", question, len(listed), **extra)
    numbers = [float(w) for w in _QUESTION_NUMBER_RE.findall(question)]
    if any(not isinstance(v, str) and any(abs(x - v) < 1e-9 for x in numbers) for v in expected):
        return _failed("answer_in_question", question, len(listed), **extra)
    if "queried_tables" in kept and not set(kept["queried_tables"][1]) <= tables:
        return _failed("unknown_table", question, len(listed), **extra)
    if task_signature(db_seed, question) in forbidden:
        return _failed("heldout_task", question, len(listed), **extra)
    criteria = []
    for form, (_, args) in kept.items():
        cid, title, weight, checker, text_ = CRITERION_FORMS[form]
        kwargs: dict[str, Any] = {}
        if form == "answer_equals":
            kwargs = {"expected": args, "ordered": True}  # ours: values in the order asked
        elif form == "queried_tables":
            kwargs = {"tables": args}
        shown = ", ".join(format_value(a) for a in args)
        criteria.append(
            Criterion(
                id=cid, title=title, text=text_.format(args=shown), weight=weight,
                verifier=Verifier.rule(checker, **kwargs), origin="generator",
                tags=("final_answer",) if form in ("answer_equals", "answer_line")
                else ("trajectory",),
            )
        )  # fmt: skip
    items = [item for item, _ in kept.values()]
    key = hashlib.sha1(f"{db_seed} | {question} | {' | '.join(items)}".encode()).hexdigest()[:12]
    task = Task(
        id=f"sql-{GENERATED_SPLIT}-{key}",
        prompt=(Message("system", SYSTEM_PROMPT), Message("user", question)),
        rubric=Rubric(tuple(criteria), aggregation="weighted"),
        reference_answer=format_answer(expected),
        domain="sql",
        task_type=GENERATED_SPLIT,
        env_name=SqlEnv.name,
        raw={
            "db_seed": int(db_seed), "expected": list(expected), "ordered": True,
            "tables": list(kept.get("queried_tables", ("", ()))[1]), "split": GENERATED_SPLIT,
            "generated": format_generated(question, items),
        },
    )  # fmt: skip
    return GeneratedSqlTask(task, question, len(listed), expected=expected, **extra)


# --- grounding (R_tool) and the episode ----------------------------------------------------------

_TABLE_COUNT_RE = re.compile(r"([A-Za-z_]+) \((\d+) rows?\)")


def observed_cells(record: ToolRecord) -> list[str]:
    """The values a successful tool observation shows: an ``sql`` result's cells (header and
    footer lines aside), ``list_tables``' table names and row counts; nothing else (ours)."""
    if not record.ok:
        return []
    if record.name == "sql":
        lines = record.output.splitlines()[1:]  # the first line holds the column names
        return [c.strip() for ln in lines if not ln.startswith("(") for c in ln.split(" | ")]
    if record.name == "list_tables":
        return [x for pair in _TABLE_COUNT_RE.findall(record.output) for x in pair]
    return []


def grounded(
    records: Sequence[ToolRecord],
    expected: Sequence[Any],
    *,
    final_turn: int | None,
    observed: ToolEvent,
) -> bool:
    """Seed eq. 2 for an SQL task: every expected value was shown by a tool observation that
    counts (``observed``: the method's event, e.g. a successful call in a turn before
    ``final_turn``)."""
    if not expected:
        return observed(records, final_turn=final_turn)
    return all(
        observed(
            [r for r in records if any(value_matches(c, v) for c in observed_cells(r))],
            final_turn=final_turn,
        )
        for v in expected
    )


def episode_outcome(
    response: str | Transcript,
    *,
    observed: ToolEvent,
    forbidden: frozenset[str] = frozenset(),
    db_seed: int | None = None,
) -> tuple[GeneratedSqlTask, bool]:
    """(parsed task, whether its answer is grounded in tool observations that count) of one
    generator episode from its transcript; the db seed from the transcript's state
    (:class:`SqlGeneratorEnv`) unless given."""
    tr = response if isinstance(response, Transcript) else transcript_of(response)
    db = db_seed if db_seed is not None else tr.state.get("db_seed")
    if tr.final_answer is None or tr.status != "answered" or db is None:
        parsed = _failed("no_final_answer")
        final_turn = None
    else:
        parsed = parse_generated(tr.final_answer, db_seed=int(db), forbidden=forbidden)
        final_turn = len(tr.turns)
    seen = grounded(tr.tool_calls, parsed.expected, final_turn=final_turn, observed=observed)
    return parsed, seen


# --- the task writer (``Domain.task_writer``) ----------------------------------------------------


class SqlTaskWriter:
    """The SQL env's ``TaskWriter`` (``envs/base.py``): ``db_seeds`` are the databases the
    generator writes tasks about (ours: the domain's training-split databases, so generated tasks
    never touch a held-out database); ``observed``: the method's tool event (``grounded``).
    Solver attempts run as agent episodes in the SQL env. An SQL task's rubric items are checks
    the generator grounded itself: there is no library to complete it from (``complete`` is
    accepted and ignored)."""

    name = "sql"
    env_name = SQL_GENERATOR_ENV
    solver_agent = True
    hints: Mapping[str, str] = COACH_HINTS

    def __init__(self, db_seeds: Iterable[int], *, observed: ToolEvent, complete: bool = True):
        self.db_seeds = tuple(sorted({int(s) for s in db_seeds}))
        if not self.db_seeds:
            raise ValueError("SqlTaskWriter: no databases (db_seeds is empty)")
        self.observed = observed

    @classmethod
    def from_tasks(cls, tasks: Iterable[Task], **kw: Any) -> SqlTaskWriter:
        """Over the databases of ``tasks`` (the SQL domain's training split); ValueError when
        none has one."""
        seeds = [t.raw["db_seed"] for t in tasks if "db_seed" in (t.raw or {})]
        if not seeds:
            raise ValueError(
                "the SQL task writer needs the SQL domain's training tasks (their databases), "
                "got none with a db seed"
            )
        return cls(seeds, **kw)

    def generator_tasks(
        self,
        rng: np.random.Generator,
        n: int,
        recent: Sequence[str],
        *,
        first_index: int,
        n_negatives: int,
    ) -> list[Task]:
        dbs = rng.choice(len(self.db_seeds), size=n)
        return [
            generator_task(self.db_seeds[int(d)], recent, index=first_index + g,
                           n_negatives=n_negatives)
            for g, d in enumerate(dbs)
        ]  # fmt: skip

    def make_env(self, task: Task) -> SqlGeneratorEnv:
        return SqlGeneratorEnv()

    def episode_outcome(self, response: str, *, forbidden: frozenset[str]):
        return episode_outcome(response, observed=self.observed, forbidden=forbidden)

    def signature(self, task: Task) -> str:
        return task_signature(task) if "db_seed" in (task.raw or {}) else task.id

    def forbidden_signatures(self, tasks: Iterable[Task]) -> frozenset[str]:
        return forbidden_signatures(tasks)

    def task_record(self, task: Task) -> dict[str, Any]:
        raw = task.raw or {}
        if raw.get("split") == GENERATED_SPLIT:
            return {"db_seed": int(raw["db_seed"]), "generated": raw["generated"]}
        return {"id": task.id}

    def task_from_record(self, rec: Mapping[str, Any], forbidden: frozenset[str]) -> Task | None:
        """A generated pool task back from its record (None: the record is a domain task's)."""
        if "id" in rec:
            return None
        parsed = parse_generated(rec["generated"], db_seed=int(rec["db_seed"]), forbidden=forbidden)
        if parsed.task is None:
            raise ValueError(
                f"arise_rl state: pool task {rec['generated']!r} no longer parses ({parsed.reason})"
            )
        return parsed.task
