"""HarnessRL's rubric interface c_t (§2.1, §2.3): per-task weighted criteria and the rubric
operations create / rewrite / delete / reweight / merge / split.

- Signed weights λ ≠ 0; the reward is the registered ``weighted`` reward,
  r = Σ_m λ_m s_m / Σ_m max(λ_m, 0) (§2.1).
- **Anchors** are seed criteria whose text the memory cold start fixes: the proposer may only
  reweight them (§2.3). Any other operation on an anchor is an ``AnchorError``.
- **Λ rescaling** (§2.3: "Each rubric operation rescales positive weights to total Λ while
  holding anchors at a fixed share"): after an operation the positive weights sum to Λ, the
  anchors' positive weights to ``anchor_share``·Λ (the share they held in the seed rubric, fixed
  at the cold start), the other positives to the rest, each side keeping its internal
  proportions; a negative weight is scaled with its side (anchor or not), so a pitfall keeps its
  size relative to the positives it sits with. When one side has no positive criterion the
  other takes all of Λ. With Λ = 100 (``POINTS_SCALE``), Λ·r̄ is the group's mean score in
  points, the unit of every Δ and acceptance band (§3).
- An operation changes what is checked, not only the text: a rewritten or merged criterion
  must have a different verifier from the one it replaces (a rule criterion another checker or
  other arguments; an LLM criterion another text). A criterion's ``origin`` records the
  operation that made it and ``parent_id`` the criterion it came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rubric_rl.rubrics.types import Criterion, VerifierKind

OPS = ("create", "rewrite", "delete", "reweight", "merge", "split")


class AnchorError(ValueError):
    """An operation other than reweight was applied to an anchor criterion."""


@dataclasses.dataclass(frozen=True)
class RubricOp:
    """One typed rubric operation.

    ``targets``: the ids it acts on (none for create; one for rewrite / delete / reweight /
    split; two or more for merge). ``new``: the criteria it adds (one for create / rewrite /
    merge; two or more for split). ``weight``: the new signed weight of a reweight.
    """

    op: str
    targets: tuple[str, ...] = ()
    new: tuple[Criterion, ...] = ()
    weight: float | None = None
    reason: str = ""

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))
        object.__setattr__(self, "new", tuple(self.new))
        want = {
            "create": (0, 0, 1, 1),
            "rewrite": (1, 1, 1, 1),
            "delete": (1, 1, 0, 0),
            "reweight": (1, 1, 0, 0),
            "merge": (2, None, 1, 1),
            "split": (1, 1, 2, None),
        }
        if self.op not in want:
            raise ValueError(f"rubric op {self.op!r}: expected one of {OPS}")
        t_lo, t_hi, n_lo, n_hi = want[self.op]
        nt, nn = len(self.targets), len(self.new)
        if nt < t_lo or (t_hi is not None and nt > t_hi):
            raise ValueError(f"rubric op {self.op}: {nt} targets {self.targets}")
        if nn < n_lo or (n_hi is not None and nn > n_hi):
            raise ValueError(f"rubric op {self.op}: {nn} new criteria")
        if self.op == "reweight":
            w = self.weight
            if w is None or float(w) == 0.0 or float(w) != float(w):
                raise ValueError(f"rubric op reweight of {self.targets}: weight must be non-zero")
        elif self.weight is not None:
            raise ValueError(f"rubric op {self.op} takes no weight")

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "targets": list(self.targets),
            "new": [criterion_json(c) for c in self.new],
            "weight": self.weight,
            "reason": self.reason,
        }


def criterion_json(c: Criterion) -> dict:
    v = c.verifier
    return {
        "id": c.id,
        "text": c.text,
        "weight": c.weight,
        "anchor": c.anchor,
        "origin": c.origin,
        "parent_id": c.parent_id,
        "verifier": {"kind": str(v.kind), "checker": v.checker, "args": _plain(v.kwargs)},
    }


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return [_plain(v) for v in x]
    return x


def checks_the_same(a: Criterion, b: Criterion) -> bool:
    """Whether two criteria check the same thing: the same rule checker with the same arguments,
    or LLM criteria with the same text and sign."""
    if a.verifier.kind != b.verifier.kind:
        return False
    if a.verifier.kind == VerifierKind.RULE:
        return a.verifier == b.verifier and (a.weight > 0) == (b.weight > 0)
    return a.text.strip() == b.text.strip() and (a.weight > 0) == (b.weight > 0)


def anchor_share_of(criteria: Sequence[Criterion]) -> float:
    """The anchors' share of the positive weight (fixed at the cold start from the seed)."""
    pos = sum(c.weight for c in criteria if c.weight > 0)
    anc = sum(c.weight for c in criteria if c.weight > 0 and c.anchor)
    return anc / pos if pos > 0 else 0.0


