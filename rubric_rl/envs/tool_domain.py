"""Tool-use environments as training domains (DESIGN §7): task verifiers, the embedded
tokenizer's vocabulary, and warm-start demonstrations, for every env in ``TOOL_DOMAINS``.

**Verifiers** (``VERIFIERS[name](task, response) -> bool``) score the transcript an episode ends
with (``Env.response()``) by the env's own checks: the task is passed when its outcome is right,
whatever the path. SQL: the final answer equals the result of the task's reference SQL
(``env_answer_matches`` on ``raw['expected']``). Inventory: the answer is right AND the final
state is what the task asked for (exactly the requested order, or no order at all for a stock
question) within the stated budget. Trajectory criteria (schema explored, items looked up, no
write attempted) are the rubric's business, not the verifier's.

**Vocabulary** (``vocabulary(name)``): the units (``UNIT_PATTERN``: tags such as
``<tool_call>``, letter runs, single digits, single other characters) of every text the policy
reads or writes in the env: system prompts with the tool schemas, questions, reference turns,
the tool outputs of replaying them, the outputs of ``probe_turns`` (malformed calls, refused
writes, SQL errors, unknown items...), every word the world generators draw from, and every
printable ASCII character on its own. It depends on the env's code only (not on the run's seed
or split sizes), so one tokenizer serves every run of a domain. Single digits keep numbers (any
salary, total or row count) inside the vocabulary, as Qwen's tokenizer does.

**Warm start** (``warmstart_corpus``): the reference solutions replayed through the env, one
demonstration per assistant turn — (the conversation so far, as the agent loop renders it, the
next assistant turn) — over training-split tasks of a seed of their own (worlds disjoint from
the run's splits). Imperfect on purpose, like the constraint domain's corpus: with probability
``1 - p_keep`` each an episode leaves out a step its system prompt asks for (the ``Answer:``
line; SQL: inspecting the schema first), so RL has criteria to improve on while the outcome, and
so ``verify``, stays right.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
import string
from collections.abc import Callable, Iterator

from rubric_rl.envs import inventory_data, sql_data
from rubric_rl.envs.base import SPLITS, Env, StepResult, derive_seed
from rubric_rl.envs.inventory import check_order_matches
from rubric_rl.envs.tool_calls import render_tool_call
from rubric_rl.envs.tool_envs import ENVS
from rubric_rl.envs.trajectory import answer_matches, check_answer_matches, transcript_of
from rubric_rl.rubrics.types import Task

TOOL_DOMAINS: tuple[str, ...] = ("sql", "inventory")


@dataclasses.dataclass(frozen=True)
class EpisodeSizes:
    """Token counts of reference episodes with the embedded tokenizer (builders'
    ``build_spaced_tokenizer``, tools in the system message): the longest first prompt, model
    turn (its eos included), tool turn and whole episode, and the most model turns."""

    prompt: int
    turn: int
    tool_turn: int
    episode: int
    turns: int


# Measured over 200 tasks per split, seeds 0-2 (tests/envs/test_tool_domains.py re-measures 50 per
# split and checks they stay within these). Means: sql prompt 451, turn 28, episode 577;
# inventory prompt 848, turn 34, episode 1142. The tool schemas are most of a prompt: 360 (sql)
# and 735 (inventory) tokens of the Qwen3-style tools block.
EMBEDDED_SIZES: dict[str, EpisodeSizes] = {
    "sql": EpisodeSizes(prompt=466, turn=71, tool_turn=39, episode=639, turns=3),
    "inventory": EpisodeSizes(prompt=867, turn=144, tool_turn=215, episode=2033, turns=7),
}

# Units of the embedded tokenizer for tool domains (builders.build_spaced_tokenizer adds the
# leading-space variants): a tag, a run of ASCII letters, ONE digit, or any other single character.
UNIT_PATTERN = r"</?[a-z_]+>|[A-Za-z]+|\d|[^\sA-Za-z\d]"
_UNIT_RE = re.compile(UNIT_PATTERN)
# Printable ASCII without whitespace: any text over these encodes without <|unk|>.
BASE_UNITS: tuple[str, ...] = tuple(string.ascii_letters + string.digits + string.punctuation)
# Tasks per split scanned (seed 0) for the vocabulary: enough that every question template of
# every task type appears (a type has 3-4 templates; 200 tasks give each type >= 40 draws).
VOCAB_SCAN_TASKS = 200

# The words the world generators draw names, places and products from (a query may list any).
_WORLD_WORDS: dict[str, tuple[str, ...]] = {
    "sql": tuple(
        w
        for words in (
            sql_data._FIRST,
            sql_data._LAST,
            sql_data._DEPARTMENTS,
            sql_data._CITIES,
            sql_data._TITLES,
            sql_data._CO_A,
            sql_data._CO_B,
            sql_data._CO_C,
            sql_data._COUNTRIES,
            sql_data._PRODUCTS,
            [sql_data.SCHEMA],
        )
        for w in words
    ),
    "inventory": tuple(
        w
        for words in (inventory_data._BRANDS, inventory_data._COLORS, inventory_data._CATEGORIES)
        for w in words
    ),
}


def _env_class(name: str) -> type[Env]:
    if name not in TOOL_DOMAINS:
        raise KeyError(f"unknown tool domain {name!r}; known: {', '.join(TOOL_DOMAINS)}")
    return ENVS.get(name)


def units(text: str) -> list[str]:
    """``text`` split into ``UNIT_PATTERN`` units (whitespace dropped)."""
    return _UNIT_RE.findall(text)


# --------------------------------------------------------------------------------------------
# Task verifiers


def verify_sql(task: Task, response: str) -> bool:
    """Passed: the episode ended on a final answer equal to the reference SQL's result."""
    raw = task.raw or {}
    return check_answer_matches(
        response, task=task, expected=tuple(raw["expected"]), ordered=bool(raw["ordered"])
    )


