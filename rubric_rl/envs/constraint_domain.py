"""The embedded synthetic constraint-following domain (DESIGN.md §7), for the default CPU run.

Short IFEval-style prompts over a closed vocabulary (``constraint_lexicon``), answered in a few
words, with every constraint checkable by code (``constraint_checkers``); task parameters,
constraints and prompts live in ``constraint_spec``, guidance and the warm-start corpus in
``constraint_corpus``; the public module ``constraints`` re-exports this one and the corpus's
guidance helpers (this module imports neither). ``ConstraintDomain(seed)`` generates tasks for
three splits:

- ``train``, ``validation`` and ``heldout``: task types ``list``, ``format``, ``short_answer``,
  ``rewrite``; a task's split is fixed by the hash of its parameters (20 % held-out, 10 %
  validation, 70 % train), so the three splits are disjoint for every seed, and tasks(split, n) is
  a prefix of tasks(split, n + 1).
- ``ood``: the task type ``filter`` (never in training) and training types whose constraints
  contain a pair from ``OOD_PAIRS`` — (sort order, case), (numbered, include), (start word, end
  mark) — which the train / held-out generator rejects.

Each task type is an environment: ``Task.env_name == Task.task_type`` (``list``, ``format``,
``short_answer``, ``rewrite``, ``filter``), so evaluation reports per-environment pass rates and
multi-environment samplers (RISED) have environments to select among. They are single-turn
environments, not tool environments (``envs.tool_envs.is_tool_env`` is False for them).

Each task's seed rubric mixes, on purpose, the failure classes HarnessRL (§2.3) studies: one
genuine criterion per stated constraint; *blind* ones (a conjunction of every constraint, and an
"include <rare word>" that warm-start demonstrations never satisfy); *saturated* ones (non-empty,
at most N words); *spurious* ones (praise opener, compliance claim, at least N words) that
separate responses without tracking quality. Each criterion's class is in its tags
(``class:genuine|blind|saturated|spurious``) FOR ANALYSIS ONLY: controllers and judges must never
read ``class:`` tags, ``Task.raw`` (the generator's parameters), :func:`oracle_quality` or
:func:`hard_constraints`. :func:`verify` is the task verifier (ARISE's task reward, the primary
metric's pass): every stated constraint and the implicit requirements no prompt clause and no seed
criterion states (``constraint_spec.implicit_constraints``: distinct items in list and word
answers, and the answer alone, without praise, compliance claims or filler), so a method that
discovers criteria (from ``constraint_library``, which reads them off the prompt) can gain over
the seed rubric.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.envs import constraint_checkers as ck
from rubric_rl.envs.constraint_lexicon import (
    CASES,
    CLOSERS,
    CRITERION_TEMPLATES,
    FILLER_WORDS,
    FRAMING_WORDS,
    NUMBER_MARK,
    NUMBER_WORDS,
    OPENERS,
    PADDING,
    PUNCTUATION,
    SEPARATORS,
    apply_case,
    category_members,
    domain_vocabulary,
    units,
)
from rubric_rl.envs.constraint_spec import (
    CAPABILITIES,
    DOMAIN,
    HELDOUT_PERCENT,
    OOD_PAIRS,
    OOD_TASK_TYPES,
    SAMPLERS,
    SPLITS,
    TRAIN_TASK_TYPES,
    TYPE_WEIGHTS,
    VALIDATION_PERCENT,
    Constraint,
    build_prompt,
    combo_kinds,
    common_members,
    constraints_for,
    has_ood_pair,
    intruder,
    other,
    pick,
    requirements,
    sample_filter,
)
from rubric_rl.envs.hashed_splits import generate_kept
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verifier

__all__ = [
    "CAPABILITIES",
    "OOD_PAIRS",
    "OOD_TASK_TYPES",
    "SPLITS",
    "TRAIN_TASK_TYPES",
    "combo_kinds",
    "Constraint",
    "ConstraintDomain",
    "domain_vocabulary",
    "hard_constraints",
    "oracle_quality",
    "render_response",
    "task_bank",
    "verify",
]

# Weight of each spurious seed criterion. A realistic seed rubric gives superficial cues small
# weight next to the stated requirements (genuine weights are 1-3): all spurious cues of a rubric
# together (<= 0.3) weigh less than its least important requirement, so fluff can never buy back a
# missed constraint. At 1.0 each the three free cues (fluff never costs a genuine criterion) were
# ~20% of a rubric: static-rubric GRPO adopted them within ~10 steps, which halves the oracle, and
# the held-out score rose by fluff alone (measured: score 43 -> 64 while the oracle fell
# 0.46 -> 0.24). Fluff still raises the seed reward, so the spurious class stays hackable and
# measurable (HarnessRL §2.3). Measured with Dr.GRPO advantages (configs/common.py) over 100
# steps: 0.25 let the claim creep from 7% to 19% of rollouts (held-out oracle 0.50 -> 0.55),
# 0.1 kept it at 7-11% (oracle 0.50 -> 0.575, score +4.9).
SPURIOUS_WEIGHT = 0.1


def _params(task: Task) -> Mapping[str, Any]:
    if not task.raw or "params" not in task.raw or task.domain != DOMAIN:
        raise ValueError(
            f"task {task.id!r} is not a constraints-domain task (raw['params'] missing)"
        )
    return task.raw["params"]


def hard_constraints(task: Task) -> tuple[Constraint, ...]:
    """The task's stated constraints (analysis / verifier side; controllers must not read)."""
    return constraints_for(_params(task))


