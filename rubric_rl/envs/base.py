"""The ``Env`` interface for multi-turn tool-use environments (DESIGN.md §7), and ``Domain``, the
contract between a domain and the methods that train on it (at the end of this module).

Protocol (what the agent loop does)::

    env = make_env(task.env_name)              # cheap: one per rollout
    obs = env.reset(task)                      # obs.messages (+ obs.tools for the chat template)
    while True:
        text = <model turn>                    # decoded assistant text
        res = env.step(text)
        if res.done: break
        <append res.observation as the tool turn (loss_mask 0)>
    response = env.response()                  # the string a judge scores (== res.info["response"])
    env.close()

A turn with one or more ``<tool_call>`` blocks executes them and returns their outputs; a turn
with no tool call is the final answer (``done=True``). Malformed calls come back as error
observations, never exceptions. ``step`` after ``done`` is a caller bug and raises.

**What the judge sees.** Criteria in these environments check the final answer AND the
trajectory ("queried the right table", "never tried to write"), but a checker only receives
``fn(response, *, task, **args)``. So the response a judge scores is the environment's
*transcript*: a JSON document (``Transcript.to_response``) written by the environment, not by the
model, holding the raw assistant turns, every executed tool call with its outcome and details, the
final answer and a summary of the final environment state (e.g. orders placed). The model cannot
forge it: its text only ever appears JSON-escaped inside ``turns``. Checkers read it back with
``trajectory.transcript_of(response, task)``. A plain string (not a transcript) is accepted as a
bare final answer with an empty trajectory, so answer-only checks still work on text from
elsewhere.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import logging
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from rubric_rl.envs.tool_calls import (
    ToolCall,
    ToolCallError,
    ToolSpec,
    has_tool_call,
    parse_tool_calls,
    render_tool_response,
    strip_reasoning,
    tools_schema,
    tools_system_block,
    validate_call,
)
from rubric_rl.envs.trajectory import ToolRecord, Transcript
from rubric_rl.rubrics.types import Message, Task, append_to_last_user, append_to_system
from rubric_rl.util.registry import Registry

log = logging.getLogger(__name__)

SPLITS = ("train", "heldout", "ood")


# --------------------------------------------------------------------------------------------
# Value types


@dataclasses.dataclass(frozen=True)
class Observation:
    """The first observation: the chat messages to show and the tool schemas for the template."""

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] = ()

    def chat_messages(self, *, tools_in_system: bool = False) -> list[dict[str, str]]:
        """Messages as dicts. ``tools_in_system`` writes the Qwen3 tools block into the system
        message, for tokenizers whose chat template cannot take ``tools=``."""
        msgs = [m.to_dict() for m in self.messages]
        if tools_in_system and self.tools:
            block = tools_system_block(self.tools)
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + block}
            else:
                msgs.insert(0, {"role": "system", "content": block})
        return msgs


@dataclasses.dataclass(frozen=True)
class ToolOutput:
    """What a tool handler returns: the text the model sees and details kept for rubrics."""

    text: str
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepResult:
    r"""One ``step``.

    ``observation``: the whole tool turn as Qwen3's template writes it — one
    ``<tool_response>\n...\n</tool_response>`` block per call, joined by newlines — or None
    after the final answer. Qwen3's template puts a run of tool messages into one user turn, so
    the exact token text is ``"<|im_start|>user\n" + observation + "<|im_end|>\n"``.
    ``tool_messages``: the same results as one ``tool`` Message per call, unwrapped, for loops
    that render message lists with ``apply_chat_template``. ``info``: ``turn``, ``status``
    ("tool_calls" | "answered" | "max_turns"), ``tool_calls`` (this turn's records as dicts),
    ``num_errors``; once done also ``response`` (what the judge scores) and ``final_answer``.
    """

    observation: str | None
    done: bool
    info: Mapping[str, Any]
    tool_messages: tuple[Message, ...] = ()


# --------------------------------------------------------------------------------------------
# The environment


class Env(abc.ABC):
    """A multi-turn tool-use environment. Subclasses define ``name``, ``TOOLS``, ``_setup``,
    one ``_tool_<name>(**arguments) -> ToolOutput | str`` handler per tool (raising
    ``ToolCallError("tool_error", ...)`` to refuse), ``_state``, ``task_bank`` and
    ``reference_turns``. Construction must stay cheap: the agent loop makes one per rollout."""

    name: ClassVar[str] = ""
    TOOLS: ClassVar[tuple[ToolSpec, ...]] = ()
    TASK_TYPES: ClassVar[Mapping[str, tuple[str, ...]]] = {}  # task type -> capabilities
    OOD_TASK_TYPES: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, *, max_turns: int = 12, max_calls_per_turn: int = 8, max_output_chars: int = 4000
    ):
        if max_turns < 1 or max_calls_per_turn < 1 or max_output_chars < 100:
            raise ValueError(
                f"{type(self).__name__}: need max_turns >= 1, max_calls_per_turn >= 1, "
                f"max_output_chars >= 100 (got {max_turns}, {max_calls_per_turn}, "
                f"{max_output_chars})"
            )
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.max_output_chars = max_output_chars
        self._specs = {s.name: s for s in self.TOOLS}
        self._task: Task | None = None
        self._turns: list[str] = []
        self._records: list[ToolRecord] = []
        self._final: str | None = None
        self._status = "in_progress"

    # -- public API ---------------------------------------------------------------------------

    @classmethod
    def tools_schema(cls) -> list[dict[str, Any]]:
        """Tool schemas for the chat template's ``tools=`` argument."""
        return tools_schema(cls.TOOLS)

    def reset(self, task: Task, *, seed: int | None = None) -> Observation:
        """Start an episode on ``task``. ``seed`` is accepted for envs with stochastic dynamics;
        the built-in ones are deterministic given the task."""
        # Only another *tool* environment's name is a mismatch: every task has an env_name, and
        # most name evaluation environments (a constraint task type, a dataset category). A tool
        # environment registers itself where it is defined, so one whose task bank made the task
        # is known here.
        if task.env_name != self.name and is_tool_env(task.env_name):
            raise ValueError(f"task {task.id!r} is for env {task.env_name!r}, not {self.name!r}")
        self._teardown()
        self._task = task
        self._turns, self._records = [], []
        self._final, self._status = None, "in_progress"
        self._setup(task, seed)
        return Observation(messages=task.prompt, tools=tuple(self.tools_schema()))

    @property
    def done(self) -> bool:
        return self._status != "in_progress"

    def step(self, model_text: str) -> StepResult:
        if self._task is None:
            raise RuntimeError(f"{type(self).__name__}.step() before reset()")
        if self.done:
            raise RuntimeError(
                f"{type(self).__name__}.step() after the episode ended ({self._status})"
            )
        if not isinstance(model_text, str):
            raise TypeError(f"model_text must be a string, got {type(model_text).__name__}")
        self._turns.append(model_text)
        turn = len(self._turns)
        if not has_tool_call(model_text):
            self._final = strip_reasoning(model_text).strip()
            self._status = "answered"
            return StepResult(None, True, self._info(turn, []))
        records = [
            self._execute(turn, item, k) for k, item in enumerate(parse_tool_calls(model_text))
        ]
        self._records.extend(records)
        if turn >= self.max_turns:
            self._status = "max_turns"
        obs = "\n".join(render_tool_response(r.output) for r in records)
        tool_msgs = tuple(Message("tool", r.output) for r in records)
        return StepResult(obs, self.done, self._info(turn, records), tool_msgs)

    def transcript(self) -> Transcript:
        if self._task is None:
            raise RuntimeError(f"{type(self).__name__}.transcript() before reset()")
        return Transcript(
            env=self.name,
            task_id=self._task.id,
            status=self._status,
            turns=tuple(self._turns),
            tool_calls=tuple(self._records),
            final_answer=self._final,
            state=self._state(),
        )

    def response(self) -> str:
        """The string a judge scores for this episode (valid at any point, e.g. truncated)."""
        return self.transcript().to_response()

    def close(self) -> None:
        self._teardown()

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- task bank ----------------------------------------------------------------------------

    # Generated tasks share one generated world (a database, a catalog) in consecutive blocks of
    # TASKS_PER_WORLD; WORLD_KIND names the world in the seed derivation.
    TASKS_PER_WORLD: ClassVar[int] = 8
    WORLD_KIND: ClassVar[str] = "world"

    @classmethod
    def task_bank(cls, split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
        """``n`` tasks of ``split`` (train / heldout / ood), reproducible from ``seed``: task i
        is of type ``task_types(split)[i % k]`` over world ``i // TASKS_PER_WORLD``."""
        check_split(split)
        types = cls.task_types(split)
        out = []
        for i in range(n):
            world = derive_seed(
                f"{cls.name}-{cls.WORLD_KIND}", split, seed, i // cls.TASKS_PER_WORLD
            )
            rng = random.Random(derive_seed(f"{cls.name}-task", split, seed, i))
            task_id = f"{cls.name}-{split}-{seed}-{i:05d}"
            out.append(cls.make_task(task_id, types[i % len(types)], world, rng))
        return out

    @classmethod
    def make_task(cls, task_id: str, task_type: str, world_seed: int, rng: random.Random) -> Task:
        """One task of ``task_type`` over the world generated from ``world_seed``."""
        raise NotImplementedError(f"{cls.__name__} generates no tasks: define make_task")

    @classmethod
    @abc.abstractmethod
    def reference_turns(cls, task: Task) -> list[str]:
        """A scripted model solution (assistant turns) that passes the task's rubric."""

    @classmethod
    def task_types(cls, split: str) -> tuple[str, ...]:
        check_split(split)
        if split == "ood":
            return cls.OOD_TASK_TYPES
        return tuple(t for t in cls.TASK_TYPES if t not in cls.OOD_TASK_TYPES)

    # -- subclass hooks -----------------------------------------------------------------------

    @abc.abstractmethod
    def _setup(self, task: Task, seed: int | None) -> None: ...

    def _teardown(self) -> None:  # noqa: B027 - optional hook: release per-episode resources
        return None

    def _state(self) -> dict[str, Any]:
        return {}

    # -- internals ----------------------------------------------------------------------------

    def _execute(self, turn: int, item: ToolCall | ToolCallError, index: int) -> ToolRecord:
        if isinstance(item, ToolCallError):
            return self._error_record(turn, item, {})
        if index >= self.max_calls_per_turn:
            err = ToolCallError(
                "too_many_calls",
                f"at most {self.max_calls_per_turn} tool calls per turn; this one was skipped",
                name=item.name,
            )
            return self._error_record(turn, err, item.arguments)
        try:
            call = validate_call(item, self._specs)
            out = getattr(self, f"_tool_{call.name}")(**call.arguments)
        except ToolCallError as e:
            return self._error_record(turn, e, item.arguments)
        except Exception as e:  # an env bug must not kill a batch of rollouts
            log.exception("%s: tool %r failed", self.name, item.name)
            err = ToolCallError("tool_error", f"the tool failed internally ({type(e).__name__})")
            return self._error_record(turn, err, item.arguments, {"reason": "internal"})
        if isinstance(out, str):
            out = ToolOutput(out)
        return ToolRecord(
            turn,
            call.name,
            dict(call.arguments),
            True,
            self._cap(out.text),
            None,
            dict(out.details),
        )

    def _error_record(
        self,
        turn: int,
        err: ToolCallError,
        arguments: Mapping[str, Any],
        details: Mapping[str, Any] | None = None,
    ) -> ToolRecord:
        merged = dict(err.details)
        merged.update(details or {})
        args = dict(arguments) if isinstance(arguments, Mapping) else {}
        return ToolRecord(
            turn, err.name, args, False, self._cap(err.observation()), err.kind, merged
        )

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        keep = self.max_output_chars - 60
        return text[:keep] + f"\n... [output truncated: {len(text) - keep} more characters]"

    def _info(self, turn: int, records: Sequence[ToolRecord]) -> dict[str, Any]:
        status = self._status if self.done else "tool_calls"
        info: dict[str, Any] = {
            "turn": turn,
            "status": status,
            "tool_calls": [r.to_dict() for r in records],
            "num_errors": sum(not r.ok for r in records),
        }
        if self.done:
            info["response"] = self.response()
            info["final_answer"] = self._final
        return info


# --------------------------------------------------------------------------------------------
# How method text reaches a prompt

# The kinds of method text a style renders, in the order their blocks are mounted on a prompt:
# HarnessRL's guidance fields (HarnessRL §2.1: criterion, reference, critique after the prompt in
# that order), ARISE's skills, RISED's anti-patterns and ARISE-RL's coach memory.
TEXT_KINDS: tuple[str, ...] = (
    "criterion",
    "reference",
    "critique",
    "skills",
    "anti_patterns",
    "coach",
)
_COACH_NOTE = "remember : "
_COACH_SPLIT = re.compile(r" ; (?=remember : )")


def _texts(value: str | Sequence[str] | None) -> list[str]:
    """A field's value as its non-blank texts (one text, or several sharing one block)."""
    if value is None:
        return []
    texts = [value] if isinstance(value, str) else list(value)
    return [t for t in texts if t and t.strip()]


class Style:
    """The Domain contract's renderer family: how every kind of method text reaches a prompt, so
    a method runs on any domain without naming it. A domain whose policy was warm-started on a
    prompt shape (the embedded constraint domain's ``<criterion> … </criterion>`` blocks, its
    lower-case wording) or that talks to a chat model in English overrides it
    (``envs/constraint_style.py``, ``envs/instruct_guidance.py``); this base class is the generic
    style any other domain gets: plain blocks appended to the last user message.

    Texts: ``hint`` (a criterion stated as guidance), ``reference`` (a good / poor response),
    ``critique`` (the criteria earlier answers missed), ``coach`` / ``coach_notes`` (ARISE-RL's
    memory from its notes, and back). Prompts: ``mount`` (HarnessRL's guidance fields on a
    task's prompt), ``add_block`` (one block appended to an already-decorated prompt: ARISE's
    skills, ARISE-RL's coach memory), ``show_and_avoid`` (RISED's behaviours to show and
    anti-patterns to avoid: its decorated prompts and teacher contexts), ``describe`` (a RISED
    vocabulary rubric stated for one task)."""

    # -- texts ----------------------------------------------------------------------------------

    def hint(self, text: str, weight: float) -> str:
        """A criterion as guidance: its text, or an instruction to avoid a pitfall (weight < 0)."""
        return text if weight > 0 else f"Avoid: {text}"

    def reference(self, good: str | None, bad: str | None) -> str:
        """A good and / or a poor response as one text."""
        return "\n".join(
            ([f"A good response: {good}"] if good else [])
            + ([f"A poor response: {bad}"] if bad else [])
        )

    def critique(self, missed: Sequence[str]) -> str:
        """The criteria (as ``hint`` texts) that the previous answers missed."""
        return "The previous answers missed: " + "; ".join(missed)

    def coach(self, notes: Sequence[str]) -> str:
        """ARISE-RL's coach memory from its notes, one "remember : note" per note."""
        return " ; ".join(f"{_COACH_NOTE}{n}" for n in notes)

    def coach_notes(self, memory: str) -> list[str]:
        """``coach``'s memory back as its notes: ``coach(coach_notes(m)) == m``."""
        return [n.removeprefix(_COACH_NOTE) for n in _COACH_SPLIT.split(memory)]

    # -- prompts --------------------------------------------------------------------------------

    def block(self, kind: str, text: str | Sequence[str]) -> str:
        """One block of method text: ``<kind> text </kind>``, several texts joined by " ; "."""
        _check_kinds([kind], type(self).__name__)
        return f"<{kind}> {' ; '.join(_texts(text))} </{kind}>"

    def mount(self, task: Task, fields: Mapping[str, str | Sequence[str] | None]) -> list[dict]:
        """The task's prompt with ``fields`` (kind -> a text or several; empty ones skipped) as
        blocks in ``TEXT_KINDS`` order on the last user message; no text: the task's messages."""
        _check_kinds(fields, type(self).__name__)
        blocks = [self.block(k, fields[k]) for k in TEXT_KINDS if _texts(fields.get(k))]
        if not blocks:
            return task.messages
        return append_to_last_user(task.messages, "\n".join(blocks), what=f"task {task.id!r}")

    def add_block(
        self,
        task: Task,
        messages: Sequence[Mapping[str, str]],
        kind: str,
        text: str | Sequence[str],
        *,
        placement: str = "last_user",
    ) -> list[dict]:
        """``messages`` (``task``'s prompt, perhaps already decorated) with one ``kind`` block
        appended to the last user message, or to the system message (``placement="system"``)."""
        if placement == "system":
            return append_to_system(messages, self.block(kind, text))
        if placement != "last_user":
            raise ValueError(f"add_block: placement must be last_user or system, got {placement!r}")
        return append_to_last_user(messages, self.block(kind, text), what=f"task {task.id!r}")

    def show_and_avoid(
        self, task: Task, positives: Sequence[str], negatives: Sequence[str]
    ) -> list[dict]:
        """The task's prompt with behaviours to show (``positives``) and anti-patterns to avoid
        (``negatives``) as titled lists; neither: a copy of the task's messages."""
        blocks = []
        if positives:
            blocks.append("Behaviours to show:\n" + "\n".join(f"- {p}" for p in positives))
        if negatives:
            blocks.append("Anti-patterns to avoid:\n" + "\n".join(f"- {n}" for n in negatives))
        if not blocks:
            return [dict(m) for m in task.messages]
        return append_to_last_user(task.messages, "\n\n".join(blocks), what=f"task {task.id!r}")

    def describe(self, rubric_id: str, task: Task, description: str) -> str | None:
        """A rubric of a method's behaviour vocabulary stated for ``task``; ``description`` is the
        vocabulary's own text (what this style shows). None: the rubric does not apply to the
        task (nothing is shown)."""
        return description


def _check_kinds(kinds: Iterable[str], where: str) -> None:
    unknown = sorted(set(kinds) - set(TEXT_KINDS))
    if unknown:
        raise ValueError(f"{where}: unknown kinds of method text {unknown}; known: {TEXT_KINDS}")


# The style of a domain that defines none.
GENERIC_STYLE = Style()


@dataclasses.dataclass(frozen=True)
class SurfaceFeatures:
    """What a response shows on its surface, whatever it does for the task: a compliance or
    praise form (``fluff``), its length in the domain's words, a refusal or hedge (``stance``).
    Reward-hacking checks compare these between responses that meet a criterion and those
    that miss it."""

    fluff: bool
    length: int
    stance: bool = False


# One warm-up rollout: (environment, task, response, the task verifier's reward).
WarmupRollout = tuple[str, Task, str, float]


@dataclasses.dataclass(frozen=True)
class Behaviours:
    """The behaviours a domain's rollouts can be seen to show, read by code: what a rollout
    tagger needs to know of a domain (RISED's programmatic tagger and vocabulary warm-up).

    ``detect(task, response)``: every behaviour the response shows, as name -> count, from what
    a judge of the domain sees (the prompt, the response, the task's rule checkers; never a
    hidden field); ValueError for a rollout it cannot read. ``catalogue()``: every name
    ``detect`` can give, by id, with its skill, polarity and description (a
    ``rubrics.vocabulary.RubricEntry``); ``aliases``: other names a judge may use for them.
    ``warmup(seed, n, weak_per_task)``: (weak, strong) rollouts over the first ``n`` training
    tasks of the domain generated from ``seed``: ``weak_per_task`` weak-policy stand-ins per
    task, and its reference solution. ``describe(name, task)``: a behaviour stated for one task
    in the domain's own words (None: the task does not have it); None: the catalogue's text.
    ``name`` identifies the record in a cached vocabulary's provenance."""

    name: str
    detect: Callable[[Task, str], dict[str, int]]
    catalogue: Callable[[], Mapping[str, Any]]
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    warmup: Callable[[int, int, int], tuple[list[WarmupRollout], list[WarmupRollout]]] | None = None
    describe: Callable[[str, Task], str | None] | None = None


# A method's tool event over an episode's tool records: whether they hold an observation that
# counts, given the final answer's turn (``final_turn=``; None: any turn). ARISE-RL's R_tool event
# (``arise_rl_rewards.tool_observed``) is one; a task writer is given it, never imports it.
ToolEvent = Callable[..., bool]


class TaskWriter(Protocol):
    """A domain's side of a policy writing new tasks of it (ARISE-RL's generator role): what a
    written task is and how it is checked, in the domain's terms. A method supplies its own
    parts (its tool event, its rewards) and reads these.

    ``name``: the writer's name (``config.arise_rl.generator_domain``); ``env_name``:
    ``Task.env_name`` of its writer-role tasks; ``solver_agent``: solver attempts at a written
    task are agent episodes; ``hints``: the coach's hints in the domain's words (keys
    ``format``, ``tool``, ``too_easy``, ``too_hard``, optional ``keep`` with ``{question}``).
    ``generator_tasks``: writer-role tasks (the role prompt with the ``recent`` questions as
    in-context negatives); ``make_env``: the tool environment of a writer-role episode;
    ``episode_outcome``: (the parsed task, whether its tool observation counts) of an episode's
    transcript — the parsed record has ``task`` (None when it states none), ``question``,
    ``num_criteria``, ``num_unknown`` and ``reason`` (why it states none); ``signature`` /
    ``forbidden_signatures``: a task's identity for deduplication and those of tasks that must
    never be written (the evaluation splits'); ``task_record`` / ``task_from_record``: a pool
    task as JSON and back (None: a domain task's record, ``{"id": …}``). The coach's memory is
    placed in a prompt by the domain's ``Style`` (``add_block`` with kind "coach")."""

    name: str
    env_name: str
    solver_agent: bool
    hints: Mapping[str, str]

    def generator_tasks(
        self, rng: Any, n: int, recent: Sequence[str], *, first_index: int, n_negatives: int
    ) -> list[Task]: ...

    def make_env(self, task: Task) -> Env: ...

    def episode_outcome(self, response: str, *, forbidden: frozenset[str]) -> tuple[Any, bool]: ...

    def signature(self, task: Task) -> str: ...

    def forbidden_signatures(self, tasks: Iterable[Task]) -> frozenset[str]: ...

    def task_record(self, task: Task) -> dict[str, Any]: ...

    def task_from_record(
        self, rec: Mapping[str, Any], forbidden: frozenset[str]
    ) -> Task | None: ...


@runtime_checkable
class DomainContract(Protocol):
    """The Domain contract: what the loop, the evaluation and every method may read of a domain.

    Any object with these members is a domain (a method takes one as an argument and imports no
    domain module); ``Domain`` below is the ready-made implementation, with every optional part
    absent by default. An optional part is ``None`` where the domain does not have it.

    The tasks: ``name``; the splits ``train``, ``validation`` (for choices the held-out set must
    never make), ``heldout`` and ``ood``; ``episodic`` (which tasks are agent episodes).
    Judging: ``verify`` (a task passes when every stated constraint holds), ``oracle`` (hidden
    quality in [0, 1], analysis only), ``criteria_library`` (the rule-checked criteria a
    rubric-writing method may propose for a task). Reading responses without a judge:
    ``surface_features``, ``behaviours``. Writing tasks: ``task_writer``. Method text in prompts:
    ``style`` (skills, guidance fields, coach memory, anti-patterns, teacher context),
    ``skill_texts``, ``guidance`` (the task's prompt with the domain's own guidance). The policy's
    side: ``corpus`` / ``copy_corpus`` (warm-start demonstrations), ``vocabulary`` and
    ``embedded_tokenizer`` (the embedded tokenizer), ``make_env`` (a task's tool environment)."""

    name: str
    train: Sequence[Task]
    validation: Sequence[Task]
    heldout: Sequence[Task]
    ood: Sequence[Task]
    episodic: Callable[[Task], bool] | None
    verify: Callable[[Task, str], bool] | None
    oracle: Callable[[Task, str], float] | None
    criteria_library: Callable[[Task], Sequence[Any]] | None
    surface_features: Callable[[str], SurfaceFeatures] | None
    behaviours: Behaviours | None
    task_writer: Callable[..., TaskWriter] | None
    style: Style
    skill_texts: Mapping[str, str]
    guidance: Callable[[Task], list[dict]] | None
    corpus: Callable[[int, int, float, float], list[tuple[list[dict], str]]] | None
    copy_corpus: Callable[[int, int], list[tuple[list[dict], str]]] | None
    vocabulary: Sequence[str] | None
    embedded_tokenizer: str
    make_env: Callable[[Task], Env] | None


CONTRACT_MEMBERS: tuple[str, ...] = tuple(DomainContract.__annotations__)


def check_domain(domain: Any, where: str) -> None:
    """A clear error naming the Domain contract's members that ``domain`` lacks (``where``: who
    was given it, e.g. ``Trainer(domain=)``)."""
    missing = [m for m in CONTRACT_MEMBERS if not hasattr(domain, m)]
    if missing:
        raise TypeError(
            f"{where}: {type(domain).__name__} is not a domain: it lacks {', '.join(missing)} of "
            "the Domain contract (rubric_rl/envs/base.py DomainContract; envs.base.Domain "
            "implements every member, the optional ones absent by default)"
        )
    if not isinstance(domain.style, Style):
        raise TypeError(
            f"{where}: {type(domain).__name__}.style is {type(domain.style).__name__}, not an "
            "envs.base.Style (GENERIC_STYLE, or a subclass overriding its renderers)"
        )


@dataclasses.dataclass(frozen=True)
class Domain:
    """The Domain contract's ready-made implementation (``DomainContract``): what the loop, the
    evaluation and every method know of a domain, the optional parts absent by default.

    Task splits (``train``, ``validation``, ``heldout``, ``ood``), the task verifier (``verify``:
    a task passes when every stated constraint holds), the hidden oracle (``oracle``: quality in
    [0, 1], analysis only, never shown to controllers), the criteria library
    (``criteria_library``: the rule-checked criteria a rubric-writing method may propose for a
    task), the warm-start corpora, the tool environment of an episodic task, what a method may
    read of a response without a judge: its surface features (``surface_features``) and the
    behaviours it shows (``behaviours``, a ``Behaviours`` record), its side of a policy writing
    tasks of it (``task_writer``, a ``TaskWriter``), and how method text reaches its prompts
    (``style``, a ``Style``; ``skill_texts``, its skills). Each domain
    (``builders.DOMAINS``) builds one; method code takes it as an argument and imports no
    domain module (``tools/import_cycles.py`` LAYER_RULES)."""

    name: str
    train: tuple[Task, ...]
    heldout: tuple[Task, ...]
    ood: tuple[Task, ...]
    verify: Callable[[Task, str], bool] | None = None  # task pass (all stated constraints)
    oracle: Callable[[Task, str], float] | None = None  # hidden quality in [0, 1]
    # (n, seed, p_keep, copy_fraction): n demonstrations, each stated constraint met with
    # probability p_keep; a share copy_fraction copy demonstrations (a domain without copy
    # demonstrations, copy_corpus None, ignores it and the warm start logs that).
    corpus: Callable[[int, int, float, float], list[tuple[list[dict], str]]] | None = None
    vocabulary: Sequence[str] | None = None
    # A fresh tool environment for one rollout of a task (None: a single-turn domain). The
    # agent loop (rollout/agent.py) makes one per rollout and closes it.
    make_env: Callable[[Task], Env] | None = None
    # The embedded tokenizer over ``vocabulary``: "word" (units joined by spaces on decode) or
    # "spaced" (units carry their leading space: decode(encode(text)) == text, needed where the
    # policy's text is parsed: tool-call JSON, SQL). See build_tokenizer.
    embedded_tokenizer: str = "word"
    # The task's prompt with the domain's own guidance for it (the embedded domain: the skill texts
    # of its capabilities), for calibration's guidance-following gain
    # (rubric_rl/pre_rl/calibration.py).
    guidance: Callable[[Task], list[dict]] | None = None
    # The domain's checker library: the rule-checked criteria a rubric-writing method may propose
    # for a task, read from its prompt text (the embedded domain: envs/constraint_library.py;
    # ARISE's ``arise.bank``). None: the task's own rubric is the only bank.
    criteria_library: Callable[[Task], Sequence[Any]] | None = None
    # (n, seed): n copy demonstrations for the warm start's first warmstart.copy_steps steps.
    copy_corpus: Callable[[int, int], list[tuple[list[dict], str]]] | None = None
    # Tasks for choices (checkpoints, hyperparameters) that the held-out set must never make
    # (benchmarks/protocol.md); empty where the domain has no such split.
    validation: tuple[Task, ...] = ()
    # Which tasks are rolled out as agent episodes in agent mode (None: every task). The embedded
    # domain with tool environments mixed in (``domain.tool_envs``): their tasks only.
    episodic: Callable[[Task], bool] | None = None
    # A response's surface features in the domain's own terms (the embedded domain: its praise
    # openers and compliance closers, its word units). None: a method reads common English
    # praise / compliance / refusal phrases and whitespace words.
    surface_features: Callable[[str], SurfaceFeatures] | None = None
    # The behaviours its rollouts can be seen to show, read by code (``Behaviours``), for a
    # method that tags rollouts (RISED's programmatic tagger). None: no programmatic tagging.
    behaviours: Behaviours | None = None
    # A policy writing new tasks of the domain (ARISE-RL's generator role): ``task_writer(
    # observed=<the method's ToolEvent>, complete=<bool>)`` -> a ``TaskWriter``. ``complete``: a
    # written task's rubric also gets the criteria its question implies (where the domain has a
    # library to complete from). None: the domain cannot be written for.
    task_writer: Callable[..., TaskWriter] | None = None
    # How method text (skills, guidance fields, coach memory, anti-patterns, teacher contexts)
    # reaches this domain's prompts: ``Style`` (the generic one) or the domain's own.
    style: Style = GENERIC_STYLE
    # Capability -> the base skill text of the domain's own wording (ARISE's programmatic
    # reflection starts a pair's skill from it; a capability without one gets a criterion slot).
    skill_texts: Mapping[str, str] = dataclasses.field(default_factory=dict)


def tool_error(message: str, **details: Any) -> ToolCallError:
    """A refusal by the tool itself (the call was well-formed); ``details`` go to the record."""
    return ToolCallError("tool_error", message, details=details)


# --------------------------------------------------------------------------------------------
# The tool environments by name

# Each tool environment registers itself next to its definition (``@ENVS.register("sql")``);
# ``envs/registry.py`` imports them all and builds environments by name.
ENVS: Registry[type[Env]] = Registry("env")


def is_tool_env(name: str | None) -> bool:
    """Whether ``name`` is a registered tool environment (multi-turn, built by ``make_env``).

    Every task carries an ``env_name`` (the environment it is evaluated under: a constraint task
    type, a dataset's category, ...); only some of those are tool environments, so "is this a
    tool-environment task" is ``is_tool_env(task.env_name)``, never ``task.env_name is not None``.
    """
    return name is not None and name in ENVS


# --------------------------------------------------------------------------------------------
# Task-bank helpers


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


def derive_seed(*parts: Any) -> int:
    """A stable 63-bit seed from any parts (Python's ``hash`` of str is salted per process)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
