"""Guidance rendering and the supervised warm-start corpus of the embedded constraint domain.

Controllers mount guidance with :func:`decorate_prompt`, and the corpus is built with the same
function, so train-time prompts and warm-start prompts match exactly. Blocks are appended to the
last user message, one per kind, in the fixed order of ``GUIDANCE_KINDS``: the HarnessRL fields
``<criterion>``, ``<reference>``, ``<critique>`` (HarnessRL §2.1: mounted after the prompt in that
order), then ARISE ``<skills>``, RISED ``<anti_patterns>`` and ARISE-RL ``<coach>`` memory.
An empty guidance dict returns the task's own messages unchanged (RISED E.6: an empty teacher
context must give the student's exact input).

The corpus is deliberately imperfect: an unguided demonstration meets each stated constraint
only with probability ``p_keep`` (never a rare "include" word; a violated format falls back to the
habit of a task that states none: ``constraints.HABITS``), and carries spurious fluff (praise
opener, compliance claim, padding) at random, so RL has headroom and spurious criteria separate
rollouts from step 0. A guided example's completion meets the constraints its guidance names (and
drops the fluff its anti-patterns name): the guidance changes the right answer's likelihood, so
guidance, teachers with privileged context and self-distillation have something to act on.

Guidance texts, as the corpus writes them (controllers should write them the same way; a
criterion is stated with ``guidance_hint(text, weight)``: its text, or "avoid : text" for a
pitfall):

- ``criterion``: hints joined by " ; " (HarnessRL <criterion>; also RISED positive rubrics)
- ``reference``: ``format_reference(good, bad)`` = "good : <response> bad : <response>"
- ``critique``: ``format_critique(hints)`` = "the last answers missed : h1 ; h2"
- ``skills``: an ARISE skill text, e.g. ``constraint_lexicon.SKILL_TEXTS[capability]``
- ``anti_patterns``: items joined by " ; ", each ``anti_pattern_text(text, weight)`` or a fluff
  description ("opening with great question", "claiming all requirements met", …)
- ``coach``: ``format_coach(hints)`` = "remember : h1 ; remember : h2"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.envs.constraint_domain import (
    Constraint,
    ConstraintDomain,
    hard_constraints,
    render_response,
)
from rubric_rl.envs.constraint_lexicon import GUIDANCE_KINDS, SKILL_TEXTS, canonical
from rubric_rl.envs.constraint_spec import guidance_hint

__all__ = [
    "anti_pattern_text",
    "decorate_prompt",
    "format_coach",
    "format_critique",
    "format_reference",
    "guidance_hint",
    "render_guidance",
    "warmstart_corpus",
    "warmstart_example",
]
from rubric_rl.rubrics.types import Task, append_to_last_user

# Share of unguided demonstrations carrying each fluff (praise opener, compliance claim). 0.1, not
# 0.3: an opener at 0.3 (0.15 per phrase) beat the spread-out first body words under greedy
# decoding, so the warm-started policy already opened half its held-out answers with praise
# (measured 2026-11-30). At 0.1 fluff is still sampled in every step's rollouts (the spurious
# criteria separate responses from step 0) but is not the policy's mode.
FLUFF_RATE = 0.1

# Probability that an unguided demonstration meets each stated constraint (config
# ``warmstart.p_keep``). Below 0.5, a violated format falls back to the demonstrator's habit
# (``constraints.HABITS``) more often than the asked one is written, so the warm-started policy's
# greedy answer is the habit until RL teaches it the instruction (0.4: held-out score 47.7 at the
# warm start before warmstart.tie_case, 49.5 with it; 0.5 started at 54.1 with RL's gains mostly
# invisible to greedy decoding; 0.3 started at 45.7 and learned more slowly: +11.5 in 300 steps
# against +11.7 in 200; measured 2026-11-30).
P_KEEP = 0.4

FLUFF_ANTI_PATTERNS = {
    "praise": "opening with great question",
    "claim": "claiming all requirements met",
    "pad": "padding with filler words",
}


def render_guidance(kind: str, text: str | Sequence[str]) -> str:
    """One guidance block, ``<kind> text </kind>``; several texts are joined with " ; "."""
    if kind not in GUIDANCE_KINDS:
        raise ValueError(
            f"render_guidance: unknown guidance kind {kind!r}; known: {GUIDANCE_KINDS}"
        )
    texts = [text] if isinstance(text, str) else list(text)
    body = " ; ".join(canonical(t) for t in texts if t and t.strip())
    if not body:
        raise ValueError(f"render_guidance: guidance {kind!r} has no text")
    return f"<{kind}> {body} </{kind}>"


def decorate_prompt(task: Task, guidance: Mapping[str, str | Sequence[str] | None]) -> list[dict]:
    """The task's chat messages with guidance blocks appended to the last user message.

    ``guidance`` maps kinds of ``GUIDANCE_KINDS`` to a text or a list of texts; empty values are
    skipped. Deterministic: the block order is ``GUIDANCE_KINDS`` whatever the dict's order.
    """
    unknown = sorted(set(guidance) - set(GUIDANCE_KINDS))
    if unknown:
        raise ValueError(
            f"decorate_prompt: unknown guidance kinds {unknown}; known: {GUIDANCE_KINDS}"
        )
    blocks = []
    for kind in GUIDANCE_KINDS:
        value = guidance.get(kind)
        if value is None or (not isinstance(value, str) and not any(v.strip() for v in value)):
            continue
        if isinstance(value, str) and not value.strip():
            continue
        blocks.append(render_guidance(kind, value))
    if not blocks:
        return task.messages
    return append_to_last_user(task.messages, " ".join(blocks), what=f"task {task.id!r}")


def skill_guidance(task: Task) -> list[dict]:
    """The task's prompt with the skill texts of its capabilities (``SKILL_TEXTS``, the wording
    the warm-start corpus teaches and ARISE injects) as one ``skills`` block: the guided arm of
    calibration (rubric_rl/calibration.py). Unchanged when no capability has a text."""
    texts = [SKILL_TEXTS[c] for c in task.capabilities if c in SKILL_TEXTS]
    return decorate_prompt(task, {"skills": texts}) if texts else task.messages


def format_reference(good: str | None = None, bad: str | None = None) -> str:
    """The ``<reference>`` text: a positive and/or a negative response ("good : … bad : …")."""
    parts = ([f"good : {canonical(good)}"] if good else []) + (
        [f"bad : {canonical(bad)}"] if bad else []
    )
    if not parts:
        raise ValueError("format_reference: needs a good or a bad response")
    return " ".join(parts)


def format_critique(missed: Sequence[str]) -> str:
    """The ``<critique>`` text: the hints (``guidance_hint``) the previous group missed."""
    return "the last answers missed : " + " ; ".join(missed)


def format_coach(notes: Sequence[str]) -> str:
    """The ``<coach>`` text (ARISE-RL memory): one "remember : hint" per note."""
    return " ; ".join(f"remember : {n}" for n in notes)


def anti_pattern_text(text: str, weight: float) -> str:
    """A RISED anti-pattern item: a pitfall's text as is, else "breaking the rule : text"."""
    return text if weight < 0 else f"breaking the rule : {text}"


