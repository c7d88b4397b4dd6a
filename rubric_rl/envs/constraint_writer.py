"""The embedded constraint domain's task writer: a policy writing new tasks of the domain (the
generator role of ARISE-RL, seed 002 §3.1, App. D.5, E.1; ``Domain.task_writer``).

The generator writes a new task of the embedded benchmark, after a tool call, as its final answer::

    <question> list 3 fruits . use uppercase </question>
    <rubric> <criterion> the response lists exactly 3 items </criterion>
             <criterion> every word is in uppercase </criterion> </rubric>

**Format.** The first ``<question> … </question>`` holds a prompt of the domain (a head of
``constraint_lexicon.PROMPT_TEMPLATES`` and its clauses); the first ``<rubric> … </rubric>`` holds
one ``<criterion> … </criterion>`` per rubric item, each written as a ``CRITERION_TEMPLATES`` text.
Rubric items are tagged rather than separated by a mark because criterion texts contain every
separator the domain has ("the items are separated by ;"). Text outside the two tags is ignored
(the seed extracts the tags' contents); ``<think>`` blocks are dropped first.

**Parsing** (:func:`parse_generated`): the question is read by the checker library
(``constraint_library.parse_prompt``: text only), and becomes a ``Task`` of the constraint domain
whose ``raw["params"]`` are the parsed parameters, so ``constraint_domain.verify`` (the task
verifier: every stated clause and the implicit requirements) applies to it unchanged. The rubric
is the library's criteria (``library_criteria``: rule checkers) whose text a listed item states;
an item naming no check of THIS question is dropped and counted (``num_unknown``), never kept as
free text. A task is only accepted when the domain's own generator could have stated it: a
training task type, clauses that type takes, counts in range, no OOD pair (the OOD split's), and
not one of the ``forbidden`` signatures (pass the held-out and validation tasks': generated tasks
train the solver, which is evaluated there). Malformed output is a reason string, never an
exception (``REASONS``).

**Tool** (R_tool means something): ``lookup(category)`` answers the members of a category from
the lexicon. :class:`GeneratorEnv` serves it through the agent loop (``rollout/agent.run_agent``);
:func:`episode_outcome` reads an episode's transcript into the parsed task and whether its
tool observation counts: the method's event (``observed``: ARISE-RL's ``tool_observed``, a tool
observation before the final answer) over the ``lookup`` calls, and for a question naming a
category, over the lookups of that category (seed eq. 2: "the corresponding tool observation").

**Word-level tokenizer.** The embedded tokenizer decodes units joined by spaces, so a tool call
comes back as ``{ " name " : " lookup " , … }``; :class:`GeneratorEnv` strips the spaces inside
JSON strings of tool-call blocks before executing them (:func:`normalise_tool_calls`). Its words
are the domain's plus ``GENERATOR_UNITS`` (:func:`generator_vocabulary`: appended after
``domain_vocabulary()``, so every existing token keeps its id; 575 ids still round up to the
same 576-row embedding). With the embedded tokenizer, build ``ChatFormat(tok,
tools_in_system=False)``: the role prompt states the tool in the domain's words, and the
English Qwen3 tools block would be unknown tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rubric_rl.envs.base import Env, StepResult, ToolEvent, ToolOutput
from rubric_rl.envs.constraint_domain import ConstraintDomain, render_response, verify
from rubric_rl.envs.constraint_lexicon import (
    CATEGORIES,
    canonical,
    category_members,
    domain_vocabulary,
    plural,
    units,
)
from rubric_rl.envs.constraint_library import library_criteria, parse_prompt
from rubric_rl.envs.constraint_spec import (
    CAPABILITIES,
    DOMAIN,
    IMPLICIT_KINDS,
    TRAIN_TASK_TYPES,
    has_ood_pair,
    pick,
    requirements,
)
from rubric_rl.envs.tool_calls import (
    CALL_CLOSE,
    CALL_OPEN,
    Param,
    ToolSpec,
    render_tool_call,
    strip_reasoning,
)
from rubric_rl.envs.trajectory import Transcript, transcript_of
from rubric_rl.rubrics.types import Message, Rubric, Task

__all__ = [
    "COACH_HINTS",
    "GENERATOR_ENV",
    "GENERATOR_UNITS",
    "LOOKUP_TOOL",
    "REASONS",
    "GeneratedTask",
    "IMPLICIT_RATE",
    "ConstraintTaskWriter",
    "GeneratorEnv",
    "demonstration_turns",
    "episode_outcome",
    "format_generated",
    "generator_task",
    "generator_vocabulary",
    "lookup_category",
    "lookup_text",
    "normalise_tool_calls",
    "parse_generated",
    "question_categories",
    "role_prompt",
    "source_question",
    "task_signature",
    "forbidden_signatures",
]

GENERATOR_ENV = "generator"
GENERATOR_ROLE = "generator"  # Task.domain of a generator-role task (its prompt is the role)
GENERATED_SPLIT = "generated"  # Task.raw["split"] of a parsed task
GENERATOR_TASK_TYPES: tuple[str, ...] = TRAIN_TASK_TYPES
N_NEGATIVES = 10  # seed App. D.5: the ten most recent pool questions as in-context negatives

# Units the generator writes beyond the domain's (``generator_vocabulary``).
GENERATOR_UNITS: tuple[str, ...] = (
    "<question>",
    "</question>",
    "<rubric>",
    "</rubric>",
    "<tool_call>",
    "</tool_call>",
    "name",
    "arguments",
    "lookup",
    "category",
)

# Every reason ``parse_generated`` / ``episode_outcome`` gives for R_fmt = 0.
REASONS: tuple[str, ...] = (
    "no_final_answer",  # the episode ended without a turn free of tool calls
    "no_question",  # no <question> … </question>
    "empty_question",
    "no_rubric",  # no <rubric> … </rubric>
    "stray_rubric_text",  # text inside <rubric> outside every <criterion> … </criterion>
    "empty_rubric",  # <rubric> holds no criterion
    "unknown_head",  # the question starts with no task head the library knows
    "unreadable_clause",  # text after the head that is no clause (or a clause stated twice)
    "unsupported_clause",  # a clause the task type does not take (e.g. "include" in a sum)
    "bad_count",  # "list N …" / "write N words …" with N outside COUNT_RANGE
    "ood_task",  # the OOD split's: the filter type or an OOD_PAIRS combination
    "heldout_task",  # one of the ``forbidden`` signatures (an evaluation task)
    "unknown_criterion",  # every listed criterion names no check of the question
)

# Clauses each task type takes: those the domain's own samplers state (constraint_spec.SAMPLERS).
ALLOWED_CLAUSES: dict[str, frozenset[str]] = {
    "list": frozenset({"numbered", "sep", "order", "case", "end", "include", "exclude"}),
    "format": frozenset({"case", "end", "start", "exclude"}),
    "short_answer": frozenset({"case", "end", "one_word", "start"}),
    "rewrite": frozenset({"case", "end"}),
}
COUNT_RANGE = (1, 8)  # a list / word count the answer can meet with distinct members
# Parameter keys that are not clauses (what the head states).
_HEAD_KEYS = frozenset(
    {"type", "category", "n", "subtype", "answer", "choices", "capability", "words"}
    | {"transform", "expected", "target", "other"}
)

LOOKUP_TOOL = ToolSpec(
    "lookup",
    "the words of a category",
    (("category", Param("string", "a category", enum=tuple(CATEGORIES))),),
)

# How the role prompt names each task type: the words its questions start with.
TASK_HEADS: dict[str, str] = {
    "list": "list",
    "format": "write",
    "short_answer": "what , how , is or which",
    "rewrite": "rewrite",
}


# --- the tool -----------------------------------------------------------------------------------


def lookup_text(category: str) -> str:
    """``lookup(category)``'s answer: "fruits : apple , banana , …" (common, then rare members)."""
    entry = CATEGORIES[category]
    return f"{plural(category)} : " + " , ".join(entry["common"] + entry["rare"])