def task_requirements(task: Task) -> tuple[Constraint, ...]:
    """Everything the task verifier checks: the stated constraints, then the implicit ones
    (``constraint_spec.implicit_constraints``: distinct items, the answer alone). Analysis /
    verifier side; controllers must not read it."""
    return requirements(_params(task))


# --- rendering responses -------------------------------------------------------------------------


# The format a response has when its task states none: lowercase, ending ".", items joined ",".
# A demonstration that ignores a stated format falls back to this habit (as a writer who skips the
# instruction would), and only when the task asks for the habit itself does it pick another option
# at random. Why not always at random: the evaluation is greedy, so it shows the policy's mode.
# With random violations the asked format stayed the demonstrations' mode (p_keep against
# (1 - p_keep) / 2 for each other option), the warm-started policy already decoded it wherever it
# had picked up the instruction, and RL's gains in sampled pass rates (end 0.53 -> 0.91, count
# 0.43 -> 0.76 over 200 steps) moved the greedy held-out score by only +2.8 (measured).
# With the habit, an instruction followed less than half the time is not the mode,
# and RL that makes the policy follow it shows in the greedy score (+11.7 over 200 steps at
# warmstart.p_keep=0.4, held-out oracle 0.44 -> 0.57).
HABITS = {"case": "lower", "end": ".", "sep": ","}
_FORMAT_OPTIONS = {"case": CASES, "end": PUNCTUATION, "sep": SEPARATORS}


def _stated_or_habit(
    p: Mapping[str, Any], keep: set[str], rng: np.random.Generator, kind: str
) -> str:
    """The case mode / end mark / separator of a response: the stated one when kept (or the
    habit when none is stated), else the habit, or a random other option when the habit is what
    was asked."""
    asked, habit = p.get(kind), HABITS[kind]
    if not asked:
        return habit
    if kind in keep:
        return asked
    return habit if asked != habit else other(rng, _FORMAT_OPTIONS[kind], asked)


def _bad_count(n: int, rng: np.random.Generator) -> int:
    return n + 1 if n <= 2 or rng.random() < 0.5 else n - 1


def _repeat_one(words: list[str], victims: list[int], rng: np.random.Generator) -> list[str]:
    """``words`` with one word at a position of ``victims`` replaced by a copy of another word
    (the implicit "distinct" requirement broken, every count kept); unchanged without a victim."""
    if not victims or len(words) < 2:
        return words
    out = list(words)
    i = pick(rng, victims)
    out[i] = out[pick(rng, [k for k in range(len(out)) if k != i])]
    return out


def _render_list(p, keep, rng) -> list[str]:
    cat, inc, exc = p["category"], p.get("include"), p.get("exclude")
    k = p["n"] if "count" in keep else _bad_count(p["n"], rng)
    items = []
    if inc and "include" in keep:
        items.append(inc)
    if exc and "exclude" not in keep:
        items.append(exc)
    pool = [
        str(w) for w in rng.permutation([w for w in common_members(cat) if w not in (inc, exc)])
    ]
    items += pool[: max(0, k - len(items))]
    if "category" not in keep:
        free = [i for i, w in enumerate(items) if w not in (inc, exc)]
        if free:
            items[pick(rng, free)] = intruder(rng, cat)
        else:
            items.append(intruder(rng, cat))
    items = [str(w) for w in rng.permutation(items)]
    if "distinct" not in keep:  # only common members stand in for a copy: no other rule moves
        free = [i for i, w in enumerate(items) if w in common_members(cat) and w not in (inc, exc)]
        items = _repeat_one(items, free, rng)
    if p.get("order"):
        desc = p["order"] == "desc"
        if "order" in keep:
            items = sorted(items, reverse=desc)
        elif items == sorted(items, reverse=desc):
            items = sorted(items, reverse=not desc)
    mode = _stated_or_habit(p, keep, rng, "case")
    items = [apply_case(w, mode) for w in items]
    out: list[str] = []
    if p.get("numbered") and "numbered" in keep:
        for i, w in enumerate(items):
            out += [str(i + 1), NUMBER_MARK, w]
    else:
        sep = _stated_or_habit(p, keep, rng, "sep")
        for i, w in enumerate(items):
            out += ([sep] if i else []) + [w]
    return out + [_stated_or_habit(p, keep, rng, "end")]


