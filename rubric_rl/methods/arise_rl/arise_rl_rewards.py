"""ARISE-RL rewards as pure functions (seed 002 §3.1, eq. 1–8), and the baselines' proposer rewards.

Generator: ``R_G = R_tool · R_fmt · (1 + R_diff)`` (eq. 1) with the binary gates R_tool (a real tool
observation before the final answer, eq. 2) and R_fmt (a non-empty question and a non-empty rubric
list, eq. 3), and the difficulty shape ``R_diff = 2·max(0, 1 − |c − K/2| / (K/2))`` (eq. 5) over
``c = #{i ≤ K : r_i ≥ γ}`` solver successes (eq. 4), K = 8, γ = 0.9 (seed §5.1).

Ablation switches (seed Table 2): ``tool_grounding=False`` makes R_tool ≡ 1 ("w/o tool-grounded
rubric"); ``difficulty=False`` sets R_diff := 0 ("w/o difficulty-shaped reward").

Baselines (``notes/baselines.md`` §6): the shapes that replace R_diff (``DIFFICULTY_SHAPES``:
"arise_rl", "absolute_zero", "dr_zero") and the baselines' own composite proposer rewards
(``absolute_zero_proposer_reward``, ``dr_zero_proposer_reward``).

Solver: ``r = α s + (1 − α)·1[s = 1]`` (eq. 8), α = 0.8, with s the WEIGHTED satisfaction rate
(ours: the seed's eq. 7 is the unweighted mean, which it equals for equal |weights|):
``s = Σ_j |λ_j| z_j / Σ_j |λ_j|`` over valid verdicts, z_j = 1 when criterion j is satisfied — a
positive criterion met, a pitfall (λ < 0) NOT met. This is the satisfied-criteria convention of the
registered "arise_rl_solver" / "mean" rewards (``rubric_rl/rubrics/rewards.py``), weighted. Why
|λ| and not HarnessRL's ``Σ λ met / Σ max(λ, 0)`` ("weighted"): that ratio goes below 0 when a
pitfall is met, while eq. 8 needs s ∈ [0, 1] and 1[s = 1] = "every criterion satisfied"; with |λ|
both hold and a pitfall's weight still sets how much breaking it costs. A failed verdict (NaN /
None) leaves numerator and denominator (DESIGN §5); nothing valid → NaN, never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from rubric_rl.rubrics.rewards import ARISE_ALPHA
from rubric_rl.util.registry import Registry

K_ATTEMPTS = 8  # ARISE-RL §5.1: K = 8 solver rollouts per generated query
SUCCESS_THRESHOLD = 0.9  # ARISE-RL §5.1: γ = 0.9

# --- generator gates (eq. 2–3) -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GeneratorOutcome:
    """What the R_fmt and R_tool gates read from one generator trajectory, whatever the domain.

    Attributes:
      question: the parsed question text ("" when none was found).
      num_criteria: parsed rubric items (0 when the list is missing, empty or unparseable).
      tool_observed: a real tool observation came before the final answer (``tool_observed``).
      reason: the parser's reason for rejecting the task (e.g. "no_rubric_tag", "bad_criterion"),
        None when it parsed. Counted in metrics, never raised.
    """

    question: str
    num_criteria: int
    tool_observed: bool
    reason: str | None = None

    def __post_init__(self):
        if not isinstance(self.question, str):
            raise TypeError(f"GeneratorOutcome.question must be a str, got {self.question!r}")
        if isinstance(self.num_criteria, bool) or int(self.num_criteria) != self.num_criteria:
            raise TypeError(
                f"GeneratorOutcome.num_criteria must be an int, got {self.num_criteria!r}"
            )
        if self.num_criteria < 0:
            raise ValueError(f"GeneratorOutcome.num_criteria must be >= 0, got {self.num_criteria}")
        if self.reason is not None and not (isinstance(self.reason, str) and self.reason):
            raise ValueError(
                f"GeneratorOutcome.reason must be None or non-empty, got {self.reason!r}"
            )
        object.__setattr__(self, "tool_observed", bool(self.tool_observed))

    @property
    def fmt_reason(self) -> str | None:
        """Why R_fmt = 0: the parser's reason, else "empty_question" / "empty_rubric".

        None: R_fmt = 1."""
        if self.reason is not None:
            return self.reason
        if not self.question.strip():
            return "empty_question"
        if self.num_criteria == 0:
            return "empty_rubric"
        return None

    @property
    def parseable(self) -> bool:
        return self.fmt_reason is None


class _ToolRecordLike(Protocol):
    turn: int
    name: str | None
    ok: bool


def tool_observed(
    records: Iterable[_ToolRecordLike],
    *,
    final_turn: int | None = None,
    tools: Iterable[str] | None = None,
) -> bool:
    """ARISE-RL eq. 2's event 𝒯(ξ): some tool call returned a real observation (``ok``; a rejected
    call's error text is not an observation) in a turn before ``final_turn`` (the turn holding the
    final answer; None: any turn). ``tools`` restricts which tool names count (e.g. the ones the
    rubric's criteria depend on). Takes ``envs.trajectory.ToolRecord``s or anything shaped so."""
    allowed = None if tools is None else set(tools)
    return any(
        r.ok
        and (final_turn is None or r.turn < final_turn)
        and (allowed is None or r.name in allowed)
        for r in records
    )


def r_fmt(outcome: GeneratorOutcome) -> float:
    """ARISE-RL eq. 3: 1[q ≠ ∅ ∧ ρ is a non-empty list]."""
    return 1.0 if outcome.parseable else 0.0


def r_tool(outcome: GeneratorOutcome | bool, *, tool_grounding: bool = True) -> float:
    """ARISE-RL eq. 2: 1[𝒯(ξ)]; ``tool_grounding=False`` is the "w/o tool grounding" ablation
    (R_tool ≡ 1). Takes a ``GeneratorOutcome`` or the bare flag."""
    if not tool_grounding:
        return 1.0
    seen = outcome.tool_observed if isinstance(outcome, GeneratorOutcome) else outcome
    if not isinstance(seen, bool | np.bool_):
        raise TypeError(f"r_tool: expected a GeneratorOutcome or a bool, got {type(seen).__name__}")
    return 1.0 if seen else 0.0


# --- difficulty (eq. 4–5) and the baselines' shapes ---------------------------------------------


def solver_successes(scores: Any, gamma: float = SUCCESS_THRESHOLD) -> np.ndarray | int:
    """ARISE-RL eq. 4: c = #{i : r_i^S ≥ γ} over the last axis (the K attempts).

    An undefined solver reward (NaN: every verdict failed) is not a success (ours: the authors'
    code is silent on it); it still counts in K. Returns an int for a 1-D input."""
    r = np.asarray(scores, dtype=np.float64)
    if r.ndim == 0:
        raise ValueError("solver_successes: scores must have a K axis (last), got a scalar")
    with np.errstate(invalid="ignore"):
        c = (r >= gamma).sum(axis=-1)
    return int(c) if r.ndim == 1 else c


def _check_counts(c: Any, k: int, name: str) -> np.ndarray:
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"{name}: K must be a positive integer, got {k!r}")
    c = np.asarray(c, dtype=np.float64)
    if np.any(np.isnan(c)) or np.any(c < 0) or np.any(c > k) or np.any(c != np.round(c)):
        raise ValueError(f"{name}: c must be integers in [0, K={k}], got {c}")
    return c