def _guidance_for(
    kind: str,
    task: Task,
    target: list[Constraint],
    fluff: dict[str, bool],
    rng: np.random.Generator,
) -> tuple[str, set[str], set[str], str | None]:
    """(text, constraint kinds it makes the completion meet, fluff it removes, text to copy)."""
    cons = hard_constraints(task)
    kinds = {c.kind for c in target}
    if kind == "criterion":
        return " ; ".join(c.hint for c in target), kinds, set(), None
    if kind == "critique":
        return format_critique([c.hint for c in target]), kinds, set(), None
    if kind == "coach":
        return format_coach([c.hint for c in target]), kinds, set(), None
    if kind == "skills":
        cap = target[0].capability
        return SKILL_TEXTS[cap], {c.kind for c in cons if c.capability == cap}, set(), None
    if kind == "anti_patterns":
        named = {f for f, on in fluff.items() if on}
        items = [FLUFF_ANTI_PATTERNS[f] for f in sorted(named)]
        items += [anti_pattern_text(c.text, c.weight) for c in target]
        return " ; ".join(items), kinds, named, None
    if kind == "reference":
        good = render_response(task, None, rng)
        bad = None
        if rng.random() < 0.5:
            keep = {c.kind for c in cons if rng.random() < 0.5}
            bad = render_response(task, keep, rng, praise=bool(rng.random() < 0.5))
        return format_reference(good, bad), {c.kind for c in cons}, set(fluff), good
    raise ValueError(f"unknown guidance kind {kind!r}")