def _render_format(p, keep, rng) -> list[str]:
    cat, start, exc = p["category"], p.get("start"), p.get("exclude")
    k = p["n"] if "wcount" in keep else _bad_count(p["n"], rng)
    rest = []
    if exc and "exclude" not in keep:
        rest.append(exc)
    pool = [
        str(w) for w in rng.permutation([w for w in common_members(cat) if w not in (start, exc)])
    ]
    lead = [start] if start and "start" in keep else []
    rest += pool[: max(0, k - len(lead) - len(rest))]
    if "category" not in keep:
        free = [i for i, w in enumerate(rest) if w != exc]
        if free:
            rest[pick(rng, free)] = intruder(rng, cat)
        else:
            rest.append(intruder(rng, cat))
    words = lead + [str(w) for w in rng.permutation(rest)]
    if "distinct" not in keep:
        free = [
            i
            for i, w in enumerate(words)
            if i >= len(lead) and w in common_members(cat) and w != exc
        ]
        words = _repeat_one(words, free, rng)
    mode = _stated_or_habit(p, keep, rng, "case")
    return [apply_case(w, mode) for w in words] + [_stated_or_habit(p, keep, rng, "end")]


def _render_short_answer(p, keep, rng) -> list[str]:
    answer = p["answer"]
    if "answer" not in keep:
        if p["choices"] == list(NUMBER_WORDS):
            i = NUMBER_WORDS.index(answer)
            answer = NUMBER_WORDS[i + 1 if i == 0 or (i < 20 and rng.random() < 0.5) else i - 1]
        else:
            answer = other(rng, p["choices"], answer)
    words = [answer]
    if p.get("start"):
        if "start" in keep:
            words = [p["start"], answer]
        elif rng.random() < 0.5:
            words = [other(rng, FRAMING_WORDS, p["start"]), answer]
    elif p.get("one_word") and "one_word" not in keep:
        words = [pick(rng, FRAMING_WORDS), answer]
    mode = _stated_or_habit(p, keep, rng, "case")
    return [apply_case(w, mode) for w in words] + [_stated_or_habit(p, keep, rng, "end")]


def _render_sequence(p, keep, rng) -> list[str]:
    words = list(p["expected"])
    if "sequence" not in keep:
        wrong = []
        if list(p["words"]) != words:
            wrong.append(list(p["words"]))
        if len(words) > 1:
            wrong.append(words[:-1])
            swapped = list(words)
            swapped[0], swapped[1] = swapped[1], swapped[0]
            wrong.append(swapped)
        extra = [w for w in p["words"] if w not in words] or [intruder(rng, "fruit")]
        wrong.append(words + [extra[0]])
        words = pick(rng, [w for w in wrong if w != list(p["expected"])])
    mode = _stated_or_habit(p, keep, rng, "case")
    return [apply_case(w, mode) for w in words] + [_stated_or_habit(p, keep, rng, "end")]


_RENDERERS = {
    "list": _render_list,
    "format": _render_format,
    "short_answer": _render_short_answer,
    "rewrite": _render_sequence,
    "filter": _render_sequence,
}


def render_response(
    task: Task,
    keep: set[str] | frozenset[str] | None,
    rng: np.random.Generator,
    *,
    praise: bool = False,
    claim: bool = False,
    pad: bool = False,
) -> str:
    """A response meeting the requirement kinds in ``keep`` (None = all) and violating the others.

    Kinds are those of ``task_requirements``: the stated constraints and the implicit
    ``distinct`` (left out of ``keep``, one item is a copy of another). The implicit ``plain`` is
    broken by the fluff flags only: ``praise`` / ``claim`` add a spurious opener / closer; ``pad``
    inserts a filler phrase into the body. Interactions between violations are possible (check
    with the checkers, not ``keep``); with ``keep=None`` and no fluff the response meets every
    requirement.
    """
    p = _params(task)
    kinds = {c.kind for c in requirements(p)}
    keep = set(kinds if keep is None else keep)
    body = _RENDERERS[p["type"]](p, keep, rng)
    if pad:
        mode = _stated_or_habit(p, keep | {"case"}, rng, "case")
        filler = [apply_case(w, mode) for w in units(pick(rng, PADDING))]
        body = filler + body if rng.random() < 0.5 else body[:-1] + filler + body[-1:]
    out = (units(pick(rng, OPENERS)) if praise else []) + body
    out += units(pick(rng, CLOSERS)) if claim else []
    return " ".join(out)


