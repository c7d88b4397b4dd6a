"""RISED's behaviour analyses (seed §5 Fig. 4, C.4 Fig. 7) from a run directory.

The RISED controller writes ``controllers/rised/behaviours.jsonl``: per step and environment,
the share of that step's (successfully tagged) rollouts that show each rubric. From it:

- :func:`behaviour_frequencies`: ``{env: {rubric: (steps, shares)}}`` — a rubric absent from a
  step's row of an environment that had rollouts that step counts as share 0 there;
- :func:`half_life`: the first step at which an undesired behaviour's rate, smoothed over a
  trailing window, falls to half its initial level (seed Fig. 7 marks these steps). Ours, since
  the seed does not define the smoothing: the initial level is the mean share over the first
  ``window`` logged steps, the rate at step s the mean over the ``window`` logged steps ending at
  s; None when it never falls that far or the initial level is 0;
- :func:`half_lives`: every negative rubric of a vocabulary per environment.

The transfer analysis (single-environment training, rubric-profile vs gradient similarity as
predictors of the most improved environment) is ``rubric_rl/methods/rised/rised_transfer.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import numpy as np

from rubric_rl.analysis import read_jsonl

BEHAVIOURS_FILE = os.path.join("controllers", "rised", "behaviours.jsonl")


def behaviour_frequencies(run_dir: str) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """``{env: {rubric: (steps, shares)}}`` from a RISED run's behaviours file (module doc)."""
    path = os.path.join(run_dir, BEHAVIOURS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path}: no RISED behaviours file (a run of configs/rised.py writes it)"
        )
    rows = read_jsonl(path)
    by_env: dict[str, dict[int, Mapping[str, float]]] = {}
    for i, r in enumerate(rows):
        for field in ("env", "step", "freq", "rollouts"):
            if field not in r:
                raise ValueError(f"{path}: row {i + 1} has no field {field!r}")
        if int(r["rollouts"]) > 0:
            by_env.setdefault(str(r["env"]), {})[int(r["step"])] = r["freq"]
    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for env, per_step in by_env.items():
        steps = np.array(sorted(per_step), dtype=np.int64)
        names = sorted({n for f in per_step.values() for n in f})
        out[env] = {
            n: (steps, np.array([float(per_step[s].get(n, 0.0)) for s in steps])) for n in names
        }
    return out


def half_life(steps: np.ndarray, shares: np.ndarray, window: int = 5) -> int | None:
    """The first step at which the trailing-``window`` mean of ``shares`` is at most half the
    mean of the first ``window`` values (module doc); None if never, or if that is 0."""
    steps = np.asarray(steps)
    shares = np.asarray(shares, dtype=np.float64)
    if steps.shape != shares.shape or steps.ndim != 1:
        raise ValueError(f"half_life: steps {steps.shape} and shares {shares.shape} must match")
    if window < 1:
        raise ValueError(f"half_life: window must be >= 1, got {window}")
    if len(shares) < window:
        return None
    initial = float(np.mean(shares[:window]))
    if initial <= 0:
        return None
    for i in range(window - 1, len(shares)):
        if float(np.mean(shares[i - window + 1 : i + 1])) <= initial / 2:
            return int(steps[i])
    return None


def half_lives(
    freqs: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]],
    negatives: Iterable[str],
    window: int = 5,
) -> dict[str, dict[str, int | None]]:
    """``{env: {rubric: half-life step or None}}`` for the ``negatives`` each env showed."""
    neg = set(negatives)
    return {
        env: {n: half_life(*series, window=window) for n, series in sorted(per.items()) if n in neg}
        for env, per in sorted(freqs.items())
    }


__all__ = ["BEHAVIOURS_FILE", "behaviour_frequencies", "half_life", "half_lives"]