def verify_inventory(task: Task, response: str) -> bool:
    """Passed: the right answer, exactly the requested order (none when the task buys nothing),
    and no more spent than the task's budget."""
    raw = task.raw or {}
    tr = transcript_of(response, task)
    if tr.status != "answered" or not answer_matches(
        tr.final_answer, (raw["answer"],), ordered=True
    ):
        return False
    if raw["order"]:
        if not check_order_matches(response, task=task, items=tuple(map(tuple, raw["order"]))):
            return False
    elif tr.state.get("orders"):
        return False
    budget = raw.get("budget_cents")
    return budget is None or tr.state.get("spent_cents", 0) <= budget


VERIFIERS: dict[str, Callable[[Task, str], bool]] = {
    "sql": verify_sql,
    "inventory": verify_inventory,
}


# --------------------------------------------------------------------------------------------
# Replaying turns


def replay(env: Env, task: Task, turns: list[str]) -> Iterator[tuple[list[dict], str, StepResult]]:
    """Steps ``env`` through ``turns`` on ``task``: yields (the conversation before the turn,
    rendered as the agent loop does with tools in the system message, the turn, its result).
    Stops when the env is done."""
    messages = env.reset(task).chat_messages(tools_in_system=True)
    for turn in turns:
        res = env.step(turn)
        yield [dict(m) for m in messages], turn, res
        if res.done:
            return
        messages.append({"role": "assistant", "content": turn})
        messages.extend(m.to_dict() for m in res.tool_messages)


def _calls(*calls: tuple[str, dict]) -> str:
    return "\n".join(render_tool_call(n, a) for n, a in calls)


def _block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


# Malformed calls every env answers with an error observation (tool_calls.py's error kinds and
# the json module's messages).
_CALL_ERRORS = (
    _block('{"name": "x", "arguments": {"a": }}'),  # Expecting value
    _block('{"name": "x" "arguments": {}}'),  # Expecting ',' delimiter
    _block("{name: 1}"),  # Expecting property name enclosed in double quotes
    _block('{"name": "x", "arguments": {"a": "b}}'),  # Unterminated string
    _block('{"name": "x"} {}'),  # Extra data
    _block('{"name" "x"}'),  # Expecting ':' delimiter
    _block('{"name": "a\tb"}'),  # Invalid control character
    _block('{"name": "\\q"}'),  # Invalid \escape
    _block('{"name": "\\u12"}'),  # Invalid \uXXXX escape
    _block('{"name": "\\ud800"}'),  # a lone surrogate
    _block("[1, 2]"),  # not an object
    _block('{"arguments": {}}'),  # missing name
    _block('{"name": "x", "arguments": [1]}'),  # arguments not an object
    _calls(("no_such_tool", {})),
    "<tool_call>\n{}",  # unclosed
    "</tool_call>",  # stray close tag
    _calls(*[("no_such_tool", {})] * 9),  # too many calls in one turn
    "Answer: 1\n" + _calls(("no_such_tool", {})),
)