def _out(x: np.ndarray) -> np.ndarray | float:
    return float(x) if x.ndim == 0 else x


def r_diff(c: Any, k: int = K_ATTEMPTS) -> np.ndarray | float:
    """ARISE-RL eq. 5: R_diff = 2·max(0, 1 − |c − K/2| / (K/2)); 2 at c = K/2, 0 at c ∈ {0, K}."""
    c = _check_counts(c, k, "r_diff")
    half = k / 2.0
    return _out(2.0 * np.maximum(0.0, 1.0 - np.abs(c - half) / half))


def absolute_zero_learnability(c: Any, k: int = K_ATTEMPTS) -> np.ndarray | float:
    """Absolute Zero's proposer learnability (baselines.md §6.2 [CODE]): r = 1 − r̄ if 0 < r̄ < 1,
    else 0, with r̄ = c / K the thresholded success rate (§6.3 [INFERRED]: same c as ARISE-RL;
    AZR itself averages binary solver correctness over n = 8 samples)."""
    c = _check_counts(c, k, "absolute_zero_learnability")
    mean = c / k
    return _out(np.where((c > 0) & (c < k), 1.0 - mean, 0.0))


def dr_zero_difficulty(c: Any, k: int = K_ATTEMPTS) -> np.ndarray | float:
    """Dr. Zero's difficulty score (baselines.md §6.1 [CODE]): (K − c)/(K − 1) if 0 < c < K, else
    0 (highest when exactly one attempt succeeds). Dr. Zero uses n = 5 exact-match attempts; here
    c and K are ARISE-RL's (§6.3 [INFERRED]). K = 1 has no interior: always 0."""
    c = _check_counts(c, k, "dr_zero_difficulty")
    denom = max(k - 1, 1)
    return _out(np.where((c > 0) & (c < k), (k - c) / denom, 0.0))