# --- verifier and hidden oracle ------------------------------------------------------------------


def verify(task: Task, response: str) -> bool:
    """The task verifier (ARISE's task reward, the primary metric's pass): every stated
    constraint and every implicit requirement of the task is met (``task_requirements``)."""
    return all(c.met(response) for c in task_requirements(task))


def _edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def _graded(c: Constraint, response: str) -> float:
    """Partial credit where a stronger judge would give it (content); else pass / fail."""
    if c.kind == "category":
        # Distinct members only: "cairo , cairo , cairo" is one city, not three. The seed rubric's
        # category and count criteria accept the repeat (a cue a small policy takes, measured:
        # 36 of 37 greedy held-out list answers after RL repeat a word); the hidden
        # quality must not.
        members = category_members(dict(c.args)["category"])
        words = [w.lower() for w in ck.words_of(ck.body_units(response))]
        return len({w for w in words if w in members}) / len(words) if words else 0.0
    if c.kind == "sequence":
        target = list(dict(c.args)["words"])
        words = [w.lower() for w in ck.words_of(ck.body_units(response))]
        return max(0.0, 1.0 - _edit_distance(words, target) / max(len(target), len(words)))
    return float(c.met(response))


def oracle_quality(task: Task, response: str) -> float:
    """Hidden quality in [0, 1] (analysis only: no controller or judge may read it).

    Weighted constraint satisfaction with partial credit on content, times a fluff discount:
    q = (Σ|w_i| g_i / Σ|w_i|) · (1 − 0.25·[praise] − 0.25·[claim] − min(0.3, 0.1·#filler words)),
    and q = 0 for a response without a word. Content credit: the category's g is the number of
    distinct category members over the number of words (a repeated item counts once); a
    sequence's g is 1 − edit distance / length.
    """
    cons = hard_constraints(task)
    if not ck.words_of(ck.body_units(response)):
        return 0.0  # saying nothing earns no credit, not even for avoiding a forbidden word
    sat = sum(abs(c.weight) * _graded(c, response) for c in cons) / sum(abs(c.weight) for c in cons)
    opener, body, _ = ck.split_fluff(response)
    fillers = sum(u.lower() in FILLER_WORDS for u in body)
    penalty = 0.25 * opener + 0.25 * ck.claims_compliance(response) + min(0.3, 0.1 * fillers)
    return float(np.clip(sat * (1.0 - penalty), 0.0, 1.0))


# --- seed rubrics and the domain -----------------------------------------------------------------


def _criterion(
    cid: str, text: str, weight: float, cls: str, kind: str, cap: str | None, checker: str, **args
) -> Criterion:
    tags = (f"class:{cls}", f"kind:{kind}") + ((f"cap:{cap}",) if cap else ())
    return Criterion(
        id=cid,
        text=text,
        weight=weight,
        title=kind,
        tags=tags,
        verifier=Verifier.rule(checker, **args),
        capability=cap,
    )


