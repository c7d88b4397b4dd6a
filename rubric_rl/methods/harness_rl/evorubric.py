"""EvoRubric-style rubric rule (Guan et al., arXiv 2605.29847): prune zero-variance criteria and
regenerate verified ones — the rubric-side baseline and HarnessRL's ``c_t ← EvoRubric``
switching arm (``harness.rubric_rule = "evorubric"``).

**An approximation** (``../shared/notes/baselines.md`` §3): EvoRubric's code, its generator
reward, meta-verifier prompt and leave-one-out rule are not public; what follows is the
abstract's pipeline with our choices, applied at every draw of a task, with no attributor,
proposer or critic:

1. **Zero-variance pruning** — a criterion whose defined verdicts are identical across the
   task's current rollout group (at least two defined) carries no within-group signal and is
   deleted. Ours: anchor criteria (stated requirements, ``harness.anchors``) are kept, as the
   baselines note suggests ("keep anchor or seed criteria"), and so is the last positive
   criterion.
2. **Regeneration** — candidates are the task's checker-library criteria its rubric lacks
   (the same source as HarnessRL's ``create``; a library criterion is checkable by
   construction, which stands in for the meta-verifier, ours). Each is judged on the recorded
   group and kept only if (a) its verdicts vary within the group and (b) leave-one-out
   consensus: the Spearman correlation of its satisfied vector with the weighted reward of the
   rest of the rubric is > 0 (undefined when that reward is constant: then kept on (a) alone,
   ours). At most ``max_new`` (1, ours) per draw, the first in library order.
3. A new criterion weighs the task's median positive weight (EvoRubric adds "unit" weight;
   ours, so that it counts like the task's other criteria), then the Λ rescaling of the
   harness rubric applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rubric_rl.analysis.stats import spearman  # re-exported (moved to rubric_rl/analysis/stats.py)
from rubric_rl.methods.harness_rl.proposer import Candidate
from rubric_rl.methods.harness_rl.rubric_ops import RubricOp, checks_the_same
from rubric_rl.rubrics.types import Criterion, Task

RULE = "evorubric"


def zero_variance(met_row: Sequence[float]) -> bool:
    """Identical defined verdicts across the group (at least two defined)."""
    x = np.asarray(met_row, np.float64)
    x = x[~np.isnan(x)]
    return x.size >= 2 and bool(np.all(x == x[0]))


def prune_ops(criteria: Sequence[Criterion], met: np.ndarray, ids: Sequence[str]) -> list[RubricOp]:
    """Deletes of the non-anchor criteria with zero variance on the group (``met`` [K, J] in
    ``ids`` order), keeping at least one positive criterion."""
    row = {cid: met[k] for k, cid in enumerate(ids)}
    positives = sum(1 for c in criteria if c.weight > 0)
    ops = []
    for c in criteria:
        if c.anchor or c.id not in row or not zero_variance(row[c.id]):
            continue
        if c.weight > 0:
            if positives <= 1:
                continue
            positives -= 1
        ops.append(RubricOp("delete", (c.id,), reason="evorubric: zero variance on the group"))
    return ops


def regenerate(
    task: Task,
    criteria: Sequence[Criterion],
    rest_reward: Sequence[float],
    library: Callable[[Task], Sequence[Criterion]] | None,
    judge_new: Callable[[Sequence[Criterion]], np.ndarray],
    *,
    max_new: int = 1,
) -> list[tuple[Criterion, float | None]]:
    """The library criteria the rubric lacks that pass (a) within-group variance and (b) the
    leave-one-out consensus with ``rest_reward`` (the kept rubric's reward per rollout), with
    their ρ, at most ``max_new``. ``judge_new(crits)`` -> their met matrix [n, J] on the group."""
    if library is None or max_new < 1:
        return []
    fresh = [
        c.replace(id=f"evo:{c.id}", tags=(), origin="evorubric")
        for c in library(task)
        if c.weight > 0 and not any(checks_the_same(c, x) for x in criteria)
    ]
    if not fresh:
        return []
    met = np.asarray(judge_new(fresh), np.float64).reshape(len(fresh), -1)
    out = []
    for c, row in zip(fresh, met, strict=True):
        if zero_variance(row) or np.all(np.isnan(row)):
            continue
        rho = spearman(row, rest_reward)
        if rho is not None and rho <= 0:
            continue
        out.append((c, rho))
        if len(out) >= max_new:
            break
    return out


def candidate(
    task: Task,
    criteria: Sequence[Criterion],
    prune: Sequence[RubricOp],
    new: Sequence[tuple[Criterion, float | None]],
) -> Candidate | None:
    """The step's rubric update for one task (None: nothing to prune or add)."""
    pos = sorted(c.weight for c in criteria if c.weight > 0)
    weight = pos[len(pos) // 2] if pos else 1.0
    ops = list(prune)
    for c, rho in new:
        why = "evorubric: varies on the group" + (f", LOO rho {rho:.2f}" if rho is not None else "")
        ops.append(RubricOp("create", (), (c.replace(weight=weight),), reason=why))
    if not ops:
        return None
    first = ops[0]
    target = first.targets[0] if first.targets else first.new[0].id
    return Candidate("rubric", task.id, RULE, target, rubric=tuple(ops))


__all__ = ["RULE", "candidate", "prune_ops", "regenerate", "spearman", "zero_variance"]