# Shapes that take R_diff's place in R_G (the proposer-reward baselines, "in place of R_diff").
DIFFICULTY_SHAPES: Registry[Callable[..., np.ndarray | float]] = Registry("difficulty shape")
DIFFICULTY_SHAPES.register("arise_rl")(r_diff)
DIFFICULTY_SHAPES.register("absolute_zero")(absolute_zero_learnability)
DIFFICULTY_SHAPES.register("dr_zero")(dr_zero_difficulty)


def r_generator(
    r_tool: Any, r_fmt: Any, r_diff: Any, *, difficulty: bool = True
) -> np.ndarray | float:
    """ARISE-RL eq. 1: R_G = R_tool · R_fmt · (1 + R_diff) ∈ {0} ∪ [1, 3].

    ``difficulty=False`` is the "w/o difficulty shaping" ablation (R_diff := 0, so R_G is the
    product of the gates). Vectorised over arrays of equal (broadcastable) shape."""
    gates = np.asarray(r_tool, dtype=np.float64) * np.asarray(r_fmt, dtype=np.float64)
    shaped = np.asarray(r_diff, dtype=np.float64) if difficulty else 0.0
    return _out(np.asarray(gates * (1.0 + shaped)))


def generator_reward(
    outcome: GeneratorOutcome,
    solver_scores: Any | None,
    *,
    gamma: float = SUCCESS_THRESHOLD,
    shape: str = "arise_rl",
    tool_grounding: bool = True,
    difficulty: bool = True,
) -> float:
    """R_G of one generated task from its parse outcome and its K solver rewards (``[K]``).

    The solver is only run on a parseable task: ``solver_scores`` may be None when R_fmt = 0 (or
    when ``difficulty=False``). ``shape`` names the ``DIFFICULTY_SHAPES`` entry in R_diff's
    place."""
    gates = r_tool(outcome, tool_grounding=tool_grounding) * r_fmt(outcome)
    if gates == 0.0 or not difficulty:
        return float(r_generator(gates, 1.0, 0.0))
    if solver_scores is None:
        raise ValueError("generator_reward: a parseable task needs its K solver scores")
    scores = np.asarray(solver_scores, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"generator_reward: solver_scores must be [K], got shape {scores.shape}")
    c = solver_successes(scores, gamma)
    return float(r_generator(gates, 1.0, DIFFICULTY_SHAPES.get(shape)(c, scores.size)))


# --- the baselines' own composite proposer rewards -----------------------------------------------


