"""mismatch_report on hand-made inputs vs a plain-numpy reference; rescoring with the trainer."""

import math

import numpy as np
import pytest

from rubric_rl.rollout.diagnostics import mismatch_report, rescore_generations
from rubric_rl.rollout.engine import Generation, GenerationRequest


def test_hand_made_values():
    eng = [[-1.0, -2.0, -3.0, 0.0], [-0.5, -0.5, 0.0, 0.0]]
    tr = [[-1.0, -2.5, -2.0, 9.0], [-0.5, -0.4, 7.0, 0.0]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0]]  # the 9.0 and 7.0 are outside the mask
    r = mismatch_report(eng, tr, mask, thresholds=(0.05, 0.2, 0.6))
    d = np.array([0.0, -0.5, 1.0, 0.0, 0.1])  # trainer - engine on the mask
    assert r["num_tokens"] == 5 and r["num_sequences"] == 2
    assert r["mean_abs_diff"] == pytest.approx(1.6 / 5)
    assert r["max_abs_diff"] == pytest.approx(1.0)
    assert r["mean_diff"] == pytest.approx(0.6 / 5)
    assert r["frac_abs_diff_gt_0.05"] == pytest.approx(3 / 5)
    assert r["frac_abs_diff_gt_0.2"] == pytest.approx(2 / 5)
    assert r["frac_abs_diff_gt_0.6"] == pytest.approx(1 / 5)
    assert r["ratio_min"] == pytest.approx(math.exp(-0.5))
    assert r["ratio_max"] == pytest.approx(math.e)
    assert r["kl_k3"] == pytest.approx(np.mean(np.exp(d) - 1 - d))
    assert r["seq_abs_log_ratio_max"] == pytest.approx(0.5)  # row 0: 0 - 0.5 + 1
    assert r["seq_abs_log_ratio_mean"] == pytest.approx((0.5 + 0.1) / 2)
    ev = np.array([-1.0, -2.0, -3.0, -0.5, -0.5])
    tv = ev + d
    assert r["correlation"] == pytest.approx(np.corrcoef(ev, tv)[0, 1])


def test_random_against_numpy_reference():
    rs = np.random.RandomState(0)
    e = -rs.rand(6, 20) * 5
    t = e + rs.randn(6, 20) * 0.01
    m = (rs.rand(6, 20) > 0.3).astype(np.float32)
    m[3] = 0  # an all-masked row
    r = mismatch_report(e, t, m)
    sel = m > 0
    d = (t - e)[sel]
    assert r["num_sequences"] == 5
    assert r["mean_abs_diff"] == pytest.approx(np.abs(d).mean())
    assert r["max_abs_diff"] == pytest.approx(np.abs(d).max())
    assert r["frac_abs_diff_gt_0.01"] == pytest.approx((np.abs(d) > 0.01).mean())
    assert r["correlation"] == pytest.approx(np.corrcoef(e[sel], t[sel])[0, 1])
    assert r["correlation"] > 0.999


def test_edge_cases():
    empty = mismatch_report([[0.0, 0.0]], [[1.0, 2.0]], [[0, 0]])
    assert empty["num_tokens"] == 0 and empty["mean_abs_diff"] is None
    assert empty["correlation"] is None and empty["frac_abs_diff_gt_0.001"] is None
    same = mismatch_report([-1.0, -1.0], [-1.0, -1.0], [1, 1])  # 1-D, zero variance
    assert same["max_abs_diff"] == 0.0 and same["correlation"] is None and same["kl_k3"] == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        mismatch_report([[0.0]], [[0.0, 1.0]], [[1, 1]])
    with pytest.raises(ValueError, match=r"trainer_logps\[0, 1\] is not finite"):
        mismatch_report([[0.0, 0.0]], [[0.0, np.nan]], [[1, 1]])
    # non-finite values outside the mask are ignored
    assert mismatch_report([[0.0, np.inf]], [[0.0, 0.0]], [[1, 0]])["max_abs_diff"] == 0.0


def test_rescore_generations_detects_a_shift():
    """Re-scoring with the trainer: exact log-probs give Δ≈0, shifted ones give the shift."""
    from flax import nnx

    from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM
    from rubric_rl.rollout.diagnostics import trainer_token_logprobs

    model = Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(3))
    rs = np.random.RandomState(0)
    reqs = [GenerationRequest(tuple(rs.randint(1, 128, n).tolist()), f"r{n}") for n in (4, 9)]
    comps = [rs.randint(1, 128, 6).tolist() for _ in reqs]
    full = trainer_token_logprobs(
        model, [list(r.prompt_ids) + c for r, c in zip(reqs, comps)], temperature=0.8
    )
    gens = [
        [Generation(tuple(c), tuple(f[len(r.prompt_ids) :].tolist()), "length", 0)]
        for r, c, f in zip(reqs, comps, full)
    ]
    exact = rescore_generations(model, reqs, gens, temperature=0.8)
    assert exact["num_tokens"] == 12 and exact["max_abs_diff"] < 1e-6
    shifted = [
        [Generation(g.token_ids, tuple(x - 0.25 for x in g.logprobs), "length", 0)] for (g,) in gens
    ]
    off = rescore_generations(model, reqs, shifted, temperature=0.8)
    assert off["mean_diff"] == pytest.approx(0.25, abs=1e-5)
    assert off["frac_abs_diff_gt_0.1"] == 1.0 and off["correlation"] == pytest.approx(1.0)
