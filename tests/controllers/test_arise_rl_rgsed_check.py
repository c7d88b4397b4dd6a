"""RG-SED on the scripted-policy check (``methods/arise_rl/rgsed_check.py``): ARISE-RL's real
controller, pipeline and Services on solver steps, with a stand-in whose memory adds exactly d to
the expected satisfaction rate when it names the task's own criteria and nothing when it names
another task's (the placebo). Deterministic (every draw comes from the sampling seeds)."""

import functools
import math

import numpy as np
import pytest

from configs import arise_rl as arise_rl_config
from rubric_rl.methods.arise_rl.rgsed_check import mean_se, memory_notes, run_check

TAU = 0.05
LAMBDA0 = 0.5  # configs/arise_rl.py: loss.sd_coef
T = 0.0125  # the soft gate's temperature
D, FLOOR = 120, 0.1  # cosine decay
P = 0.7  # P(a criterion is satisfied) without memory: misses are the exception
# The defaults before memory was written for every group: the majority coach, J' = 4 fresh
# rollouts, the warm-up/decay clock on the training step.
OLD = dict(coach_rule="majority", memory_rollouts=4, paired_seeds="none", schedule_clock="global")


@functools.cache
def check(d, overrides=()):
    return run_check(d, arise_rl_config.get_config("smoke"), p=P, overrides=dict(overrides))


def test_memory_notes_reads_coach_blocks():
    text = "sys <coach> remember : cat ; remember : avoid : dog </coach> list cat , dog"
    rest, notes = memory_notes(text)
    assert notes == {"cat", "avoid : dog"} and "<coach>" not in rest and "list cat" in rest


@pytest.mark.parametrize("d", [0.0, TAU, 2 * TAU])
def test_delta_r_recovers_d_and_the_placebo_zero(d):
    r = check(d)
    assert not np.isnan(r.delta_r).any()  # memory and a measured Δr for every group
    assert all(m["arise_rl/rgsed/solver/memory_frac"] == 1.0 for m in r.metrics)
    mean, se = mean_se(r.delta_r)
    assert abs(mean - d) <= 2 * se, (mean, se)
    pmean, pse = mean_se(r.placebo)
    assert abs(pmean) <= 2 * pse, (pmean, pse)
    # the two arms share their seeds: their difference is the memory's content effect alone
    assert all(m["arise_rl/rgsed/paired_frac"] == 1.0 for m in r.metrics)
    diff = r.delta_r - r.placebo
    cmean, cse = mean_se(diff)
    if d == 0.0:
        np.testing.assert_array_equal(r.delta_r, r.placebo)
    else:
        assert np.all(diff >= 0) and abs(cmean - d) <= 3 * cse, (cmean, cse)
    # logged per role beside each other
    m = r.metrics[-1]
    last = r.step == r.step.max()
    assert m["arise_rl/rgsed/solver/delta_r"] == pytest.approx(np.mean(r.delta_r[last]))
    assert m["arise_rl/rgsed/solver/placebo_delta_r"] == pytest.approx(np.mean(r.placebo[last]))


def _regions(dr):
    return (np.mean(dr > TAU), np.mean(np.abs(dr) <= TAU), np.mean(dr < -TAU))


def test_regions_shift_as_d_moves_from_0_to_2tau():
    runs = [check(d) for d in (0.0, TAU, 2 * TAU)]
    # the same seeds and the same memories: each group's Δr grows with d
    for a, b in zip(runs, runs[1:]):
        assert np.all(b.delta_r >= a.delta_r)
    regions = [_regions(r.delta_r) for r in runs]
    above = [x[0] for x in regions]
    below = [x[2] for x in regions]
    assert above[0] < above[1] < above[2] and below[0] > below[1] > below[2]
    # the placebo's regions do not move
    assert len({_regions(r.placebo) for r in runs}) == 1
    # the per-step metrics are these regions over the step's groups
    r = runs[2]
    for step, m in enumerate(r.metrics, start=1):
        a, w, b = _regions(r.delta_r[r.step == step])
        assert (m["arise_rl/rgsed/solver/above"], m["arise_rl/rgsed/solver/within"]) == (a, w)
        assert m["arise_rl/rgsed/solver/below"] == b


def _expected_lambda(dr, t, warmup):
    """λ0 · sigmoid((Δr − τ)/T) · w(t) · d(t), written out."""
    gate = 1.0 / (1.0 + np.exp(-(dr - TAU) / T))
    w = 1.0 if warmup == 0 else 0.5 * (1 - math.cos(math.pi * min(t / warmup, 1.0)))
    dec = FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * min(t / D, 1.0)))
    return LAMBDA0 * gate * w * dec


@pytest.mark.parametrize("clock", ["phase", "global"])
def test_effective_lambda_is_schedule_times_gate(clock):
    r = check(2 * TAU, (("schedule_clock", clock), ("warmup_steps", 3)))
    for step, m in enumerate(r.metrics, start=1):
        # solver steps only: the phase clock is the offset in the solver phase, from 0
        t = step - 1 if clock == "phase" else step
        sel = r.step == step
        want = _expected_lambda(r.delta_r[sel], t, 3)
        np.testing.assert_allclose(r.sd_coef[sel], np.repeat(want[:, None], 8, axis=1))
        assert m["arise_rl/rgsed/solver/lambda_mean"] == pytest.approx(want.mean())
        assert m["arise_rl/rgsed/solver/lambda_active_frac"] == np.mean(want > 0.5 * LAMBDA0)
    if clock == "phase":
        assert np.all(r.sd_coef[r.step == 1] == 0.0)  # w(0) = 0: the phase's first step


def test_before_memory_was_rare_and_delta_r_biased_without_an_effect():
    """The old defaults on the same stand-in: memory only for the groups most of which missed a
    criterion (rare when misses are the exception), and with no memory effect at all (d = 0)
    their Δr is still positive (the memory exists after a bad draw; fresh rollouts regress to
    the mean). With memory for every group, Δr at d = 0 is centred on 0."""
    old = check(0.0, tuple(OLD.items()))
    frac = np.mean([m["arise_rl/rgsed/memory_frac"] for m in old.metrics])
    assert frac < 0.25
    mean, _ = mean_se(old.delta_r)
    assert mean > 0.02
    new = check(0.0)
    assert abs(mean_se(new.delta_r)[0]) < 0.01


def test_pairing_with_the_standard_rollouts_overstates_delta_r():
    """Why the memory rollouts do not reuse the standard rollouts' seeds by default: the memory
    names the criteria those very draws missed, and a paired draw repeats the miss unless the
    memory flips it, so Δr measures the effect where it is largest (here > d by many SEs)."""
    r = check(TAU, (("paired_seeds", "standard"),))
    mean, se = mean_se(r.delta_r)
    assert mean - TAU > 3 * se
    assert all(m["arise_rl/rgsed/paired_frac"] == 1.0 for m in r.metrics)