def warmstart_example(
    task: Task,
    rng: np.random.Generator,
    *,
    guided: bool,
    p_keep: float = P_KEEP,
    fluff_rate: float = FLUFF_RATE,
    pad_rate: float = 0.15,
) -> tuple[list[dict], str, dict[str, str]]:
    """One (messages, completion, guidance) demonstration for ``task``."""
    cons = hard_constraints(task)
    keep = {c.kind for c in cons if not c.rare and rng.random() < p_keep}
    fluff = {
        "praise": bool(rng.random() < fluff_rate),
        "claim": bool(rng.random() < fluff_rate),
        "pad": bool(rng.random() < pad_rate),
    }
    guidance: dict[str, str] = {}
    if guided:
        missed = [c for c in cons if c.kind not in keep] or list(cons)
        n_target = 1 + int(len(missed) > 1 and rng.random() < 0.4)
        target = [missed[i] for i in sorted(rng.permutation(len(missed))[:n_target])]
        n_kinds = 1 + int(rng.random() < 0.3)
        kinds = [GUIDANCE_KINDS[i] for i in rng.permutation(len(GUIDANCE_KINDS))[:n_kinds]]
        copy = None
        for kind in kinds:
            text, meets, drops, good = _guidance_for(kind, task, target, fluff, rng)
            guidance[kind] = text
            keep |= meets
            fluff = {f: on and f not in drops for f, on in fluff.items()}
            copy = good or copy
        if copy is not None:  # a positive reference for this very task: the completion copies it
            return decorate_prompt(task, guidance), copy, guidance
    completion = render_response(task, keep, rng, **fluff)
    return decorate_prompt(task, guidance), completion, guidance


def warmstart_corpus(
    n: int,
    seed: int,
    *,
    guided_fraction: float = 0.4,
    p_keep: float = P_KEEP,
    fluff_rate: float = FLUFF_RATE,
    pad_rate: float = 0.15,
) -> list[tuple[list[dict], str]]:
    """``n`` supervised (messages, completion) pairs over training-split tasks, seeded.

    Unguided demonstrations are imperfect on purpose (see the module docstring); a share
    ``guided_fraction`` carries guidance blocks whose completions follow the guidance.
    """
    if n < 0:
        raise ValueError(f"warmstart_corpus: n must be >= 0, got {n}")
    if not 0.0 <= p_keep <= 1.0:
        raise ValueError(f"warmstart_corpus: p_keep must be in [0, 1], got {p_keep}")
    if not 0.0 <= guided_fraction <= 1.0:
        raise ValueError(
            f"warmstart_corpus: guided_fraction must be in [0, 1], got {guided_fraction}"
        )
    tasks = ConstraintDomain(seed).tasks("train", min(n, 2000))
    out: list[tuple[list[dict], str]] = []
    for i in range(n):
        rng = np.random.default_rng([seed, 7, i])
        messages, completion, _ = warmstart_example(
            tasks[i % len(tasks)],
            rng,
            guided=bool(rng.random() < guided_fraction),
            p_keep=p_keep,
            fluff_rate=fluff_rate,
            pad_rate=pad_rate,
        )
        out.append((messages, completion))
    return out


def guidance_kinds_of(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The guidance kinds mounted on a prompt, in order (for logs and tests)."""
    text = " ".join(m["content"] for m in messages)
    return [k for k in GUIDANCE_KINDS if f"<{k}>" in text]
