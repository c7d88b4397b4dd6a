"""Rank and linear correlations over the positions both sides define (shared by the analyses:
EvoRubric's leave-one-out consensus, RISED's transfer analysis)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["pearson", "ranks", "spearman"]


def ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), as Spearman's ρ needs."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="mergesort")
    out = np.empty(len(x), np.float64)
    out[order] = np.arange(len(x), dtype=np.float64)
    for v in np.unique(x):
        tie = x == v
        out[tie] = out[tie].mean()
    return out


def _defined(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray] | None:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(
            f"correlation: expected two vectors of one length, got {a.shape}, {b.shape}"
        )
    ok = ~(np.isnan(a) | np.isnan(b))
    a, b = a[ok], b[ok]
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    return a, b


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's ρ over the positions both define; None when either side is constant or
    fewer than two positions are defined."""
    ab = _defined(a, b)
    if ab is None:
        return None
    return float(np.corrcoef(ranks(ab[0]), ranks(ab[1]))[0, 1])


def pearson(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Pearson's r over the positions both define; None as for :func:`spearman`."""
    ab = _defined(a, b)
    if ab is None:
        return None
    return float(np.corrcoef(ab[0], ab[1])[0, 1])