def absolute_zero_proposer_reward(
    formatted: bool, valid: bool, c: int, k: int = K_ATTEMPTS
) -> float:
    """Absolute Zero's format-aware proposer reward (baselines.md §6.2 [CODE + SUMMARY]):
    learnability if well formatted and the task is valid, −0.5 if formatted but invalid, −1 on a
    format error. For a rubric generator (§6.3 [INFERRED]) "formatted" = the output parses and
    "valid" = R_fmt (non-empty question and rubric list); the mapping is ours."""
    if not formatted:
        return -1.0
    if not valid:
        return -0.5
    return float(absolute_zero_learnability(c, k))


def dr_zero_format_score(integrity: bool, think: float, tool: float, answer: float) -> float:
    """Dr. Zero's format score (baselines.md §6.1 [CODE]): f = (1 + think + tool + ans)/4 when the
    integrity check holds, else 0; each term in [0, 1]."""
    for name, v in (("think", think), ("tool", tool), ("answer", answer)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"dr_zero_format_score: {name} must be in [0, 1], got {v}")
    return (1.0 + think + tool + answer) / 4.0 if integrity else 0.0


def dr_zero_proposer_reward(format_score: float, c: int, k: int = K_ATTEMPTS) -> float:
    """Dr. Zero's proposer reward (baselines.md §6.1 [CODE]): R = 0.5·f + difficulty, the
    difficulty computed only when f > 0 (else the solver is not run)."""
    if not 0.0 <= format_score <= 1.0:
        raise ValueError(
            f"dr_zero_proposer_reward: format_score must be in [0, 1], got {format_score}"
        )
    if format_score == 0.0:
        return 0.0
    return 0.5 * format_score + float(dr_zero_difficulty(c, k))


# --- solver reward (eq. 6–8, weighted) -----------------------------------------------------------


def _satisfaction_parts(weights: Any, met: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Σ|λ| z, Σ|λ|, any valid criterion unsatisfied) over the last axis; NaN met = failed."""
    w = np.asarray(weights, dtype=np.float64)
    m = np.asarray(met, dtype=np.float64)
    if m.ndim == 0:
        raise ValueError("solver_reward: met must have a criteria axis (last), got a scalar")
    w, m = np.broadcast_arrays(w, m)
    valid = ~np.isnan(m) & (w != 0.0)  # weight 0 = a padding slot
    if np.any(valid & (m != 0.0) & (m != 1.0)):
        raise ValueError("solver_reward: met must hold 0, 1 or NaN (a failed verdict)")
    sat = np.where(w > 0, m, 1.0 - m)  # a pitfall is satisfied when its bad behaviour is absent
    mag = np.where(valid, np.abs(w), 0.0)
    num = (mag * np.where(valid, sat, 0.0)).sum(axis=-1)
    den = mag.sum(axis=-1)
    missed = (valid & (sat == 0.0)).any(axis=-1)
    return num, den, missed


def _weighted_s(weights: Any, met: Any) -> tuple[np.ndarray, np.ndarray]:
    """(s, any valid criterion unsatisfied); s is NaN where no verdict is valid."""
    num, den, missed = _satisfaction_parts(weights, met)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return s, missed


def weighted_satisfaction(weights: Any, met: Any) -> np.ndarray | float:
    """s = Σ_j |λ_j| z_j / Σ_j |λ_j| over valid verdicts (module docstring); NaN when nothing is
    valid. ``met`` [..., M]: 1 met, 0 not met (for a pitfall: the bad behaviour present / absent),
    NaN a failed verdict; ``weights`` broadcast against it (0 = padding)."""
    return _out(_weighted_s(weights, met)[0])


def solver_reward(weights: Any, met: Any, alpha: float = ARISE_ALPHA) -> np.ndarray | float:
    """ARISE-RL eq. 8 on the weighted s: r = α s + (1 − α)·1[s = 1], α = 0.8; NaN when every
    verdict failed. 1[s = 1] is "no valid criterion unsatisfied", exact (no float comparison).
    Agrees with ``batch_rewards("arise_rl_solver", scores, weighted=True)``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"solver_reward: alpha must be in [0, 1], got {alpha}")
    s, missed = _weighted_s(weights, met)
    return _out(np.where(np.isnan(s), np.nan, alpha * s + (1.0 - alpha) * ~missed))
