"""HarnessRL's just-in-time critic (§1, §2.3, §3): accept a candidate only after measuring its
effect on the current frozen policy, in reward points (Λ·r̄ with Λ = 100).

- **Rollout update** (guidance add/drop): re-sample the task's group with the candidate guidance
  on the current policy; Δ = its mean reward − the recorded group's, both under the task's
  current rubric. Accepted when lower ≤ Δ ≤ upper (the rollout band). A candidate that only
  drops fields is accepted when Δ ≥ −lower: reward stays within tolerance without them (§4: the
  harness "withdraws [a field] … once the target criterion leaves blind and reward stays within
  tolerance without it").
- **Paired rule** (ours, ``harness.measurement = "paired"``, the default): the candidate's
  group and the task's current-harness group (unguided for a first field) are both re-sampled,
  ``J'`` samples each on shared seeds; Δ = the candidate's mean − the current one's. Accepted
  when threshold < Δ ≤ upper, the threshold calibrated for 5 % false acceptance and the lower
  bound the effect accepted with 80 % power (``cold_start.paired_band``). ``"unpaired"`` keeps
  the seed's rule above (one re-sampled group against the recorded one, lower ≤ Δ ≤ upper).
- **Rubric update**: re-grade the recorded group under the candidate rubric (unchanged criteria
  are verdict-cache hits); accepted when lower ≤ |Δ| ≤ upper (the rubric band): the update must
  change the reward measurably, and not by more than a group's own spread.
- **Sampling update**: accepted on its attribution (§2.3: no measurement is described).
- A call that returns no measurement (None / NaN: every reward undefined, a failed component)
  rejects (§3 "The critic rejects a candidate update when its call returns no measurement").
"""

from __future__ import annotations

import dataclasses
import math

# The seed's bands (§3), in points, used until a cold start calibrates them.
SEED_ROLLOUT_BAND = (10.2, 28.0)
SEED_RUBRIC_BAND = (3.1, 28.0)


@dataclasses.dataclass(frozen=True)
class Band:
    """An acceptance band on a group-average reward change, in points."""

    lower: float
    upper: float

    def __post_init__(self):
        lo, hi = float(self.lower), float(self.upper)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0 or hi < lo:
            raise ValueError(
                f"acceptance band [{self.lower}, {self.upper}]: need 0 ≤ lower ≤ upper"
            )
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)


@dataclasses.dataclass(frozen=True)
class Verdict:
    accepted: bool
    delta: float | None  # points; None = no measurement
    reason: str

    def to_json(self) -> dict:
        return {"accepted": self.accepted, "delta": self.delta, "reason": self.reason}


def _measured(delta: float | None) -> bool:
    return delta is not None and math.isfinite(float(delta))


def _in_band(x: float, delta: float, band: Band, name: str, which: str) -> Verdict:
    lo, hi = band.lower, band.upper
    if x < lo:
        return Verdict(
            False, delta, f"{name} {x:+.1f} below the {which} band's lower bound {lo:.1f}"
        )
    if x > hi:
        return Verdict(
            False, delta, f"{name} {x:+.1f} above the {which} band's upper bound {hi:.1f}"
        )
    return Verdict(True, delta, f"{name} {x:+.1f} within [{lo:.1f}, {hi:.1f}]")


def rollout_verdict(
    delta: float | None, band: Band, *, drop_only: bool = False, threshold: float | None = None
) -> Verdict:
    """The rollout band's decision on a re-sampled group's Δ (points); ``threshold`` (the
    paired rule): accepted when threshold < Δ ≤ upper."""
    if not _measured(delta):
        return Verdict(False, None, "no measurement")
    d = float(delta)
    if drop_only:
        ok = d >= -band.lower
        why = f"drop: Δ {d:+.1f} {'≥' if ok else '<'} −{band.lower:.1f}"
        return Verdict(ok, d, why)
    if threshold is None:
        return _in_band(d, d, band, "Δ", "rollout")
    t = float(threshold)
    if d <= t:
        return Verdict(False, d, f"paired Δ {d:+.1f} not above the threshold {t:.1f}")
    if d > band.upper:
        return Verdict(
            False, d, f"paired Δ {d:+.1f} above the rollout band's upper bound {band.upper:.1f}"
        )
    return Verdict(True, d, f"paired Δ {d:+.1f} within ({t:.1f}, {band.upper:.1f}]")


def rubric_verdict(delta: float | None, band: Band) -> Verdict:
    """The rubric band's decision on a re-graded group's Δ (points): |Δ| within the band."""
    if not _measured(delta):
        return Verdict(False, None, "no measurement")
    d = float(delta)
    return _in_band(abs(d), d, band, "|Δ|", "rubric")


__all__ = [
    "SEED_ROLLOUT_BAND",
    "SEED_RUBRIC_BAND",
    "Band",
    "Verdict",
    "rollout_verdict",
    "rubric_verdict",
]
