"""RG-SED's reward gate and schedules as pure functions (seed 002 §3.2, eq. 11–12; DESIGN §5).

Per group g: ``Δr_g = R̄_memory − R̄_standard`` (eq. 11), the mean reward of the J' memory-augmented
rollouts (measurement only, never trained) minus that of the J standard ones. The SD coefficient
(eq. 12, with the authors' soft gate) is

    λ_g(t) = λ0 · gate(Δr_g) · w(t) · d(t),   λ0 = 0.5, τ = 0.05,

* hard gate ``1[Δr > τ]`` (the seed's eq. 12), or soft ``sigmoid((Δr − τ)/T)``, T = 0.0125 (the
  authors' code, Alibaba-NLP/qqr ``compute_rg_kl_coef``; seed App. D.2 plots it; the default);
  "none" (gate ≡ 1) is the "w/o reward gating" ablation;
* cosine warm-up ``w(t) = ½(1 − cos(π·min(t/W, 1)))``, W = 20, and cosine decay
  ``d(t) = f + (1 − f)·½(1 + cos(π·min(t/D, 1)))``, D = 120, floor f = 0.1 — both on the same step
  counter t, from 0 (as in the authors' code: decay is not delayed by the warm-up): w(0) = 0, w(W)
  = 1, d(0) = 1, d(D) = f, both flat beyond their end. Which counter t is, the seed leaves open:
  ARISE-RL's controller passes the step's offset in its role phase by default (0 at each
  phase's first step, so no SD there) or the training step (``schedule_clock``).

A group whose Δr is undefined (no defined reward on either side, e.g. no memory was written)
gets gate 0 — also under "none": without a measured memory there is nothing to distil.

Mapping onto the trainer (``step.gate``): each trajectory's λ = ``config.loss.sd_coef`` × the
controllers' ``sd_gate(rollouts)`` ``[G]`` multiplier. So λ0 IS ``loss.sd_coef`` (0.5 for
ARISE-RL) and the hook returns ``gate · w · d`` (``sd_gate_multipliers``); a controller holding
full coefficients λ_g converts them with ``coefficients_to_sd_gate(coefs, sd_coef)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LAMBDA0 = 0.5  # ARISE-RL §5.1: λ0 = 0.5 for both roles
TAU = 0.05  # ARISE-RL §5.1: τ = 0.05
TEMPERATURE = 0.0125  # qqr: rg_kl_gate_temperature
WARMUP_STEPS = 20  # qqr: rg_kl_warmup_iters
DECAY_STEPS = 120  # qqr: rg_kl_decay_iters
DECAY_FLOOR = 0.1  # qqr: rg_kl_min_lambda_ratio
GATES = ("soft", "hard", "none")


def _out(x: np.ndarray) -> np.ndarray | float:
    return float(x) if np.ndim(x) == 0 else x


def delta_r(memory_rewards: Any, standard_rewards: Any) -> np.ndarray:
    """Eq. 11 per group: nanmean(memory [G, J']) − nanmean(standard [G, J]) → [G].

    NaN entries are undefined rewards or ragged padding (``Rollouts.rewards`` pads with NaN) and
    are left out of the means; a group with no defined reward on either side gets NaN."""
    mem = np.asarray(memory_rewards, dtype=np.float64)
    std = np.asarray(standard_rewards, dtype=np.float64)
    if mem.ndim != 2 or std.ndim != 2 or mem.shape[0] != std.shape[0]:
        raise ValueError(
            f"delta_r: memory_rewards [G, J'] and standard_rewards [G, J] must share G; got "
            f"{mem.shape} and {std.shape}"
        )
    return _nanmean_rows(mem) - _nanmean_rows(std)


def _nanmean_rows(x: np.ndarray) -> np.ndarray:
    n = (~np.isnan(x)).sum(axis=1)
    total = np.where(np.isnan(x), 0.0, x).sum(axis=1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def hard_gate(dr: Any, tau: float = TAU) -> np.ndarray | float:
    """Eq. 12's gate 1[Δr > τ] (strict: Δr = τ is closed); NaN → 0."""
    dr = np.asarray(dr, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return _out(np.where(np.isnan(dr), 0.0, (dr > tau).astype(np.float64)))


def soft_gate(dr: Any, tau: float = TAU, temperature: float = TEMPERATURE) -> np.ndarray | float:
    """The authors' gate sigmoid((Δr − τ)/T) (→ the hard gate as T → 0); 0.5 at Δr = τ; NaN → 0."""
    if not temperature > 0:
        raise ValueError(f"soft_gate: temperature must be > 0, got {temperature}")
    dr = np.asarray(dr, dtype=np.float64)
    x = (dr - tau) / temperature
    e = np.exp(-np.abs(x))  # never overflows; keeps relative precision in both tails
    g = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return _out(np.where(np.isnan(dr), 0.0, g))


def reward_gate(
    dr: Any, *, gate: str = "soft", tau: float = TAU, temperature: float = TEMPERATURE
) -> np.ndarray | float:
    """The gate named ``gate``: "soft" (default), "hard", or "none" (≡ 1 where Δr is defined: the
    "w/o reward gating" ablation)."""
    if gate == "soft":
        return soft_gate(dr, tau, temperature)
    if gate == "hard":
        return hard_gate(dr, tau)
    if gate == "none":
        dr = np.asarray(dr, dtype=np.float64)
        return _out(np.where(np.isnan(dr), 0.0, 1.0))
    raise ValueError(f"reward_gate: gate must be one of {GATES}, got {gate!r}")


def _check_step(step: int | float, name: str) -> float:
    t = float(step)
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"{name}: step must be finite and >= 0, got {step}")
    return t


def warmup(step: int | float, steps: int = WARMUP_STEPS) -> float:
    """Cosine warm-up w(t) = ½(1 − cos(π·min(t/W, 1))): 0 at t = 0, ½ at W/2, 1 from W on;
    W = 0 → 1."""
    t = _check_step(step, "warmup")
    if steps < 0:
        raise ValueError(f"warmup: steps must be >= 0, got {steps}")
    if steps == 0:
        return 1.0
    return 0.5 * (1.0 - math.cos(math.pi * min(t / steps, 1.0)))


def decay(step: int | float, steps: int = DECAY_STEPS, floor: float = DECAY_FLOOR) -> float:
    """Cosine decay d(t) = f + (1 − f)·½(1 + cos(π·min(t/D, 1))): 1 at t = 0, (1 + f)/2 at D/2,
    f from D on; D = 0 → 1 (no decay)."""
    t = _check_step(step, "decay")
    if steps < 0:
        raise ValueError(f"decay: steps must be >= 0, got {steps}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"decay: floor must be in [0, 1], got {floor}")
    if steps == 0:
        return 1.0
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(t / steps, 1.0)))


def sd_gate_multipliers(
    dr: Any,
    step: int | float,
    *,
    gate: str = "soft",
    tau: float = TAU,
    temperature: float = TEMPERATURE,
    warmup_steps: int = WARMUP_STEPS,
    decay_steps: int = DECAY_STEPS,
    decay_floor: float = DECAY_FLOOR,
) -> np.ndarray:
    """gate(Δr_g) · w(t) · d(t) per group: what ``Controller.sd_gate`` returns ([G], finite,
    ≥ 0); ``step.gate`` multiplies it by ``loss.sd_coef`` = λ0."""
    dr = np.atleast_1d(np.asarray(dr, dtype=np.float64))
    g = np.asarray(reward_gate(dr, gate=gate, tau=tau, temperature=temperature))
    return g * warmup(step, warmup_steps) * decay(step, decay_steps, decay_floor)


def rgsed_coef(
    dr: Any, step: int | float, *, lambda0: float = LAMBDA0, **schedule: Any
) -> np.ndarray:
    """Eq. 12 per group: λ_g = λ0 · gate(Δr_g) · w(t) · d(t) → [G]. ``schedule``: the keyword
    options of ``sd_gate_multipliers`` (gate, tau, temperature, warmup_steps, decay_steps,
    decay_floor)."""
    if not (math.isfinite(lambda0) and lambda0 >= 0):
        raise ValueError(f"rgsed_coef: lambda0 must be finite and >= 0, got {lambda0}")
    return lambda0 * sd_gate_multipliers(dr, step, **schedule)


def coefficients_to_sd_gate(coefs: Any, sd_coef: float) -> np.ndarray:
    """Per-group coefficients λ_g → the ``[G]`` multipliers ``Controller.sd_gate`` returns, so
    that ``step.gate``'s ``loss.sd_coef × multiplier`` gives back λ_g: λ_g / sd_coef."""
    c = np.atleast_1d(np.asarray(coefs, dtype=np.float64))
    if c.ndim != 1 or not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError(f"coefficients_to_sd_gate: coefs must be [G] finite and >= 0, got {c}")
    if not (math.isfinite(sd_coef) and sd_coef > 0):
        raise ValueError(
            f"coefficients_to_sd_gate: loss.sd_coef must be > 0 (it is λ0), got {sd_coef}"
        )
    return c / sd_coef


def gate_regions(dr: Any, tau: float = TAU) -> dict[str, float]:
    """Shares of groups by Δr region (seed §5.3, fig. 5: 72.1 % / 19.6 % / 8.3 %):
    "above" Δr > τ (the gate fires), "within" |Δr| ≤ τ (ambiguous), "below" Δr < −τ (memory
    hurts). The three partition the defined Δr; undefined (NaN) groups are left out of the shares
    and counted in "num_undefined". Shares are NaN when no Δr is defined."""
    dr = np.asarray(dr, dtype=np.float64).ravel()
    defined = dr[~np.isnan(dr)]
    n = defined.size
    counts = {
        "above": int((defined > tau).sum()),
        "within": int((np.abs(defined) <= tau).sum()),
        "below": int((defined < -tau).sum()),
    }
    out = {k: (v / n if n else math.nan) for k, v in counts.items()}
    out["num_undefined"] = float(dr.size - n)
    return out
