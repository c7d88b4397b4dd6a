"""Non-finite updates: which of a step's updates had a NaN/inf loss or gradient norm, and the
streak of such steps that stops a run (``train.max_nonfinite_skips``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

# The quantities of an update that make it non-finite (the jitted step skips on either).
NONFINITE_CHECKED = (("loss", "loss"), ("grad_norm", "gradient norm"))


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps with a NaN/inf loss or gradient norm."""


def nonfinite_updates(per_update: Sequence[Mapping[str, Any]]) -> list[str]:
    """One description per update whose loss or gradient norm is NaN/inf, naming the non-finite
    quantities and quoting the others: ``update 2 of 2: gradient norm inf (loss 0.0123)``."""
    out = []
    for i, u in enumerate(per_update):
        values = {name: float(u[k]) for k, name in NONFINITE_CHECKED if k in u}
        bad = [f"{n} {v}" for n, v in values.items() if not math.isfinite(v)]
        if bad:
            good = [f"{n} {v:.6g}" for n, v in values.items() if math.isfinite(v)]
            rest = f" ({', '.join(good)})" if good else ""
            out.append(f"update {i + 1} of {len(per_update)}: {', '.join(bad)}{rest}")
    return out


def check_streak(step: int, streak: int, described: Sequence[str], limit: int) -> None:
    """After step ``step``, ``streak`` steps in a row had a non-finite update (``described``:
    the last step's, from ``nonfinite_updates``): a warning, and ``NonFiniteLossError`` once the
    streak reaches ``limit`` (``train.max_nonfinite_skips``; 0: the updates were applied)."""
    if streak == 0:
        return
    what = "; ".join(described)
    done = "skipped" if limit > 0 else "APPLIED (train.max_nonfinite_skips = 0)"
    logging.warning("step %d, non-finite %s: %s (%d steps in a row)", step, what, done, streak)
    if streak >= limit:
        raise NonFiniteLossError(
            f"{streak} consecutive steps with a non-finite update (last: step {step}, {what}); "
            f"stopping (train.max_nonfinite_skips = {limit})"
        )
