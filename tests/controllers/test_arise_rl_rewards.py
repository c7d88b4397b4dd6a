"""ARISE-RL rewards (seed 002 eq. 1–8) and the baselines' proposer rewards against hand values,
and the weighted solver reward against a plain-loop reference and the registered reward."""

import math

import numpy as np
import pytest

from rubric_rl.envs.trajectory import ToolRecord
from rubric_rl.methods.arise_rl import arise_rl_rewards as ar
from rubric_rl.methods.arise_rl.arise_rl_rewards import (
    DIFFICULTY_SHAPES,
    GeneratorOutcome,
    absolute_zero_learnability,
    absolute_zero_proposer_reward,
    dr_zero_difficulty,
    dr_zero_format_score,
    dr_zero_proposer_reward,
    generator_reward,
    r_diff,
    r_fmt,
    r_generator,
    r_tool,
    solver_reward,
    solver_successes,
    tool_observed,
    weighted_satisfaction,
)
from rubric_rl.rubrics.rewards import batch_rewards, rubric_reward
from rubric_rl.rubrics.scores import pack_verdicts
from rubric_rl.rubrics.types import Criterion

NAN = math.nan
# λ = (3, 2, -4, 1): Σ|λ| = 10.
WEIGHTS = [3.0, 2.0, -4.0, 1.0]
CRITS = [Criterion(f"c{i}", "x", weight=w) for i, w in enumerate(WEIGHTS)]


def test_defaults_are_the_seeds():
    assert (ar.K_ATTEMPTS, ar.SUCCESS_THRESHOLD, ar.ARISE_ALPHA) == (8, 0.9, 0.8)


# --- R_fmt / R_tool ------------------------------------------------------------------------------


def test_r_fmt_and_reasons():
    ok = GeneratorOutcome("which fruits are red ?", 3, tool_observed=True)
    assert ok.parseable and ok.fmt_reason is None and r_fmt(ok) == 1.0
    cases = [
        (GeneratorOutcome("", 3, True), "empty_question"),
        (GeneratorOutcome("  \n", 3, True), "empty_question"),
        (GeneratorOutcome("a question", 0, True), "empty_rubric"),
        (GeneratorOutcome("a question", 2, True, reason="no_rubric_tag"), "no_rubric_tag"),
    ]
    for outcome, reason in cases:
        assert r_fmt(outcome) == 0.0 and outcome.fmt_reason == reason and not outcome.parseable
    with pytest.raises(ValueError, match="num_criteria"):
        GeneratorOutcome("q", -1, True)
    with pytest.raises(TypeError, match="num_criteria"):
        GeneratorOutcome("q", 1.5, True)
    with pytest.raises(ValueError, match="reason"):
        GeneratorOutcome("q", 1, True, reason="")


def test_r_tool_and_the_tool_grounding_switch():
    seen = GeneratorOutcome("q", 1, tool_observed=True)
    blind = GeneratorOutcome("q", 1, tool_observed=False)
    assert (r_tool(seen), r_tool(blind)) == (1.0, 0.0)
    assert (r_tool(True), r_tool(False)) == (1.0, 0.0)
    # "w/o tool grounding": R_tool ≡ 1.
    assert r_tool(blind, tool_grounding=False) == 1.0
    assert r_tool(False, tool_grounding=False) == 1.0
    with pytest.raises(TypeError):
        r_tool(1)


def test_tool_observed_needs_a_real_observation_before_the_answer():
    rejected = ToolRecord(0, "lookup", {"word": "kiwi"}, False, "error: unknown tool", "unknown")
    real = ToolRecord(1, "lookup", {"word": "kiwi"}, True, "kiwi : fruit")
    assert not tool_observed([rejected])  # an error text is not an observation
    assert tool_observed([rejected, real])
    assert tool_observed([rejected, real], final_turn=2)
    assert not tool_observed([rejected, real], final_turn=1)  # same turn as the answer
    assert not tool_observed([real], tools={"weather"})
    assert tool_observed([real], tools={"lookup"})
    assert not tool_observed([])