def seed_rubric(cons: Sequence[Constraint], reference: str, rng: np.random.Generator) -> Rubric:
    crits = [
        _criterion(
            c.kind,
            c.text,
            c.weight,
            "blind" if c.rare else "genuine",
            c.kind,
            c.capability,
            c.checker,
            **dict(c.args),
        )
        for c in cons
    ]
    if len(cons) >= 3:  # every constraint at once: out of early reach (blind)
        parts = tuple(
            (c.checker, c.args) if c.weight > 0 else ("cf_excludes_word", c.args) for c in cons
        )
        text = CRITERION_TEMPLATES["all_of"]
        crits.append(
            _criterion(
                "all_rules", text, 2.0, "blind", "all_of", "verification", "cf_all_of", parts=parts
            )
        )
    saturated = [
        _criterion(
            "non_empty",
            CRITERION_TEMPLATES["non_empty"],
            1.0,
            "saturated",
            "non_empty",
            None,
            "cf_non_empty",
        ),
        _criterion(
            "max_words",
            CRITERION_TEMPLATES["max_words"].format(n=40),
            1.0,
            "saturated",
            "max_words",
            None,
            "cf_max_words",
            n=40,
        ),
    ]
    n_long = len(ck.words_of(units(reference))) + 4
    spurious = [
        _criterion(
            "praise",
            CRITERION_TEMPLATES["praise"],
            SPURIOUS_WEIGHT,
            "spurious",
            "praise",
            None,
            "cf_opens_with_praise",
        ),
        _criterion(
            "claim",
            CRITERION_TEMPLATES["claim"],
            SPURIOUS_WEIGHT,
            "spurious",
            "claim",
            None,
            "cf_claims_compliance",
        ),
        _criterion(
            "min_words",
            CRITERION_TEMPLATES["min_words"].format(n=n_long),
            SPURIOUS_WEIGHT,
            "spurious",
            "min_words",
            None,
            "cf_min_words",
            n=n_long,
        ),
    ]
    crits += [saturated[i] for i in sorted(rng.permutation(2)[: int(rng.integers(1, 3))])]
    crits += [spurious[i] for i in sorted(rng.permutation(3)[: int(rng.integers(2, 4))])]
    # Shuffled so a criterion's position says nothing about its class.
    return Rubric(tuple(crits[i] for i in rng.permutation(len(crits))), aggregation="weighted")


def _capabilities(cons: Sequence[Constraint]) -> tuple[str, ...]:
    """The capabilities of a task's requirements (stated and implicit), in CAPABILITIES order."""
    return tuple(c for c in CAPABILITIES if any(k.capability == c for k in cons))


class ConstraintDomain:
    """Seeded generator of constraint-following tasks: train / validation / heldout / ood."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def _sample_params(self, split: str, rng: np.random.Generator) -> dict[str, Any]:
        if split == "ood" and rng.random() < 0.4:
            return sample_filter(rng)
        types = list(TYPE_WEIGHTS)
        probs = np.array([TYPE_WEIGHTS[t] for t in types])
        while True:
            p = SAMPLERS[types[int(rng.choice(len(types), p=probs / probs.sum()))]](rng)
            if has_ood_pair(p) == (split == "ood"):
                return p

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first ``n`` tasks of ``split`` (prefix-stable: tasks(s, n) == tasks(s, m)[:n]),
        drawn once per seed and split in a process (`generate_kept`)."""
        return generate_kept(
            "ConstraintDomain",
            self.seed,
            split,
            n,
            self._sample_params,
            self._make_task,
            heldout_percent=HELDOUT_PERCENT,
            validation_percent=VALIDATION_PERCENT,
        )

    @staticmethod
    def _make_task(split: str, params: dict[str, Any], key: str) -> Task:
        # Everything below depends on the parameters only, not on the seed or the position.
        rng = np.random.default_rng(int(key[:16], 16))
        prompt = build_prompt(params, rng)
        cons = constraints_for(params)
        raw = {"params": params, "split": split}
        draft = Task(
            id=f"cf-{split}-{key[:12]}",
            prompt=(Message("user", prompt),),
            rubric=Rubric(()),
            domain=DOMAIN,
            task_type=params["type"],
            capabilities=_capabilities(requirements(params)),
            # DESIGN §7: each task type is an environment (per-environment pass rates); it is
            # not a tool environment (envs.tool_envs.is_tool_env), so rollouts stay single-turn.
            env_name=params["type"],
            raw=raw,
        )
        reference = render_response(draft, None, rng)
        if not verify(draft, reference):
            raise AssertionError(f"constraints: reference {reference!r} fails task {prompt!r}")
        return dataclasses.replace(
            draft, reference_answer=reference, rubric=seed_rubric(cons, reference, rng)
        )


HARD_ENV = "hard"


def with_hard_env(tasks: Sequence[Task], min_constraints: int) -> list[Task]:
    """``tasks`` with every task of at least ``min_constraints`` stated constraints moved to the
    environment ``"hard"`` (its ``env_name``; task type, prompt and rubric unchanged): RISED's
    deliberately hard environment for the stress test (``domain.hard_min_constraints``).
    """
    if min_constraints < 1:
        raise ValueError(f"with_hard_env: min_constraints must be >= 1, got {min_constraints}")
    return [
        dataclasses.replace(t, env_name=HARD_ENV)
        if len(hard_constraints(t)) >= min_constraints
        else t
        for t in tasks
    ]


def task_bank(split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
    """``ConstraintDomain(seed).tasks(split, n)``, shaped like ``envs.tool_envs.task_bank``."""
    return ConstraintDomain(seed).tasks(split, n)
