"""RISED's behaviour analyses (rubric_rl/methods/rised/rised_analysis.py): frequencies per
environment from the behaviours file (absent = 0 that step), half-lives by hand, bad files named."""

import json

import numpy as np
import pytest

from rubric_rl.methods.rised.rised_analysis import (
    BEHAVIOURS_FILE,
    behaviour_frequencies,
    half_life,
    half_lives,
)


def write(tmp_path, rows):
    p = tmp_path / BEHAVIOURS_FILE
    p.parent.mkdir(parents=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path)


def test_frequencies_per_environment_with_absent_rubrics_as_zero(tmp_path):
    run = write(tmp_path, [
        {"step": 1, "env": "a", "rollouts": 8, "failed": 0, "freq": {"x": 0.5, "y": 1.0}},
        {"step": 1, "env": "b", "rollouts": 0, "failed": 8, "freq": {}},
        {"step": 2, "env": "a", "rollouts": 8, "failed": 0, "freq": {"y": 0.25}},
    ])  # fmt: skip
    f = behaviour_frequencies(run)
    assert set(f) == {"a"}  # b had no tagged rollout
    steps, x = f["a"]["x"]
    assert steps.tolist() == [1, 2] and x.tolist() == [0.5, 0.0]
    assert f["a"]["y"][1].tolist() == [1.0, 0.25]


def test_half_life_by_hand():
    steps = np.arange(1, 11)
    shares = np.array([0.8, 0.8, 0.6, 0.6, 0.5, 0.4, 0.3, 0.3, 0.2, 0.1])
    # window 2: initial = mean(0.8, 0.8) = 0.8, half 0.4; trailing-2 means from step 2 on:
    # .8 .7 .6 .55 .45 (steps 5-6: 0.5, 0.4) .35 (steps 6-7: 0.4, 0.3) -> step 7
    assert half_life(steps, shares, window=2) == 7
    assert half_life(steps, shares, window=1) == 6  # 0.4 <= 0.8 / 2 at step 6
    assert half_life(steps, np.full(10, 0.3), window=2) is None  # never falls
    assert half_life(steps, np.zeros(10), window=2) is None  # nothing to halve
    assert half_life(steps[:1], shares[:1], window=2) is None
    with pytest.raises(ValueError, match="must match"):
        half_life(steps, shares[:3])
    hl = half_lives({"a": {"x": (steps, shares), "p": (steps, shares)}}, ["x"], window=1)
    assert hl == {"a": {"x": 6}}


def test_a_malformed_row_is_named(tmp_path):
    run = write(tmp_path, [{"step": 1, "env": "a", "freq": {}}])
    with pytest.raises(ValueError, match="row 1 has no field 'rollouts'"):
        behaviour_frequencies(run)
    with pytest.raises(FileNotFoundError, match="no RISED behaviours file"):
        behaviour_frequencies(str(tmp_path / "nowhere"))
