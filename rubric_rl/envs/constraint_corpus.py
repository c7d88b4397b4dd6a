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
    HABITS,
    Constraint,
    ConstraintDomain,
    render_response,
    task_requirements,
)
from rubric_rl.envs.constraint_lexicon import (
    CASES,
    CATEGORIES,
    GUIDANCE_KINDS,
    PROMPT_TEMPLATES,
    PUNCTUATION,
    SKILL_TEXTS,
    apply_case,
    canonical,
)
from rubric_rl.envs.constraint_spec import IMPLICIT_KINDS, guidance_hint, pick

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
from rubric_rl.rubrics.types import Task, append_to_last_user, append_to_system

# Share of unguided demonstrations carrying each fluff (praise opener, compliance claim). 0.1, not
# 0.3: an opener at 0.3 (0.15 per phrase) beat the spread-out first body words under greedy
# decoding, so the warm-started policy already opened half its held-out answers with praise
# (measured). At 0.1 fluff is still sampled in every step's rollouts (the spurious
# criteria separate responses from step 0) but is not the policy's mode.
FLUFF_RATE = 0.1

# Probability that an unguided demonstration meets each stated constraint (config
# ``warmstart.p_keep``). Below 0.5, a violated format falls back to the demonstrator's habit
# (``constraints.HABITS``) more often than the asked one is written, so the warm-started policy's
# greedy answer is the habit until RL teaches it the instruction (0.4: held-out score 47.7 at the
# warm start before warmstart.tie_case, 49.5 with it; 0.5 started at 54.1 with RL's gains mostly
# invisible to greedy decoding; 0.3 started at 45.7 and learned more slowly: +11.5 in 300 steps
# against +11.7 in 200; measured).
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


def decorate_prompt(
    task: Task,
    guidance: Mapping[str, str | Sequence[str] | None],
    *,
    placement: str = "last_user",
) -> list[dict]:
    """The task's chat messages with guidance blocks appended to the last user message
    (``placement="system"``: to the system message, as a teacher's context may be placed).

    ``guidance`` maps kinds of ``GUIDANCE_KINDS`` to a text or a list of texts; empty values are
    skipped. Deterministic: the block order is ``GUIDANCE_KINDS`` whatever the dict's order.
    """
    if placement not in ("last_user", "system"):
        raise ValueError(
            f"decorate_prompt: placement must be last_user or system, got {placement!r}"
        )
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
    if placement == "system":
        return append_to_system(task.messages, " ".join(blocks))
    return append_to_last_user(task.messages, " ".join(blocks), what=f"task {task.id!r}")


def skill_guidance(task: Task) -> list[dict]:
    """The task's prompt with the skill texts of its capabilities (``SKILL_TEXTS``, the wording
    the warm-start corpus teaches and ARISE injects) as one ``skills`` block: the guided arm of
    calibration (rubric_rl/pre_rl/calibration.py). Unchanged when no capability has a text."""
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


# ARISE's refined skills (controllers/reflection.py writes the same strings): level 1 cites the
# failing criterion after the capability's skill, level 2 also leads with it.
MISSED_PREFIX = "the last answers missed :"
REMEMBER_PREFIX = "remember :"


def refined_skill(base: str, hint: str, level: int) -> str:
    """An ARISE skill rewritten ``level`` times (0 = the base text) citing ``hint``."""
    if level == 0:
        return base
    if level == 1:
        return f"{base} ; {MISSED_PREFIX} {hint}"
    if level == 2:
        return f"{REMEMBER_PREFIX} {hint} ; {base} ; {MISSED_PREFIX} {hint}"
    raise ValueError(f"refined_skill: level must be 0, 1 or 2, got {level}")


# How many guidance blocks a guided demonstration carries (HarnessRL mounts up to three fields)
# and how many skills a skills block holds (ARISE shows every active pair's skill for the task).
N_BLOCKS_P = (0.55, 0.3, 0.15)
N_SKILLS_P = (0.5, 0.3, 0.2)
SKILL_LEVEL_P = (0.5, 0.3, 0.2)  # base, refined once, refined twice
# Share of guided demonstrations whose guidance sits in a system message (where self-distillation
# teachers may place privileged context: step.with_context's "system" placement).
SYSTEM_PLACEMENT_RATE = 0.1
# Share of list / word demonstrations that repeat an item (the implicit "distinct" requirement
# broken): the habit a small policy drifts into under a rubric that accepts repeats.
REPEAT_RATE = 0.3


