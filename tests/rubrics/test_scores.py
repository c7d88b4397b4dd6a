"""Packing verdicts into [G, C, J] arrays: ragged criteria, failures, padding, round trip."""

import numpy as np
import pytest

from rubric_rl.rubrics.scores import (
    ScoreMatrices,
    failure_counts,
    pack_verdicts,
    unpack_verdicts,
)
from rubric_rl.rubrics.types import Criterion, Rubric, Verdict


def _crits(prefix, weights):
    return [Criterion(f"{prefix}/c{i}", f"criterion {i}", weight=w) for i, w in enumerate(weights)]


def test_ragged_groups_with_failures_pack_exactly():
    c0 = _crits("a", [2.0, -1.0, 3.0])
    c1 = _crits("b", [1.0])
    groups = [
        [
            {"a/c0": Verdict("a/c0", True), "a/c1": Verdict("a/c1", None), "a/c2": False},
            {"a/c0": False, "a/c1": True, "a/c2": None},
        ],
        [{"b/c0": Verdict("b/c0", True)}, {"b/c0": None}],
    ]
    s = pack_verdicts(groups, [c0, Rubric(tuple(c1))])
    assert s.met.shape == (2, 3, 2) and s.valid.shape == (2, 3, 2)
    np.testing.assert_array_equal(s.weights, [[2.0, -1.0, 3.0], [1.0, 0.0, 0.0]])
    np.testing.assert_array_equal(s.met[0], [[1, 0], [0, 1], [0, 0]])
    np.testing.assert_array_equal(s.valid[0], [[True, True], [False, True], [True, False]])
    np.testing.assert_array_equal(s.met[1], [[1, 0], [0, 0], [0, 0]])
    np.testing.assert_array_equal(s.valid[1], [[True, False], [False, False], [False, False]])
    np.testing.assert_array_equal(s.criterion_mask, [[True] * 3, [True, False, False]])
    # Failures count only real criteria, never padding.
    np.testing.assert_array_equal(s.num_failed, [[1, 1], [0, 1]])
    np.testing.assert_array_equal(s.num_valid, [[2, 2], [1, 0]])
    assert s.criterion_ids == (("a/c0", "a/c1", "a/c2"), ("b/c0",))
    assert s.failure_rate == pytest.approx(3 / 8)
    counts = failure_counts(s)
    assert counts["judge/failed"] == 3
    assert counts["judge/verdicts"] == 8
    assert counts["judge/responses_with_failure"] == 3
    assert counts["judge/criteria_all_failed"] == 0


def test_unpack_inverts_pack_on_random_inputs():
    rng = np.random.default_rng(0)
    groups, crits = [], []
    for g in range(5):
        n = int(rng.integers(0, 6))
        cs = _crits(f"t{g}", rng.choice([-3.0, -1.0, 1.0, 2.0, 5.0], size=n))
        crits.append(cs)
        groups.append(
            [{c.id: [True, False, None][int(rng.integers(3))] for c in cs} for _ in range(4)]
        )
    s = pack_verdicts(groups, crits)
    assert unpack_verdicts(s) == groups
    assert s.max_criteria == max(len(c) for c in crits)


def test_missing_and_unknown_verdicts():
    cs = _crits("a", [1.0, 1.0])
    with pytest.raises(ValueError, match="no verdict for criterion 'a/c1'"):
        pack_verdicts([[{"a/c0": True}]], [cs])
    s = pack_verdicts([[{"a/c0": True}]], [cs], allow_missing=True)
    np.testing.assert_array_equal(s.num_failed, [[1]])
    with pytest.raises(ValueError, match="unknown criteria"):
        pack_verdicts([[{"a/c0": True, "a/c1": True, "zz": True}]], [cs])
    with pytest.raises(ValueError, match="holds a verdict for 'a/c1'"):
        pack_verdicts([[{"a/c0": Verdict("a/c1", True), "a/c1": True}]], [cs])
    with pytest.raises(ValueError, match="same number of responses"):
        pack_verdicts([[{"a/c0": 1, "a/c1": 1}], []], [cs, cs])
    with pytest.raises(TypeError, match="Verdict, bool or None"):
        pack_verdicts([[{"a/c0": 1, "a/c1": True}]], [cs])


def test_all_failed_criterion_counted_and_arrays_frozen():
    cs = _crits("a", [1.0, 2.0])
    s = pack_verdicts([[{"a/c0": None, "a/c1": True}, {"a/c0": None, "a/c1": False}]], [cs])
    assert failure_counts(s)["judge/criteria_all_failed"] == 1
    with pytest.raises(ValueError):
        s.met[0, 0, 0] = 1.0


def test_score_matrices_rejects_weighted_padding():
    with pytest.raises(ValueError, match="padding"):
        ScoreMatrices(
            met=np.zeros((1, 2, 1)),
            valid=np.zeros((1, 2, 1), bool),
            weights=np.array([[1.0, 1.0]]),
            criterion_ids=(("x",),),
        )


def test_empty_batch():
    s = pack_verdicts([], [])
    assert s.met.shape == (0, 0, 0)
    assert s.failure_rate == 0.0
