"""HarnessRL's sampling and rollout interfaces (§2.1, §2.3).

**Sampling** p_t: task weights w_i ∈ {1, γ₁, γ₂, γ₃} (``levels``, non-increasing, > 0); the
operation ``reweight(i, γ_ℓ)`` lowers a task one level. A step draws its tasks from
Cat(p), p_i = w_i / Σ_ℓ w_ℓ, with replacement (prioritised replay, Schaul et al. 2016, which §2.1
cites), and each draw carries u = 1 / (N p_i), so a task's expected contribution is the uniform
one and reweighting changes only how often it is drawn.

**Rollout guidance** g_t ⊆ {<criterion>, <reference>, <critique>}, mounted after the prompt in
that order (rendered by the domain: ``constraint_corpus.decorate_prompt`` for the embedded one).
Per task, at most ``guidance_cap(step, total)`` fields: 3 in the first quarter of training, then
one fewer each quarter, 0 in the last (§2.3 "a per-task cap that falls by one each training
quarter"; §2.1 "a schedule removes remaining fields by training's end"). When the cap falls below
a task's mounted fields, the fields last in index order go first (ours: the seed does not say
which). Evaluation never mounts guidance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

GUIDANCE_FIELDS = ("criterion", "reference", "critique")
# The seed's cold-start values (§3), used until a cold start calibrates them.
SEED_LEVELS = (1.0, 0.61, 0.38, 0.17)


def validate_levels(levels: Sequence[float], what: str = "harness.levels") -> tuple[float, ...]:
    lv = tuple(float(x) for x in levels)
    if len(lv) < 2 or lv[0] != 1.0:
        raise ValueError(f"{what}={lv}: expected (1, γ₁, γ₂, …) starting at w₀ = 1")
    if any(x <= 0 for x in lv) or any(b > a for a, b in zip(lv, lv[1:], strict=False)):
        raise ValueError(f"{what}={lv}: levels must be > 0 and non-increasing (1 ≥ γ₁ ≥ γ₂ ≥ γ₃)")
    return lv


def task_probabilities(level_index: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """p_i = w_i / Σ w over the task bank, w_i = levels[level_index[i]]."""
    w = np.asarray(levels, np.float64)[np.asarray(level_index, np.int64)]
    return w / w.sum()


def draw_tasks(
    level_index: np.ndarray, levels: Sequence[float], size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``size`` task indices drawn from Cat(p) with replacement, and their u = 1 / (N p_i)."""
    p = task_probabilities(level_index, levels)
    idx = rng.choice(len(p), size=int(size), p=p)
    return idx, 1.0 / (len(p) * p[idx])  # HarnessRL §2.1: u = 1 / (N p_i)


def guidance_cap(step: int, total_steps: int, max_fields: int = len(GUIDANCE_FIELDS)) -> int:
    """Fields a task may carry at ``step`` (1-based) of ``total_steps``: ``max_fields`` in the
    first quarter, one fewer each quarter, 0 in the last (3 → 2 → 1 → 0)."""
    if total_steps < 1:
        raise ValueError(f"guidance_cap: total_steps={total_steps} must be >= 1")
    quarter = min(3, max(0, (int(step) - 1) * 4 // int(total_steps)))
    return max(0, min(max_fields, 3 - quarter))


def ordered_fields(fields: Mapping[str, str] | Sequence[str]) -> tuple[str, ...]:
    """Field names in mounting order; an unknown field is an error."""
    names = list(fields)
    bad = [f for f in names if f not in GUIDANCE_FIELDS]
    if bad:
        raise ValueError(f"guidance fields {bad}: expected a subset of {GUIDANCE_FIELDS}")
    return tuple(f for f in GUIDANCE_FIELDS if f in names)


def enforce_cap(fields: Mapping[str, str], cap: int) -> tuple[dict[str, str], tuple[str, ...]]:
    """The fields kept under ``cap`` (the first in mounting order) and those dropped."""
    order = ordered_fields(fields)
    keep, drop = order[: max(0, int(cap))], order[max(0, int(cap)) :]
    return {f: fields[f] for f in keep}, drop


__all__ = [
    "GUIDANCE_FIELDS",
    "SEED_LEVELS",
    "draw_tasks",
    "enforce_cap",
    "guidance_cap",
    "ordered_fields",
    "task_probabilities",
    "validate_levels",
]