def _skills(
    task: Task, target: list[Constraint], rng: np.random.Generator
) -> tuple[list[str], set[str]]:
    """(an ARISE skills block's texts, the requirement kinds following it meets): skills of up to
    three of the task's capabilities, the targets' first, each as its base text or refined (citing
    a requirement of that capability). A skill makes every stated constraint of its capability
    met; a refined one also the requirement it cites."""
    reqs = task_requirements(task)
    caps = list(dict.fromkeys([c.capability for c in target] + list(task.capabilities)))
    caps = [c for c in caps if c in SKILL_TEXTS]
    n = min(len(caps), 1 + int(rng.choice(3, p=N_SKILLS_P)))
    chosen = caps[:1] + [caps[1:][i] for i in rng.permutation(len(caps) - 1)[: n - 1]]
    texts, meets = [], set()
    for cap in chosen:
        own = [c for c in reqs if c.capability == cap]
        meets |= {c.kind for c in own if c.kind not in IMPLICIT_KINDS}
        level = int(rng.choice(3, p=SKILL_LEVEL_P))
        cited = next((c for c in target if c.capability == cap), None) or pick(rng, own)
        if level:
            meets.add(cited.kind)
        texts.append(refined_skill(SKILL_TEXTS[cap], cited.hint, level))
    return texts, meets


def _guidance_for(
    kind: str,
    task: Task,
    target: list[Constraint],
    fluff: dict[str, bool],
    rng: np.random.Generator,
) -> tuple[str | list[str], set[str], set[str], str | None]:
    """(text, requirement kinds it makes the completion meet, fluff it removes, text to copy).
    Guidance naming the implicit ``plain`` removes every fluff; anti-patterns remove the fluff
    they name."""
    kinds = {c.kind for c in target}
    every = set(fluff) if "plain" in kinds else set()
    if kind == "criterion":
        return " ; ".join(c.hint for c in target), kinds, every, None
    if kind == "critique":
        return format_critique([c.hint for c in target]), kinds, every, None
    if kind == "coach":
        return format_coach([c.hint for c in target]), kinds, every, None
    if kind == "skills":
        texts, meets = _skills(task, target, rng)
        return texts, meets, set(fluff) if "plain" in meets else set(), None
    if kind == "anti_patterns":
        named = {f for f, on in fluff.items() if on}
        items = [FLUFF_ANTI_PATTERNS[f] for f in sorted(named)]
        items += [anti_pattern_text(c.text, c.weight) for c in target]
        return " ; ".join(items), kinds, named | every, None
    if kind == "reference":
        reqs = task_requirements(task)
        good = render_response(task, None, rng)
        bad = None
        if rng.random() < 0.5:
            keep = {c.kind for c in reqs if rng.random() < 0.5}
            bad = render_response(task, keep, rng, praise=bool(rng.random() < 0.5))
        return format_reference(good, bad), {c.kind for c in reqs}, set(fluff), good
    raise ValueError(f"unknown guidance kind {kind!r}")


def _met(c: Constraint, keep: set[str], fluff: Mapping[str, bool]) -> bool:
    return not any(fluff.values()) if c.kind == "plain" else c.kind in keep


def warmstart_example(
    task: Task,
    rng: np.random.Generator,
    *,
    guided: bool,
    p_keep: float = P_KEEP,
    fluff_rate: float = FLUFF_RATE,
    pad_rate: float = 0.15,
    repeat_rate: float = REPEAT_RATE,
) -> tuple[list[dict], str, dict[str, Any]]:
    """One (messages, completion, guidance) demonstration for ``task``.

    Unguided, each stated constraint is met with probability ``p_keep`` (never a rare include
    word), items repeat with probability ``repeat_rate`` and each fluff appears at its rate. Guided,
    1-3 guidance blocks (``N_BLOCKS_P``) target 1-2 requirements the unguided draw missed, and the
    completion meets what they name; a ``reference``'s good answer is copied."""
    reqs = task_requirements(task)
    keep = {
        c.kind
        for c in reqs
        if c.kind not in IMPLICIT_KINDS and not c.rare and rng.random() < p_keep
    }
    if rng.random() >= repeat_rate:
        keep.add("distinct")
    fluff = {
        "praise": bool(rng.random() < fluff_rate),
        "claim": bool(rng.random() < fluff_rate),
        "pad": bool(rng.random() < pad_rate),
    }
    guidance: dict[str, Any] = {}
    if not guided:
        return task.messages, render_response(task, keep, rng, **fluff), guidance
    missed = [c for c in reqs if not _met(c, keep, fluff)] or list(reqs)
    n_target = 1 + int(len(missed) > 1 and rng.random() < 0.4)
    target = [missed[i] for i in sorted(rng.permutation(len(missed))[:n_target])]
    n_kinds = 1 + int(rng.choice(3, p=N_BLOCKS_P))
    kinds = [GUIDANCE_KINDS[i] for i in rng.permutation(len(GUIDANCE_KINDS))[:n_kinds]]
    copy = None
    for kind in kinds:
        text, meets, drops, good = _guidance_for(kind, task, target, fluff, rng)
        guidance[kind] = text
        keep |= meets
        fluff = {f: on and f not in drops for f, on in fluff.items()}
        copy = good or copy
    placement = "system" if rng.random() < SYSTEM_PLACEMENT_RATE else "last_user"
    messages = decorate_prompt(task, guidance, placement=placement)
    if copy is not None:  # a positive reference for this very task: the completion copies it
        return messages, copy, guidance
    return messages, render_response(task, keep, rng, **fluff), guidance


