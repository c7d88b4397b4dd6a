"""HarnessRL's per-task state and the small conversions the controller shares: criteria to and
from their JSON records, rewards in points, and the guidance fields after a candidate."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.methods.harness_rl.proposer import Candidate, criterion_state
from rubric_rl.rubrics.rewards import weighted_reward
from rubric_rl.rubrics.types import Criterion, Verifier


@dataclasses.dataclass
class TaskHarness:
    """One task's harness state."""

    criteria: tuple[Criterion, ...]
    anchor_share: float
    level: int = 0
    fields: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    draws: int = 0
    # The rubric the current step's group was judged on (not checkpointed: analysis only).
    criteria_before_step: tuple[Criterion, ...] = ()


def criterion_from_json(d: Mapping[str, Any]) -> Criterion:
    v = d["verifier"]
    verifier = (
        Verifier.rule(v["checker"], **_freeze(v["args"])) if v["kind"] == "rule" else Verifier()
    )
    return Criterion(
        id=d["id"], text=d["text"], weight=float(d["weight"]), verifier=verifier,
        anchor=bool(d["anchor"]), origin=d.get("origin", "seed"), parent_id=d.get("parent_id"),
    )  # fmt: skip


def _freeze(x):
    if isinstance(x, dict):
        return {k: _freeze(v) for k, v in x.items()}
    if isinstance(x, list):
        return tuple(_freeze(v) for v in x)
    return x


def mean_points(rewards: Sequence[float]) -> float | None:
    """Λ·r̄ (Λ = 100) over the defined rewards; None when none is defined."""
    r = np.asarray([x for x in rewards if x is not None], np.float64)
    r = r[~np.isnan(r)]
    return float(100.0 * r.mean()) if len(r) else None


def check_key(c: Criterion) -> str:
    """What a criterion checks, as a string key (its verifier, or its text for an LLM one)."""
    v = c.verifier
    return json.dumps(
        [str(v.kind), v.checker, repr(v.args), c.text if not v.checker else "", c.weight > 0]
    )


def same_state(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Two recorded criterion states are the same: both absent, or the same check and sign with
    weights within 5 % (weights drift with every Λ rescaling)."""
    if a is None or b is None:
        return a is None and b is None
    ca, cb = criterion_from_json(a), criterion_from_json(b)
    if criterion_state(ca) != criterion_state(cb):
        return False
    return abs(ca.weight - cb.weight) <= 0.05 * max(abs(ca.weight), abs(cb.weight))


def met_matrix(crits: Sequence[Criterion], rows) -> np.ndarray:
    """[K, J] met (NaN for a failed verdict) from ``verdicts[j][k]``."""
    return np.array(
        [
            [np.nan if row[k].met is None else float(row[k].met) for row in rows]
            for k in range(len(crits))
        ],
        float,
    ).reshape(len(crits), len(rows))


def row_reward(crits: Sequence[Criterion], row) -> float:
    """One response's weighted reward from its verdicts (NaN when undefined)."""
    r = weighted_reward(crits, {c.id: v for c, v in zip(crits, row, strict=True)}).value
    return float("nan") if r is None else float(r)


def fields_after(fields: Mapping[str, Any], c: Candidate, step: int | None = None) -> dict:
    out = {k: dict(v) for k, v in fields.items()}
    for g in c.guidance:
        if g.op == "drop":
            out.pop(g.field, None)
        else:
            out[g.field] = {"text": g.text, "target": g.target, "donor": g.donor, "step": step}
    return out


__all__ = [
    "TaskHarness",
    "check_key",
    "criterion_from_json",
    "fields_after",
    "mean_points",
    "met_matrix",
    "row_reward",
    "same_state",
]
