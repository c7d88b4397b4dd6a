"""Packing judge verdicts into dense ``[groups, criteria, J]`` arrays (numpy).

A batch holds G groups (one task each) of J responses. Groups may have different numbers of
criteria, so criteria are padded to ``C_max``; a padding slot has weight 0 and is never valid.
A judge failure (``Verdict.met is None``) is a real criterion with ``valid=False``: it is excluded
from every reward and counted, never scored as 0 (DESIGN.md §5).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rubric_rl.rubrics.types import Criterion, Rubric, Verdict

# What a judge produced for one (response, criterion): a Verdict, or its bare ``met``.
VerdictLike = Verdict | bool | None


@dataclasses.dataclass(frozen=True, eq=False)
class ScoreMatrices:
    """Verdicts of G groups × J responses on up to C_max criteria per group.

    Attributes:
      met: [G, C_max, J] float, 1.0 where the criterion is met (for a pitfall: the bad behaviour
        is present), else 0.0; 0.0 wherever ``valid`` is False.
      valid: [G, C_max, J] bool, False for judge failures and for padding criteria.
      weights: [G, C_max] float, the signed weights λ; 0.0 for padding criteria.
      criterion_ids: per group, the ids of its real criteria in column order.
    """

    met: np.ndarray
    valid: np.ndarray
    weights: np.ndarray
    criterion_ids: tuple[tuple[str, ...], ...]

    def __post_init__(self):
        met, valid, weights = (np.asarray(a) for a in (self.met, self.valid, self.weights))
        if met.ndim != 3 or valid.shape != met.shape:
            raise ValueError(
                f"met/valid must be [G, C, J] of equal shape: {met.shape} {valid.shape}"
            )
        if weights.shape != met.shape[:2]:
            raise ValueError(f"weights must be [G, C]={met.shape[:2]}, got {weights.shape}")
        if len(self.criterion_ids) != met.shape[0]:
            raise ValueError(
                f"criterion_ids has {len(self.criterion_ids)} groups, met has {met.shape[0]}"
            )
        for g, ids in enumerate(self.criterion_ids):
            if len(ids) > met.shape[1] or np.any(weights[g, len(ids) :] != 0):
                raise ValueError(f"group {g}: {len(ids)} ids but padding slots carry weight")
        for name, arr in (("met", met), ("valid", valid), ("weights", weights)):
            arr = arr.copy()
            arr.flags.writeable = False  # frozen means frozen: callers cannot mutate a shared batch
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "criterion_ids", tuple(tuple(ids) for ids in self.criterion_ids))

    @property
    def num_groups(self) -> int:
        return self.met.shape[0]

    @property
    def max_criteria(self) -> int:
        return self.met.shape[1]

    @property
    def group_size(self) -> int:
        return self.met.shape[2]

    @property
    def criterion_mask(self) -> np.ndarray:
        """[G, C_max] bool: True for real criteria, False for padding."""
        mask = np.zeros(self.weights.shape, dtype=bool)
        for g, ids in enumerate(self.criterion_ids):
            mask[g, : len(ids)] = True
        return mask

    @property
    def failed(self) -> np.ndarray:
        """[G, C_max, J] bool: real criteria whose judge failed."""
        return self.criterion_mask[:, :, None] & ~self.valid

    @property
    def num_failed(self) -> np.ndarray:
        """[G, J] int: judge failures per response."""
        return self.failed.sum(axis=1)

    @property
    def num_valid(self) -> np.ndarray:
        """[G, J] int: valid verdicts per response."""
        return self.valid.sum(axis=1)

    @property
    def failure_rate(self) -> float:
        """Fraction of real (criterion, response) verdicts that failed; 0.0 for an empty batch."""
        total = int(self.criterion_mask.sum()) * self.group_size
        return float(self.failed.sum()) / total if total else 0.0


def verdict_met(v: VerdictLike, where: str = "verdict") -> bool | None:
    """``met`` of a Verdict or a bare bool/None; anything else (e.g. 0/1) is a TypeError."""
    if isinstance(v, Verdict):
        return v.met
    if v is None or isinstance(v, bool):
        return v
    raise TypeError(f"{where}: expected a Verdict, bool or None, got {type(v).__name__}")


def pack_verdicts(
    groups: Sequence[Sequence[Mapping[str, VerdictLike]]],
    criteria: Sequence[Sequence[Criterion] | Rubric],
    *,
    allow_missing: bool = False,
    dtype: np.dtype | type = np.float32,
) -> ScoreMatrices:
    """Packs ``groups[g][j][criterion_id] -> verdict`` into a ``ScoreMatrices``.

    Args:
      groups: over G, over J responses, a mapping criterion id -> Verdict (or bool / None).
      criteria: over G, the criteria (or Rubric) of that group; counts may differ across groups.
      allow_missing: a criterion with no verdict is then a judge failure (invalid). By default a
        missing verdict is an error: judges report failures as ``met=None``, so a missing entry
        is a bug upstream, not a failure to absorb.
      dtype: float dtype of ``met`` and ``weights``.

    Raises:
      ValueError: group counts differ, J differs across groups, a verdict names a criterion that
        is not in its group, or (unless allow_missing) a verdict is missing.
    """
    if len(groups) != len(criteria):
        raise ValueError(f"{len(groups)} verdict groups but {len(criteria)} criteria groups")
    crit_lists = [tuple(c) for c in criteria]
    group_sizes = {len(g) for g in groups}
    if len(group_sizes) > 1:
        raise ValueError(f"every group needs the same number of responses J, got {group_sizes}")
    num_groups = len(groups)
    group_size = group_sizes.pop() if group_sizes else 0
    max_criteria = max((len(c) for c in crit_lists), default=0)

    met = np.zeros((num_groups, max_criteria, group_size), dtype=dtype)
    valid = np.zeros((num_groups, max_criteria, group_size), dtype=bool)
    weights = np.zeros((num_groups, max_criteria), dtype=dtype)
    for g, (responses, crits) in enumerate(zip(groups, crit_lists)):
        ids = [c.id for c in crits]
        index = {cid: i for i, cid in enumerate(ids)}
        weights[g, : len(crits)] = [c.weight for c in crits]
        for j, verdicts in enumerate(responses):
            unknown = sorted(set(verdicts) - set(index))
            if unknown:
                raise ValueError(f"group {g} response {j}: verdicts for unknown criteria {unknown}")
            for cid, i in index.items():
                if cid not in verdicts:
                    if allow_missing:
                        continue
                    raise ValueError(f"group {g} response {j}: no verdict for criterion {cid!r}")
                v = verdicts[cid]
                if isinstance(v, Verdict) and v.criterion_id != cid:
                    raise ValueError(
                        f"group {g} response {j}: key {cid!r} holds a verdict for "
                        f"{v.criterion_id!r}"
                    )
                m = verdict_met(v, f"group {g} response {j} criterion {cid!r}")
                if m is not None:
                    valid[g, i, j] = True
                    met[g, i, j] = float(m)
    return ScoreMatrices(met, valid, weights, tuple(tuple(c.id for c in cs) for cs in crit_lists))


def unpack_verdicts(scores: ScoreMatrices) -> list[list[dict[str, bool | None]]]:
    """Inverse of packing, at the level of ``met``: ``[g][j][criterion_id] -> bool | None``."""
    out: list[list[dict[str, bool | None]]] = []
    for g, ids in enumerate(scores.criterion_ids):
        group = []
        for j in range(scores.group_size):
            group.append(
                {
                    cid: (bool(scores.met[g, i, j]) if scores.valid[g, i, j] else None)
                    for i, cid in enumerate(ids)
                }
            )
        out.append(group)
    return out


def failure_counts(scores: ScoreMatrices) -> dict[str, float]:
    """Judge-failure metrics for logging: totals, the rate, and per-criterion maxima."""
    failed = scores.failed
    per_criterion = failed.sum(axis=2)  # [G, C]
    return {
        "judge/failed": int(failed.sum()),
        "judge/verdicts": int(scores.criterion_mask.sum()) * scores.group_size,
        "judge/failure_rate": scores.failure_rate,
        "judge/responses_with_failure": int((scores.num_failed > 0).sum()),
        "judge/criteria_all_failed": int(
            (scores.criterion_mask & (per_criterion == scores.group_size)).sum()
        )
        if scores.group_size
        else 0,
    }
