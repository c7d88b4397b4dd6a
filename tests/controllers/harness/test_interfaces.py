"""HarnessRL's sampling weights with u = 1/(N p), and the guidance cap schedule."""

import numpy as np
import pytest

from rubric_rl.methods.harness_rl.interfaces import (
    SEED_LEVELS,
    draw_tasks,
    enforce_cap,
    guidance_cap,
    task_probabilities,
    validate_levels,
)


def test_draws_follow_p_and_u_restores_the_uniform_expectation():
    rng = np.random.default_rng(0)
    level = np.array([0, 0, 1, 2, 3, 3, 1, 0])
    p = task_probabilities(level, SEED_LEVELS)
    w = np.array(SEED_LEVELS)[level]
    np.testing.assert_allclose(p, w / w.sum())
    idx, u = draw_tasks(level, SEED_LEVELS, 200_000, rng)
    np.testing.assert_allclose(u, 1.0 / (len(level) * p[idx]))
    freq = np.bincount(idx, minlength=len(level)) / len(idx)
    np.testing.assert_allclose(freq, p, atol=3e-3)
    # E[u · f(x)] under p equals the uniform mean of f: the objective is unchanged.
    f = np.arange(len(level), dtype=float) ** 2
    assert np.mean(u * f[idx]) == pytest.approx(f.mean(), rel=0.02)
    # All tasks at one level: uniform, u = 1.
    _, u1 = draw_tasks(np.full(5, 2), SEED_LEVELS, 10, rng)
    np.testing.assert_allclose(u1, 1.0)


def test_levels_are_checked():
    assert validate_levels((1, 0.5, 0.5, 0.1)) == (1.0, 0.5, 0.5, 0.1)
    for bad in ((0.9, 0.5), (1, 0.5, 0.7), (1, 0.0), (1,)):
        with pytest.raises(ValueError, match="harness.levels"):
            validate_levels(bad)


def test_the_guidance_cap_falls_by_one_each_quarter():
    caps = [guidance_cap(s, 500) for s in range(1, 501)]
    assert caps[0] == 3 and caps[124] == 3  # steps 1..125
    assert caps[125] == 2 and caps[249] == 2
    assert caps[250] == 1 and caps[374] == 1
    assert caps[375] == 0 and caps[499] == 0  # the last reduction at step 375 (seed §3.2)
    assert [guidance_cap(s, 4) for s in (1, 2, 3, 4)] == [3, 2, 1, 0]
    assert guidance_cap(1, 8, max_fields=2) == 2
    with pytest.raises(ValueError, match="total_steps"):
        guidance_cap(1, 0)


def test_a_falling_cap_drops_the_fields_last_in_mounting_order():
    fields = {"critique": "c", "criterion": "a", "reference": "b"}
    keep, drop = enforce_cap(fields, 2)
    assert keep == {"criterion": "a", "reference": "b"} and drop == ("critique",)
    keep, drop = enforce_cap({"critique": "c", "reference": "b"}, 1)
    assert keep == {"reference": "b"} and drop == ("critique",)
    assert enforce_cap(fields, 0) == ({}, ("criterion", "reference", "critique"))
    with pytest.raises(ValueError, match="skills"):
        enforce_cap({"skills": "x"}, 3)