_CATEGORY_WORDS = {**{c: c for c in CATEGORIES}, **{plural(c): c for c in CATEGORIES}}


def question_categories(question: str) -> frozenset[str]:
    """The categories a question names ("list 3 fruits", "is cat a fruit ?"): the criteria that
    depend on them (category membership, its rare words) are grounded by looking them up."""
    return frozenset(_CATEGORY_WORDS[u] for u in units(question) if u in _CATEGORY_WORDS)


# --- the role prompt ----------------------------------------------------------------------------


def role_prompt(task_type: str, recent: Sequence[str] = (), *, n_negatives: int = N_NEGATIVES):
    """The generator's (system, user) messages for a task of ``task_type``: the seed's E.1 role
    (call the tool before writing the rubric; question and rubric in tags) in the domain's words,
    with the last ``n_negatives`` of ``recent`` (pool questions, oldest first) as in-context
    negatives in the system message (App. D.5)."""
    if task_type not in TASK_HEADS:
        raise ValueError(
            f"role_prompt: task_type must be one of {sorted(TASK_HEADS)}, got {task_type!r}"
        )
    if n_negatives < 0:
        raise ValueError(f"role_prompt: n_negatives must be >= 0, got {n_negatives}")
    system = (
        "write a task : a question that starts with "
        f"{TASK_HEADS[task_type]} , and every rule to check the answer . "
        "first use the tool lookup to see the words of each category you use . "
        "write the question in <question> </question> and each rule in "
        "<criterion> </criterion> , all in <rubric> </rubric> ."
    )
    negatives = [canonical(q) for q in list(recent)[-n_negatives:]] if n_negatives else []
    if negatives:
        system += " avoid : " + " ".join(f"<question> {q} </question>" for q in negatives)
    return (Message("system", system), Message("user", "write a task ."))