# --- R_diff, R_G and the baselines' shapes -------------------------------------------------------


@pytest.mark.parametrize(
    "c,expected", [(0, 0.0), (1, 0.5), (2, 1.0), (3, 1.5), (4, 2.0), (6, 1.0), (7, 0.5), (8, 0.0)]
)
def test_r_diff_hand_values_k8(c, expected):
    assert r_diff(c, 8) == pytest.approx(expected)


def test_r_diff_vectorised_odd_k_and_numpy_reference():
    # Odd K: K/2 = 2.5, c = 2 -> 2·(1 − 0.5/2.5) = 1.6.
    assert r_diff(2, 5) == pytest.approx(1.6)
    for k in (1, 2, 5, 8, 16):
        c = np.arange(k + 1)
        ref = 2 * np.maximum(0, 1 - np.abs(c - k / 2) / (k / 2))
        np.testing.assert_allclose(r_diff(c, k), ref)
    for bad in (-1, 9, 2.5, NAN):
        with pytest.raises(ValueError, match="r_diff"):
            r_diff(bad, 8)
    with pytest.raises(ValueError, match="K"):
        r_diff(0, 0)


def test_solver_successes_threshold_and_nan():
    # ≥ γ counts; 0.89 does not; an undefined reward is not a success.
    assert solver_successes([0.9, 0.89, 1.0, NAN, 0.2, 0.95, 0.0, 0.9]) == 4
    assert solver_successes([0.5, 0.6], gamma=0.5) == 2
    np.testing.assert_array_equal(solver_successes([[1.0, 0.0], [NAN, NAN]]), [1, 0])
    with pytest.raises(ValueError, match="K axis"):
        solver_successes(0.5)


def test_r_generator_combinations_and_difficulty_switch():
    assert r_generator(1, 1, 2.0) == 3.0
    assert r_generator(1, 1, 0.0) == 1.0  # valid, grounded, but all solved / all failed
    assert r_generator(0, 1, 2.0) == 0.0
    assert r_generator(1, 0, 2.0) == 0.0
    assert r_generator(0, 0, 1.0) == 0.0
    assert r_generator(1, 1, 1.5) == 2.5
    # "w/o difficulty shaping": R_diff := 0.
    assert r_generator(1, 1, 2.0, difficulty=False) == 1.0
    assert r_generator(0, 1, 2.0, difficulty=False) == 0.0
    np.testing.assert_allclose(r_generator([1, 1, 0], [1, 0, 1], [2.0, 2.0, 2.0]), [3.0, 0.0, 0.0])


def test_baseline_shapes_hand_values():
    # Absolute Zero: 1 − c/K inside (0, K), else 0.
    for c, expected in [(0, 0.0), (1, 0.875), (2, 0.75), (4, 0.5), (7, 0.125), (8, 0.0)]:
        assert absolute_zero_learnability(c, 8) == pytest.approx(expected)
    # Dr. Zero: (K − c)/(K − 1) inside (0, K), else 0; peaks at c = 1.
    for c, expected in [(0, 0.0), (1, 1.0), (4, 4 / 7), (7, 1 / 7), (8, 0.0)]:
        assert dr_zero_difficulty(c, 8) == pytest.approx(expected)
    assert dr_zero_difficulty(1, 5) == 1.0 and dr_zero_difficulty(4, 5) == pytest.approx(0.25)
    assert dr_zero_difficulty(0, 1) == 0.0 and dr_zero_difficulty(1, 1) == 0.0
    assert DIFFICULTY_SHAPES.names() == ["absolute_zero", "arise_rl", "dr_zero"]
    assert DIFFICULTY_SHAPES.get("arise_rl") is r_diff