def world_probe_turns(name: str) -> list[list[str]]:
    """Turns that show a world's contents in every output format: SQL tables dumped and
    described; the catalog searched by each color (one of them usually matches more items than a
    search shows, which only some catalogs make happen)."""
    if name == "sql":
        tables = ("departments", "employees", "customers", "orders")
        return [
            [_calls(("list_tables", {}), *(("describe", {"table": t}) for t in tables))],
            [_calls(*(("sql", {"query": f"SELECT * FROM {t}"}) for t in tables))],
        ]
    return [[_calls(*(("search", {"query": c}) for c in inventory_data._COLORS))]]


def probe_turns(name: str, task: Task) -> list[list[str]]:
    """Episodes of turns that make ``name``'s env answer with each kind of error and each output
    format (beyond what the reference solutions see): one list of turns per episode."""
    probes = [[t] for t in _CALL_ERRORS]
    if name == "sql":
        tables = ("departments", "employees", "customers", "orders")
        queries = [
            *(f"SELECT * FROM {t}" for t in tables),
            *(f"{s} orders" for s in ("DELETE FROM", "DROP TABLE")),
            "INSERT INTO orders (id) VALUES (1000)",
            "UPDATE employees SET salary = 0",
            "CREATE TABLE t (a INTEGER)",
            "ATTACH DATABASE 'x' AS x",
            "PRAGMA user_version = 3",
            "SELECT FROM employees",
            "SELECT x FROM employees",
            "SELECT * FROM x",
            "SELECT id FROM employees e JOIN departments d ON e.department_id = d.id",
            "SELECT 1; SELECT 2",
            "   ",
            "SELECT name FROM employees WHERE COUNT(*) > 1",
            "SELECT x(1)",
            "SELECT count(1, 2)",
            "SELECT (",
            "SELECT * FROM orders o, orders p",
            "SELECT x'00ff', NULL, 1e20, 1.5, -2",
            "SELECT name FROM employees ORDER BY 9",
            "SELECT 1 UNION SELECT 1, 2",
            'SELECT "unterminated',
        ]
        probes += [
            [_calls(("describe", {"table": t})) for t in (*tables, "x")],
            [_calls(*[("sql", {"query": q})]) for q in queries],
            [
                _calls(("describe", {})),
                _calls(("sql", {"query": 1})),
                _calls(("list_tables", {"x": 1})),
            ],
        ]
    elif name == "inventory":
        item = (task.raw or {}).get("order") or [["SKU-101", 1]]
        iid = item[0][0]
        probes += [
            [
                _calls(("search", {"query": "the"}), ("search", {"query": "x"})),
                _calls(
                    ("search", {"query": "red"}), ("search", {"query": "mug", "max_price": 9.5})
                ),
                _calls(("get_item", {"item_id": "SKU-999"}), ("get_item", {"item_id": iid})),
                _calls(("view_cart", {}), ("checkout", {}), ("remove_from_cart", {"item_id": iid})),
                _calls(("add_to_cart", {"item_id": iid, "quantity": 0})),
                _calls(("add_to_cart", {"item_id": iid, "quantity": 1000})),
                _calls(("add_to_cart", {"item_id": iid, "quantity": 1}), ("view_cart", {})),
                _calls(("remove_from_cart", {"item_id": iid})),
                _calls(("add_to_cart", {"item_id": iid, "quantity": 1}), ("checkout", {})),
                _calls(("search", {"query": "mug", "max_price": float("nan")})),
                _calls(("add_to_cart", {"item_id": iid, "quantity": True})),
            ]
        ]
    return probes


# --------------------------------------------------------------------------------------------
# Vocabulary