def copy_example(rng: np.random.Generator) -> tuple[list[dict], str]:
    """A copy demonstration: "rewrite : w1 … wk" (2-6 common words, sometimes with a case or an
    end-mark clause) answered with the same words. Not a task of the domain: it stands in for
    what a pretrained model brings, the ability to copy from its prompt,
    which rewrite sequences, include / start / exclude words need."""
    pool = [w for cat in CATEGORIES for w in CATEGORIES[cat]["common"]]
    words = [str(w) for w in rng.permutation(pool)[: int(rng.integers(2, 7))]]
    p: dict[str, Any] = {"case": None, "end": None}
    if rng.random() < 0.3:
        p["case"] = pick(rng, CASES)
    if rng.random() < 0.3:
        p["end"] = pick(rng, PUNCTUATION)
    prompt = PROMPT_TEMPLATES["rewrite"].format(words=" ".join(words))
    for key in ("end", "case"):
        if p[key]:
            clause = PROMPT_TEMPLATES[f"case_{p[key]}" if key == "case" else "end"]
            prompt += " . " + clause.format(punct=p[key])
    mode = p["case"] or HABITS["case"]
    completion = [apply_case(w, mode) for w in words] + [p["end"] or HABITS["end"]]
    return [{"role": "user", "content": canonical(prompt)}], " ".join(completion)


def copy_corpus(n: int, seed: int) -> list[tuple[list[dict], str]]:
    """``n`` copy demonstrations (``copy_example``), seeded."""
    return [copy_example(np.random.default_rng([seed, 9, i])) for i in range(n)]


def warmstart_corpus(
    n: int,
    seed: int,
    *,
    guided_fraction: float = 0.4,
    p_keep: float = P_KEEP,
    fluff_rate: float = FLUFF_RATE,
    pad_rate: float = 0.15,
    repeat_rate: float = REPEAT_RATE,
    copy_fraction: float = 0.0,
) -> list[tuple[list[dict], str]]:
    """``n`` supervised (messages, completion) pairs over training-split tasks, seeded.

    Unguided demonstrations are imperfect on purpose (see the module docstring); a share
    ``guided_fraction`` carries guidance blocks whose completions follow the guidance; a share
    ``copy_fraction`` are copy demonstrations (``copy_example``) instead of task ones.
    """
    if n < 0:
        raise ValueError(f"warmstart_corpus: n must be >= 0, got {n}")
    if not 0.0 <= p_keep <= 1.0:
        raise ValueError(f"warmstart_corpus: p_keep must be in [0, 1], got {p_keep}")
    if not 0.0 <= guided_fraction <= 1.0:
        raise ValueError(
            f"warmstart_corpus: guided_fraction must be in [0, 1], got {guided_fraction}"
        )
    if not 0.0 <= copy_fraction <= 1.0:
        raise ValueError(f"warmstart_corpus: copy_fraction must be in [0, 1], got {copy_fraction}")
    tasks = ConstraintDomain(seed).tasks("train", min(n, 2000))
    out: list[tuple[list[dict], str]] = []
    for i in range(n):
        rng = np.random.default_rng([seed, 7, i])
        if copy_fraction and np.random.default_rng([seed, 8, i]).random() < copy_fraction:
            out.append(copy_example(rng))
            continue
        messages, completion, _ = warmstart_example(
            tasks[i % len(tasks)],
            rng,
            guided=bool(rng.random() < guided_fraction),
            p_keep=p_keep,
            fluff_rate=fluff_rate,
            pad_rate=pad_rate,
            repeat_rate=repeat_rate,
        )
        out.append((messages, completion))
    return out


def guidance_kinds_of(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The guidance kinds mounted on a prompt, in order (for logs and tests)."""
    text = " ".join(m["content"] for m in messages)
    return [k for k in GUIDANCE_KINDS if f"<{k}>" in text]