def test_baseline_composite_proposer_rewards():
    assert absolute_zero_proposer_reward(False, False, 4) == -1.0
    assert absolute_zero_proposer_reward(True, False, 4) == -0.5
    assert absolute_zero_proposer_reward(True, True, 2) == pytest.approx(0.75)
    assert absolute_zero_proposer_reward(True, True, 8) == 0.0
    f = dr_zero_format_score(True, think=1.0, tool=1.0, answer=0.5)
    assert f == pytest.approx(3.5 / 4)
    assert dr_zero_format_score(False, 1.0, 1.0, 1.0) == 0.0
    assert dr_zero_proposer_reward(f, 1) == pytest.approx(0.5 * 0.875 + 1.0)
    assert dr_zero_proposer_reward(f, 8) == pytest.approx(0.4375)
    assert dr_zero_proposer_reward(0.0, 1) == 0.0  # no format, no difficulty
    with pytest.raises(ValueError, match="think"):
        dr_zero_format_score(True, 1.5, 0, 0)


def test_generator_reward_end_to_end():
    good = GeneratorOutcome("q", 4, tool_observed=True)
    half = [1.0, 0.95, 0.9, 0.92, 0.5, 0.0, NAN, 0.1]  # c = 4 of K = 8
    assert generator_reward(good, half) == pytest.approx(3.0)
    assert generator_reward(good, half, shape="absolute_zero") == pytest.approx(1.5)
    assert generator_reward(good, half, shape="dr_zero") == pytest.approx(1 + 4 / 7)
    assert generator_reward(good, half, difficulty=False) == 1.0
    assert generator_reward(good, [1.0] * 8) == 1.0  # everything solved: gates only
    blind = GeneratorOutcome("q", 4, tool_observed=False)
    assert generator_reward(blind, half) == 0.0
    assert generator_reward(blind, half, tool_grounding=False) == pytest.approx(3.0)
    # A malformed task never reaches the solver: no scores needed, R_G = 0, no exception.
    bad = GeneratorOutcome("", 0, tool_observed=True, reason="no_question_tag")
    assert generator_reward(bad, None) == 0.0
    with pytest.raises(ValueError, match="solver scores"):
        generator_reward(good, None)
    with pytest.raises(KeyError, match="difficulty shape"):
        generator_reward(good, half, shape="nope")


# --- solver reward --------------------------------------------------------------------------------


def test_solver_reward_hand_values_weights_pitfall_failed():
    # Satisfied: c0 (3) yes, c1 (2) no, pitfall c2 (4) present -> no, c3 (1) yes: s = 4/10.
    assert weighted_satisfaction(WEIGHTS, [1, 0, 1, 1]) == pytest.approx(0.4)
    assert solver_reward(WEIGHTS, [1, 0, 1, 1]) == pytest.approx(0.8 * 0.4)
    # Pitfall absent and everything else met: s = 1, full bonus.
    assert solver_reward(WEIGHTS, [1, 1, 0, 1]) == 1.0
    # Only the pitfall broken: s = 6/10, no bonus.
    assert solver_reward(WEIGHTS, [1, 1, 1, 1]) == pytest.approx(0.8 * 0.6)
    # c0 failed (NaN): out of both sums: s = (2 + 4) / (2 + 4 + 1) = 6/7.
    assert solver_reward(WEIGHTS, [NAN, 1, 0, 0]) == pytest.approx(0.8 * 6 / 7)
    # Valid ones all satisfied, one failed: s = 1 -> r = 1.
    assert solver_reward(WEIGHTS, [NAN, 1, 0, 1]) == 1.0
    # All failed: undefined (NaN), not 0.
    assert math.isnan(solver_reward(WEIGHTS, [NAN] * 4))
    assert math.isnan(weighted_satisfaction(WEIGHTS, [NAN] * 4))
    # α.
    assert solver_reward(WEIGHTS, [1, 0, 1, 1], alpha=0.5) == pytest.approx(0.2)
    assert solver_reward(WEIGHTS, [1, 1, 0, 1], alpha=0.5) == 1.0
    with pytest.raises(ValueError, match="alpha"):
        solver_reward(WEIGHTS, [1, 0, 1, 1], alpha=1.2)
    with pytest.raises(ValueError, match="0, 1 or NaN"):
        solver_reward(WEIGHTS, [0.5, 0, 1, 1])