def episode_texts(
    name: str, task: Task, turns: list[str], *, with_turns: bool = True
) -> Iterator[str]:
    """Every text the policy reads (and, ``with_turns``, writes) replaying ``turns`` on
    ``task``: the prompt (system message with tool schemas, question), the tool outputs and the
    turns."""
    env = _env_class(name)()
    try:
        first = True
        for messages, turn, res in replay(env, task, turns):
            if first:
                yield from (m["content"] for m in messages)
                first = False
            if with_turns:
                yield turn
            yield from (m.content for m in res.tool_messages)
    finally:
        env.close()


def domain_texts(name: str, n_per_split: int, seed: int, *, probes: bool = True) -> Iterator[str]:
    """``episode_texts`` of the reference solutions of ``n_per_split`` tasks of every split and,
    with ``probes``, the tool outputs of ``probe_turns`` on the first task of each split and of
    ``world_probe_turns`` on each world (the probes' own text is not a policy's: it only makes
    the env answer)."""
    cls = _env_class(name)
    for split in SPLITS:
        tasks = cls.task_bank(split, n_per_split, seed)
        for task in tasks:
            yield from episode_texts(name, task, cls.reference_turns(task))
            yield task.reference_answer or ""
        if not (probes and tasks):
            continue
        for turns in probe_turns(name, tasks[0]):
            yield from episode_texts(name, tasks[0], turns, with_turns=False)
        for task in tasks[:: cls.TASKS_PER_WORLD]:
            for turns in world_probe_turns(name):
                yield from episode_texts(name, task, turns, with_turns=False)
    if name == "sql" and probes:  # the time-limit refusal (a short limit keeps the scan fast)
        env = cls(time_limit_s=0.02)
        task = cls.task_bank("train", 1, seed)[0]
        query = (
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
        )
        try:
            for _, _, res in replay(env, task, [_calls(("sql", {"query": query}))]):
                yield from (m.content for m in res.tool_messages)
        finally:
            env.close()


@functools.cache
def vocabulary(name: str) -> tuple[str, ...]:
    """The sorted units of tool domain ``name`` (see the module docstring): deterministic, and
    the same for every run of the domain."""
    found = set(BASE_UNITS)
    for text in domain_texts(name, VOCAB_SCAN_TASKS, 0):
        found.update(units(text))
    for word in _WORLD_WORDS[name]:
        found.update(units(word))
    return tuple(sorted(found))


# --------------------------------------------------------------------------------------------
# Warm-start corpus


def _imperfect_turns(name: str, task: Task, rng: random.Random, p_keep: float) -> list[str]:
    """The reference turns, each step the system prompt asks for (but the outcome does not need)
    kept with probability ``p_keep``."""
    turns = list(_env_class(name).reference_turns(task))
    if rng.random() >= p_keep:  # the final answer without its "Answer:" line
        turns[-1] = turns[-1].removeprefix("Answer: ")
    if name == "sql" and rng.random() >= p_keep:  # no schema inspection before querying
        turns = [t for t in turns if '"name": "list_tables"' not in t]
    return turns


def warmstart_corpus(name: str, n: int, seed: int, p_keep: float) -> list[tuple[list[dict], str]]:
    """``n`` demonstrations (conversation so far, next assistant turn) from reference episodes of
    training-split tasks drawn with a seed of their own (see the module docstring)."""
    if n < 0:
        raise ValueError(f"warmstart_corpus: n must be >= 0, got {n}")
    if not 0.0 <= p_keep <= 1.0:
        raise ValueError(f"warmstart_corpus: p_keep must be in [0, 1], got {p_keep}")
    cls = _env_class(name)
    out: list[tuple[list[dict], str]] = []
    block = 0
    while len(out) < n:
        tasks = cls.task_bank("train", 64, derive_seed("tool-warmstart", name, seed, block))
        for k, task in enumerate(tasks):
            rng = random.Random(derive_seed("tool-warmstart-episode", name, seed, block, k))
            env = cls()
            try:
                for messages, turn, _ in replay(
                    env, task, _imperfect_turns(name, task, rng, p_keep)
                ):
                    out.append((messages, turn))
            finally:
                env.close()
            if len(out) >= n:
                break
        block += 1
    return out[:n]