def generator_task(
    task_type: str,
    recent: Sequence[str] = (),
    *,
    index: int = 0,
    n_negatives: int = N_NEGATIVES,
) -> Task:
    """A generator-role episode's task (env ``GENERATOR_ENV``): its prompt is ``role_prompt``;
    no rubric (the generator is scored by R_G, not by criteria)."""
    prompt = role_prompt(task_type, recent, n_negatives=n_negatives)
    key = hashlib.sha1(json.dumps([m.content for m in prompt]).encode()).hexdigest()[:10]
    return Task(
        id=f"gen-{task_type}-{index:05d}-{key}",
        prompt=prompt,
        rubric=Rubric(()),
        domain=GENERATOR_ROLE,
        task_type=task_type,
        env_name=GENERATOR_ENV,
        raw={"role": "generator", "task_type": task_type, "index": index},
    )


# --- the output format --------------------------------------------------------------------------


def format_generated(question: str, criteria: Iterable[str]) -> str:
    """The generator's final answer for ``question`` and criterion texts (canonical units)."""
    items = " ".join(f"<criterion> {canonical(c)} </criterion>" for c in criteria)
    return f"<question> {canonical(question)} </question> <rubric> {items} </rubric>"


_QUESTION_RE = re.compile(r"<question>(.*?)</question>", re.DOTALL)
_RUBRIC_RE = re.compile(r"<rubric>(.*?)</rubric>", re.DOTALL)
_CRITERION_RE = re.compile(r"<criterion>(.*?)</criterion>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class GeneratedTask:
    """What :func:`parse_generated` made of a generator's answer.

    ``task``: the checkable task (None when ``reason`` is set); ``num_listed``: criteria listed;
    ``num_unknown`` / ``unknown``: listed ones naming no check of the question (dropped);
    ``num_duplicates``: listed again after a kept one (dropped); ``num_completed``: library
    criteria of the question added because the answer did not list them."""

    task: Task | None
    question: str
    num_listed: int
    num_unknown: int = 0
    unknown: tuple[str, ...] = ()
    num_duplicates: int = 0
    reason: str | None = None
    num_completed: int = 0

    @property
    def num_criteria(self) -> int:
        return 0 if self.task is None else len(self.task.rubric.criteria)


def _failed(reason: str, question: str = "", num_listed: int = 0, **kw: Any) -> GeneratedTask:
    return GeneratedTask(None, question, num_listed, reason=reason, **kw)


def _prompt_reason(message: str) -> str:
    if message.startswith("no known task head") or "is not a category" in message:
        return "unknown_head"
    return "unreadable_clause"


def task_signature(params: dict[str, Any]) -> str:
    """A task's identity by what its prompt states (clause order and wording aside)."""
    return json.dumps(params, sort_keys=True, default=list)


def forbidden_signatures(tasks: Iterable[Task]) -> frozenset[str]:
    """Signatures of ``tasks`` (their last user message, read by the library): pass the held-out
    and validation tasks' to ``parse_generated(forbidden=…)``."""
    out = set()
    for t in tasks:
        users = [m.content for m in t.prompt if m.role == "user"]
        out.add(task_signature(parse_prompt(users[-1])))
    return frozenset(out)


def _check_params(params: dict[str, Any]) -> str | None:
    t = params["type"]
    if t not in ALLOWED_CLAUSES:
        return "ood_task"
    if set(params) - _HEAD_KEYS - ALLOWED_CLAUSES[t]:
        return "unsupported_clause"
    if "n" in params and not COUNT_RANGE[0] <= params["n"] <= COUNT_RANGE[1]:
        return "bad_count"
    if has_ood_pair(params):
        return "ood_task"
    return None


def _reference(task: Task) -> str | None:
    """A response meeting every requirement when the domain's renderer finds one (None for a
    question with contradictory clauses, e.g. "start with cat . do not use cat")."""
    try:
        ref = render_response(task, None, np.random.default_rng(0))
    except (KeyError, IndexError, ValueError):
        return None
    return ref if verify(task, ref) else None


def parse_generated(
    text: str, *, forbidden: frozenset[str] = frozenset(), complete: bool = True
) -> GeneratedTask:
    """The checkable task a generator's answer states, or the reason it states none.

    ``complete``: the rubric also gets every library criterion of the question the answer did not
    list (``num_completed``; origin "implied"), so a generated task is scored on the task
    verifier's full requirement set — the one the solver is evaluated on — and not on a laxer
    subset; False keeps the listed criteria only. R_fmt still needs one listed known criterion.
    See the module docstring for the format and the checks; never raises on model output."""
    if not isinstance(text, str):
        raise TypeError(f"parse_generated: text must be a str, got {type(text).__name__}")
    text = strip_reasoning(text)
    qm = _QUESTION_RE.search(text)
    if qm is None:
        return _failed("no_question")
    question = canonical(qm.group(1))
    if not question:
        return _failed("empty_question")
    rm = _RUBRIC_RE.search(text)
    if rm is None:
        return _failed("no_rubric", question)
    listed = [canonical(c) for c in _CRITERION_RE.findall(rm.group(1))]
    if _CRITERION_RE.sub(" ", rm.group(1)).strip():
        return _failed("stray_rubric_text", question, len(listed))
    listed = [c for c in listed if c]
    if not listed:
        return _failed("empty_rubric", question)
    try:
        params = parse_prompt(question)
    except (ValueError, KeyError, IndexError) as e:
        return _failed(_prompt_reason(str(e)), question, len(listed))
    bad = _check_params(params)
    if bad is None and task_signature(params) in forbidden:
        bad = "heldout_task"
    if bad is not None:
        return _failed(bad, question, len(listed))
    key = hashlib.sha1(f"{question} | {' | '.join(listed)}".encode()).hexdigest()[:12]
    draft = Task(
        id=f"cf-{GENERATED_SPLIT}-{key}",
        prompt=(Message("user", question),),
        rubric=Rubric(()),
        domain=DOMAIN,
        task_type=params["type"],
        capabilities=_capabilities(params),
        env_name=params["type"],
        raw={"params": params, "split": GENERATED_SPLIT},
    )
    library = library_criteria(draft)
    by_text = {canonical(c.text): c for c in library}
    kept, unknown, duplicates = {}, [], 0
    for item in listed:
        c = by_text.get(item)
        if c is None:
            unknown.append(item)
        elif c.id in kept:
            duplicates += 1
        else:
            kept[c.id] = dataclasses.replace(c, origin="generator")
    extra = {"num_unknown": len(unknown), "unknown": tuple(unknown), "num_duplicates": duplicates}
    if not kept:
        return _failed("unknown_criterion", question, len(listed), **extra)
    if complete:
        implied = [c for c in library if c.id not in kept]
        kept.update({c.id: dataclasses.replace(c, origin="implied") for c in implied})
        extra["num_completed"] = len(implied)
    task = dataclasses.replace(draft, rubric=Rubric(tuple(kept.values()), aggregation="weighted"))
    task = dataclasses.replace(task, reference_answer=_reference(task))
    return GeneratedTask(task, question, len(listed), **extra)


def _capabilities(params: dict[str, Any]) -> tuple[str, ...]:
    caps = {c.capability for c in requirements(params)}
    return tuple(c for c in CAPABILITIES if c in caps)


# --- the episode --------------------------------------------------------------------------------


_CALL_BLOCK_RE = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
_PADDED_STRING_RE = re.compile(r'"\s*([^"\\]*?)\s*"')


def normalise_tool_calls(text: str) -> str:
    """``text`` with the spaces around each JSON string's content inside tool-call blocks
    removed: what the word-level tokenizer's decode (units joined by spaces) took from
    ``{"name": "lookup"}``. A call without padded strings is unchanged."""

    def block(m: re.Match) -> str:
        return CALL_OPEN + _PADDED_STRING_RE.sub(r'"\1"', m.group(1)) + CALL_CLOSE

    return _CALL_BLOCK_RE.sub(block, text)


class GeneratorEnv(Env):
    """The generator role's tool environment: ``lookup(category)``; the final answer (a turn
    without a tool call) is the generated task, read by :func:`episode_outcome`."""

    name: ClassVar[str] = GENERATOR_ENV
    TOOLS: ClassVar[tuple[ToolSpec, ...]] = (LOOKUP_TOOL,)
    TASK_TYPES: ClassVar[dict[str, tuple[str, ...]]] = {t: () for t in GENERATOR_TASK_TYPES}

    def __init__(self, *, max_turns: int = 4, **kw: Any):
        super().__init__(max_turns=max_turns, **kw)

    def _setup(self, task: Task, seed: int | None) -> None:
        return None

    def _tool_lookup(self, category: str) -> ToolOutput:
        return ToolOutput(lookup_text(category), {"category": category})

    def step(self, model_text: str) -> StepResult:
        if isinstance(model_text, str):
            model_text = normalise_tool_calls(model_text)
        return super().step(model_text)

    @classmethod
    def task_bank(cls, split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
        """``n`` generator tasks cycling over the training task types, without negatives."""
        types = GENERATOR_TASK_TYPES
        return [generator_task(types[i % len(types)], index=i) for i in range(n)]

    @classmethod
    def reference_turns(cls, task: Task) -> list[str]:
        """A demonstration episode (:func:`demonstration_turns`) for a training task of the
        generator task's type."""
        source = _source_tasks(task.task_type)
        index = int((task.raw or {}).get("index", 0))
        turns, _ = demonstration_turns(source[index % len(source)], np.random.default_rng(index))
        return turns


# Demonstrations (used by GeneratorEnv.reference_turns and constraint_writer_corpus, which
# re-exports them): the share of the implicit requirements a demonstration's rubric lists.
# Parsing completes a rubric with the question's library criteria (``parse_generated``), so a
# demonstration listing only some keeps its answer short without making the task laxer.
IMPLICIT_RATE = 0.5


def source_question(task: Task) -> str:
    """The last user message of a constraint-domain task (its question)."""
    return [m.content for m in task.prompt if m.role == "user"][-1]


def lookup_category(question: str, rng: np.random.Generator) -> str:
    """The category a demonstration looks up: the one the question names, else that of its
    first word from a category, else any."""
    named = sorted(question_categories(question))
    if named:
        return named[0]
    for u in units(question):
        for cat in CATEGORIES:
            if u.lower() in category_members(cat):
                return cat
    return pick(rng, sorted(CATEGORIES))


def demonstration_turns(
    source: Task, rng: np.random.Generator, *, implicit_rate: float = IMPLICIT_RATE
) -> tuple[list[str], str]:
    """([tool-call turn, final answer], the tool's observation) of a demonstration for
    ``source`` (a constraint-domain task)."""
    question = source_question(source)
    category = lookup_category(question, rng)
    call = render_tool_call(LOOKUP_TOOL.name, {"category": category})
    crits = [
        c.text
        for c in library_criteria(source)
        if c.title not in IMPLICIT_KINDS or rng.random() < implicit_rate
    ]
    return [call, format_generated(question, crits)], lookup_text(category)


@functools.cache
def _source_tasks(task_type: str) -> tuple[Task, ...]:
    return tuple(t for t in ConstraintDomain(0).tasks("train", 200) if t.task_type == task_type)


def episode_outcome(
    response: str | Transcript,
    *,
    observed: ToolEvent,
    forbidden: frozenset[str] = frozenset(),
    complete: bool = True,
) -> tuple[GeneratedTask, bool]:
    """(parsed task, whether its tool observation counts) of one generator episode, from its
    transcript (``Trajectory.response`` / ``Env.response()``).

    The tool observation counts when ``observed`` holds for the ``lookup`` calls, given the
    final answer's turn; for a question naming categories, for the lookups of every named
    category."""
    tr = response if isinstance(response, Transcript) else transcript_of(response)
    if tr.final_answer is None or tr.status != "answered":
        parsed = _failed("no_final_answer")
        final_turn = None
    else:
        parsed = parse_generated(tr.final_answer, forbidden=forbidden, complete=complete)
        final_turn = len(tr.turns)
    lookups = [r for r in tr.tool_calls if r.name == LOOKUP_TOOL.name]
    needed = question_categories(parsed.question)
    if needed:
        seen = all(
            observed(
                [r for r in lookups if r.arguments.get("category") == c], final_turn=final_turn
            )
            for c in needed
        )
    else:
        seen = observed(lookups, final_turn=final_turn)
    return parsed, seen


@functools.cache
def _generator_vocabulary() -> tuple[str, ...]:
    base = domain_vocabulary()
    known = set(base)
    return tuple(base + [u for u in GENERATOR_UNITS if u not in known])


def generator_vocabulary() -> list[str]:
    """``domain_vocabulary()`` then ``GENERATOR_UNITS`` it lacks, appended (not sorted in): the
    embedded tokenizer of a run with the generator role. Every domain unit keeps its id."""
    return list(_generator_vocabulary())


# --- the task writer (``Domain.task_writer``) ----------------------------------------------------

# The generator coach's hints (``arise_rl.generator_memory``). Every word is in the generator's
# vocabulary (the role prompt's and the domain's); tested. Ours (the seed's coach is an LLM).
COACH_HINTS: dict[str, str] = {
    "format": (
        "write the question in <question> </question> and each rule in <criterion> </criterion> "
        ", all in <rubric> </rubric>"
    ),
    "tool": "first use the tool lookup to see the words of each category you use",
    "too_easy": "write a question with many requirements",
    "too_hard": "write a question with only one rule",
    # no failure in the group: its best episode's question, restated (``{question}``)
    "keep": "first use the tool lookup and write a question like <question> {question} </question>",
}


class ConstraintTaskWriter:
    """The embedded constraint domain's ``TaskWriter`` (``envs/base.py``): generator-role tasks
    over the training task types, the ``lookup`` environment, the parse of an episode, task
    signatures and pool records. ``complete``: a parsed task's rubric also gets the library
    criteria the question implies (``parse_generated``); ``observed``: the method's tool event
    (``episode_outcome``)."""

    name = "constraint"
    env_name = GENERATOR_ENV
    solver_agent = False
    hints: dict[str, str] = COACH_HINTS

    def __init__(self, *, observed: ToolEvent, complete: bool = True):
        self.observed = observed
        self.complete = bool(complete)

    def generator_tasks(
        self,
        rng: np.random.Generator,
        n: int,
        recent: Sequence[str],
        *,
        first_index: int,
        n_negatives: int,
    ) -> list[Task]:
        types = rng.choice(len(GENERATOR_TASK_TYPES), size=n)
        return [
            generator_task(
                GENERATOR_TASK_TYPES[int(t)], recent, index=first_index + g,
                n_negatives=n_negatives,
            )
            for g, t in enumerate(types)
        ]  # fmt: skip

    def make_env(self, task: Task) -> GeneratorEnv:
        return GeneratorEnv()

    def episode_outcome(self, response: str, *, forbidden: frozenset[str]):
        return episode_outcome(
            response, observed=self.observed, forbidden=forbidden, complete=self.complete
        )

    def signature(self, task: Task) -> str:
        params = (task.raw or {}).get("params")
        return task_signature(params) if params is not None else task.id

    def forbidden_signatures(self, tasks: Iterable[Task]) -> frozenset[str]:
        return forbidden_signatures(tasks)

    def task_record(self, task: Task) -> dict[str, Any]:
        """A generated task by its answer text (re-parsed on load), a domain task by id."""
        if (task.raw or {}).get("split") == GENERATED_SPLIT:
            question = [m.content for m in task.prompt if m.role == "user"][-1]
            # the criteria the generator listed (those parsing added come back on re-parsing)
            listed = [c.text for c in task.rubric.criteria if c.origin != "implied"]
            return {"question": question, "criteria": listed}
        return {"id": task.id}

    def task_from_record(self, rec: Mapping[str, Any], forbidden: frozenset[str]) -> Task | None:
        """A generated pool task back from its record (None: the record is a domain task's)."""
        if "id" in rec:
            return None
        parsed = parse_generated(
            format_generated(rec["question"], rec["criteria"]), forbidden=forbidden,
            complete=self.complete,
        )  # fmt: skip
        if parsed.task is None:
            raise ValueError(
                f"arise_rl state: pool task {rec['question']!r} no longer parses ({parsed.reason})"
            )
        return parsed.task