def test_solver_reward_equal_weights_is_the_seeds_unweighted_mean():
    met = np.array([1, 0, 1, 1, 0], float)
    s = 3 / 5  # eq. 7: (1/M) Σ z
    assert solver_reward(np.ones(5), met) == pytest.approx(0.8 * s)
    assert solver_reward(2 * np.ones(5), met) == pytest.approx(0.8 * s)


def test_solver_reward_batched_broadcast_and_padding():
    met = np.array([[[1, 0, 1, 1], [1, 1, 0, 1]], [[NAN, NAN, NAN, NAN], [0, 0, 0, 0]]])
    w = np.array([WEIGHTS, [1.0, 1.0, 0.0, 0.0]])[:, None, :]  # group 1: 2 criteria + padding
    r = solver_reward(w, met)
    assert r.shape == (2, 2)
    np.testing.assert_allclose(r[0], [0.32, 1.0])
    assert math.isnan(r[1, 0]) and r[1, 1] == 0.0


def _reference(weights, mets, alpha=0.8):
    """Plain loops: |λ|-weighted share of satisfied valid criteria, then eq. 8."""
    num = den = 0.0
    all_sat = True
    for w, m in zip(weights, mets):
        if m is None:
            continue
        sat = m if w > 0 else not m
        num += abs(w) * sat
        den += abs(w)
        all_sat = all_sat and sat
    if den == 0:
        return NAN, NAN
    return num / den, alpha * num / den + (1 - alpha) * all_sat


def test_solver_reward_matches_reference_and_registered_weighted_reward():
    rng = np.random.default_rng(18)
    groups, crits = [], []
    for g in range(9):
        n = int(rng.integers(0, 6))
        ws = rng.choice([-5.0, -2.0, -1.0, 0.1, 0.5, 1.0, 3.0], size=n)
        cs = [Criterion(f"t{g}/c{i}", "x", weight=w) for i, w in enumerate(ws)]
        fail_p = [0.0, 0.3, 1.0][g % 3]
        groups.append(
            [
                {c.id: None if rng.random() < fail_p else bool(rng.random() < 0.6) for c in cs}
                for _ in range(6)
            ]
        )
        crits.append(cs)
    scores = pack_verdicts(groups, crits, dtype=np.float64)
    met = np.where(scores.valid, scores.met, np.nan).transpose(0, 2, 1)  # [G, J, C]
    ours = solver_reward(scores.weights[:, None, :], met, alpha=0.7)
    registered = batch_rewards("arise_rl_solver", scores, alpha=0.7, weighted=True).values
    for g in range(9):
        for j in range(6):
            row = groups[g][j]
            ref_s, ref = _reference(
                [c.weight for c in crits[g]], [row[c.id] for c in crits[g]], 0.7
            )
            scalar = rubric_reward("arise_rl_solver", crits[g], row, alpha=0.7, weighted=True)
            if math.isnan(ref):
                assert scalar.value is None
                assert math.isnan(ours[g, j]) and math.isnan(registered[g, j])
            else:
                assert ours[g, j] == pytest.approx(ref, abs=1e-12)
                assert registered[g, j] == pytest.approx(ref, abs=1e-12)
                assert scalar.value == pytest.approx(ref, abs=1e-12)
                # Per-criterion contributions sum to α·s (the bonus is not attributed).
                shares = [x for _, x in scalar.contributions if x is not None]
                assert sum(shares) == pytest.approx(0.7 * ref_s, abs=1e-12)
    assert np.isnan(ours).sum() > 0


def test_registered_reward_default_is_still_unweighted():
    v = {"c0": True, "c1": False, "c2": True, "c3": True}
    assert rubric_reward("arise_rl_solver", CRITS, v).value == pytest.approx(0.8 * 0.5)
    assert rubric_reward("arise_rl_solver", CRITS, v, weighted=True).value == pytest.approx(0.32)
    scores = pack_verdicts([[v]], [CRITS])
    assert batch_rewards("arise_rl_solver", scores, weighted=True).values[0, 0] == pytest.approx(
        0.32
    )
    assert batch_rewards("arise_rl_solver", scores).values[0, 0] == pytest.approx(0.4)