def rescale(
    criteria: Sequence[Criterion], *, total: float, anchor_share: float
) -> tuple[Criterion, ...]:
    """Positive weights to ``total`` (Λ) with anchors at ``anchor_share`` (module docstring)."""
    if total <= 0:
        raise ValueError(f"rescale: total (Λ) must be > 0, got {total}")
    if not 0.0 <= anchor_share <= 1.0:
        raise ValueError(f"rescale: anchor_share must lie in [0, 1], got {anchor_share}")
    pos_a = sum(c.weight for c in criteria if c.weight > 0 and c.anchor)
    pos_o = sum(c.weight for c in criteria if c.weight > 0 and not c.anchor)
    if pos_a <= 0 and pos_o <= 0:
        raise ValueError("rescale: the rubric has no positive criterion (Σ max(λ, 0) = 0)")
    share_a = anchor_share if pos_o > 0 else 1.0
    share_a = share_a if pos_a > 0 else 0.0
    f_a = share_a * total / pos_a if pos_a > 0 else 1.0
    f_o = (1.0 - share_a) * total / pos_o if pos_o > 0 else 1.0
    if pos_a > 0 and pos_o > 0 and (f_a <= 0 or f_o <= 0):
        raise ValueError(
            f"rescale: anchor_share {anchor_share} leaves one side of the rubric with no weight"
        )
    return tuple(c.replace(weight=c.weight * (f_a if c.anchor else f_o)) for c in criteria)


def apply_ops(
    criteria: Sequence[Criterion],
    ops: Sequence[RubricOp],
    *,
    step: int,
    total: float,
    anchor_share: float,
) -> tuple[Criterion, ...]:
    """The rubric after ``ops`` (in order), rescaled (module docstring). Raises on an op that
    targets an unknown criterion, touches an anchor other than by reweight, adds a duplicate
    id, or rewrites / merges into a criterion that checks the same thing."""
    crits = list(criteria)
    for op in ops:
        ids = [c.id for c in crits]
        for t in op.targets:
            if t not in ids:
                raise KeyError(f"rubric op {op.op}: no criterion {t!r} (ids: {ids})")
        targets = [crits[ids.index(t)] for t in op.targets]
        if op.op != "reweight":
            for c in targets:
                if c.anchor:
                    raise AnchorError(
                        f"rubric op {op.op} on anchor criterion {c.id!r}: anchors may only be "
                        "reweighted"
                    )
        for n in op.new:
            if n.anchor:
                raise AnchorError(
                    f"rubric op {op.op}: a new criterion ({n.id!r}) cannot be an anchor"
                )
        kept_ids = set(ids) - set(op.targets)
        new_ids = [n.id for n in op.new]
        clash = sorted((set(new_ids) & kept_ids) | {i for i in new_ids if new_ids.count(i) > 1})
        if clash:
            raise ValueError(f"rubric op {op.op}: criterion ids {clash} already in the rubric")
        if op.op in ("rewrite", "merge"):
            for old in targets:
                if checks_the_same(old, op.new[0]):
                    raise ValueError(
                        f"rubric op {op.op} of {old.id!r}: the new criterion checks the same "
                        "thing (same verifier); a rewrite must change what is checked"
                    )
        if op.op == "split":
            for n in op.new:
                if checks_the_same(targets[0], n):
                    raise ValueError(
                        f"rubric op split of {targets[0].id!r}: part {n.id!r} checks the same "
                        "thing as the whole"
                    )
        stamped = tuple(
            n.replace(
                origin=op.op,
                created_step=int(step),
                parent_id=n.parent_id or (op.targets[0] if op.targets else None),
            )
            for n in op.new
        )
        if op.op == "create":
            crits.append(stamped[0])
        elif op.op == "reweight":
            i = ids.index(op.targets[0])
            crits[i] = crits[i].replace(weight=float(op.weight))
        else:
            first = min(ids.index(t) for t in op.targets)
            rest = [c for c in crits if c.id not in op.targets]
            before = sum(1 for c in crits[:first] if c.id not in op.targets)
            crits = rest[:before] + list(stamped) + rest[before:]
    return rescale(crits, total=total, anchor_share=anchor_share)


def signed_weight_changes(
    before: Sequence[Criterion], after: Sequence[Criterion]
) -> dict[str, tuple[float | None, float | None]]:
    """``{id: (weight before, weight after)}`` for criteria added, removed or reweighted."""
    b = {c.id: c.weight for c in before}
    a = {c.id: c.weight for c in after}
    return {
        i: (b.get(i), a.get(i))
        for i in sorted(set(a) | set(b))
        if b.get(i) is None or a.get(i) is None or abs(a[i] - b[i]) > 1e-12
    }


__all__ = [
    "OPS",
    "AnchorError",
    "RubricOp",
    "anchor_share_of",
    "apply_ops",
    "checks_the_same",
    "criterion_json",
    "rescale",
    "signed_weight_changes",
]
