"""Rollout correction (bypass/decoupled, TIS, rejection bands, veto) vs the numpy reference."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_rl.core import variants as registry
from rubric_rl.core.aggregation import finalize_metrics
from rubric_rl.core.rollout_correction import RolloutCorrection, rollout_correction
from tests.core import reference as ref

f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
# jitted at XLA's lowest optimisation level: compilation dominates these tests on a 2-core machine
rc = jax.jit(
    rollout_correction,
    static_argnames=("config",),
    compiler_options={"xla_backend_optimization_level": 0},
)


def _logps(seed, batch=5, length=7, spread=0.6):
    rng = np.random.default_rng(seed)
    old = -rng.uniform(0.1, 3.0, size=(batch, length)).astype(np.float32)
    new = (old + rng.normal(scale=spread, size=(batch, length))).astype(np.float32)
    mask = ref.random_mask(rng, batch, length, empty_rows=(1,))
    return rng, new, old, mask


CUSTOM = {
    "token_band": RolloutCorrection(rejections=(("token_ratio", 0.6, 1.5),), tis="token"),
    "k1_k2": RolloutCorrection(
        rejections=(("seq_mean_k1", -0.05, 0.05), ("seq_mean_k2", None, 0.02))
    ),
    "geo_wide": RolloutCorrection(rejections=(("seq_geo_mean", 0.95, 1.05),), token_veto=0.5),
}


def _reference_config(cfg):
    return dict(
        mode=cfg.mode, tis=cfg.tis, cap=cfg.tis_cap, rejections=cfg.rejections, veto=cfg.token_veto
    )


BASE_PRESETS = [n for n in registry.ROLLOUT_CORRECTION_PRESETS.names() if not n.endswith("_veto")]


@pytest.mark.parametrize(
    "name", BASE_PRESETS + ["bypass_veto", "seq_sum_mask_tis_veto"] + sorted(CUSTOM)
)
def test_rollout_correction_matches_reference(name):
    cfg = CUSTOM.get(name) or registry.get_rollout_correction(name)
    rng = np.random.default_rng(11)
    batch, length = 10, 6
    roll = -rng.uniform(0.1, 3.0, size=(batch, length)).astype(np.float32)
    scale = np.array([0.0002, 0.0005, 0.005, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0, 3.0])[:, None]
    old = (roll + rng.normal(size=(batch, length)) * scale).astype(np.float32)
    mask = ref.random_mask(rng, batch, length, empty_rows=(2,))
    mask[9, 3] = 1.0
    old[9, 3] = roll[9, 3] - 10.0  # one token below the 1e-4 veto
    is_w, new_mask, metrics = rc(f32(old), f32(roll), f32(mask), config=cfg)
    want_w, want_mask = ref.rollout_correction(old, roll, mask, **_reference_config(cfg))
    np.testing.assert_array_equal(np.asarray(new_mask), want_mask)
    np.testing.assert_allclose(np.asarray(is_w), want_w, rtol=1e-5)
    m = finalize_metrics(metrics)
    on = mask != 0
    dlp = np.abs(old - roll)[on]
    np.testing.assert_allclose(float(m["rollout_corr/abs_dlogp"]), dlp.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["rollout_corr/abs_dlogp/max"]), dlp.max(), rtol=1e-6)
    lw = (old - roll)[on].astype(np.float64)
    for k, v in (("k1", -lw), ("k2", 0.5 * lw**2), ("k3", np.exp(lw) - 1 - lw)):
        np.testing.assert_allclose(float(m[f"rollout_corr/{k}"]), v.mean(), rtol=1e-4, atol=1e-7)
    dropped = on & (want_mask == 0)
    np.testing.assert_allclose(float(m["rollout_corr/masked_token_frac"]), dropped.sum() / on.sum())
    kept = want_mask != 0
    np.testing.assert_allclose(float(m["rollout_corr/is_weight"]), want_w[kept].mean(), rtol=1e-5)
    np.testing.assert_allclose(
        float(m["rollout_corr/is_weight/max"]), want_w[kept].max(), rtol=1e-5
    )
    if cfg.rejections or cfg.token_veto:  # the presets' bands bite on this data, but not fully
        assert 0 < dropped.sum() < on.sum(), name


def test_bypass_has_unit_weights_and_never_double_corrects():
    rng, new, old, mask = _logps(5, spread=0.5)
    for name in ("bypass", "bypass_veto"):
        is_w, new_mask, _ = rc(
            f32(new), f32(old), f32(mask), config=registry.get_rollout_correction(name)
        )
        assert np.all(np.asarray(is_w) == 1.0)
    is_w, new_mask, metrics = rc(None, f32(old), f32(mask), config=RolloutCorrection(mode="bypass"))
    assert np.all(np.asarray(is_w) == 1.0) and np.array_equal(np.asarray(new_mask), mask)
    assert float(metrics["rollout_corr/abs_dlogp/sum"]) == 0.0
    with pytest.raises(ValueError, match="correct twice"):
        RolloutCorrection(mode="bypass", tis="token")
    with pytest.raises(ValueError, match="decoupled mode needs old_logps"):
        rc(None, f32(old), f32(mask), config=RolloutCorrection())
    with pytest.raises(ValueError, match="low 2.0 > high 0.5"):
        RolloutCorrection(rejections=(("seq_sum", 2.0, 0.5),))
    with pytest.raises(KeyError, match="unknown rejection statistic 'seq_max'"):
        RolloutCorrection(rejections=(("seq_max", 0.5, 2.0),))


def test_token_veto_at_and_below_threshold():
    at = np.float32(math.log(1e-4))
    below = np.nextafter(at, np.float32(-np.inf))
    old = np.array([[0.0, at, 0.0], [0.0, below, 0.0], [below, 0.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 1]], np.float32)  # row 2: low ratio is masked
    _, new_mask, metrics = rc(
        f32(old), jnp.zeros((3, 3)), f32(mask), config=registry.get_rollout_correction("off_veto")
    )
    np.testing.assert_array_equal(np.asarray(new_mask), [[1, 1, 1], [0, 0, 0], [0, 1, 1]])
    m = finalize_metrics(metrics)
    assert float(m["rollout_corr/veto_seq_frac"]) == pytest.approx(1 / 3)
    assert float(m["rollout_corr/dropped_seq_frac"]) == pytest.approx(1 / 3)


# (statistic, band, [log-weights of a one-token sequence]: expected kept)
EDGES = [
    (
        "token_ratio",
        (0.5, 2.0),
        {math.log(0.5): True, math.log(2.0): True, -0.6932: False, 0.6932: False},
    ),
    (
        "seq_geo_mean",
        (0.999, 1.001),
        {math.log(0.999): True, math.log(1.001): True, -0.0010012: False, 0.0010006: False},
    ),
    (
        "seq_sum",
        (0.5, 2.0),
        {math.log(0.5): True, math.log(2.0): True, -0.6932: False, 0.6932: False},
    ),
    ("seq_mean_k1", (-0.25, 0.5), {-0.5: True, 0.25: True, -0.5001: False, 0.2501: False}),
    ("seq_mean_k2", (None, 0.125), {0.5: True, -0.5: True, 0.5001: False, -0.5001: False}),
    ("seq_mean_k3", (None, 0.01), {0.1380: True, -0.1448: True, 0.1385: False, -0.1452: False}),
]


@pytest.mark.parametrize("stat,band,cases", EDGES, ids=[e[0] for e in EDGES])
def test_each_rejection_statistic_at_its_band_edges(stat, band, cases):
    cfg = RolloutCorrection(rejections=((stat, *band),))
    log_w = np.array(list(cases), np.float32)[:, None]
    old = np.concatenate([log_w, np.zeros_like(log_w)], axis=1)
    mask = np.array([[1, 0]] * len(cases), np.float32)  # one loss token per sequence
    _, new_mask, _ = rc(f32(old), jnp.zeros_like(f32(old)), f32(mask), config=cfg)
    np.testing.assert_array_equal(np.asarray(new_mask[:, 0]) == 1, list(cases.values()))


def test_presets_hand_computed():
    lw = np.array(
        [[0.3, 0.2, 0.0], [0.5, 0.4, 0.0], [-0.3, -0.3, 0.0], [0.3, 0.9, 0.0]], np.float32
    )
    mask = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]], np.float32)
    roll = jnp.zeros_like(f32(lw))
    # seq_sum_mask_tis: exp(Σ log w) = e^0.5, e^0.9 (> 2: rejected), e^-0.6, e^1.2 (rejected)
    is_w, new_mask, _ = rc(
        f32(lw), roll, f32(mask), config=registry.get_rollout_correction("seq_sum_mask_tis")
    )
    np.testing.assert_array_equal(
        np.asarray(new_mask), [[1, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]]
    )
    np.testing.assert_allclose(
        np.asarray(is_w)[[0, 2], 0], [math.exp(0.5), math.exp(-0.6)], rtol=1e-6
    )
    # decoupled_token_tis: min(w_t, 2) per token, nothing rejected
    is_w, new_mask, _ = rc(
        f32(lw), roll, f32(mask), config=registry.get_rollout_correction("decoupled_token_tis")
    )
    np.testing.assert_allclose(np.asarray(is_w)[3, :2], [math.exp(0.3), 2.0], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(new_mask), mask)
    # decoupled_seq_tis: min(exp(Σ log w), 2) on every token of the sequence
    is_w, _, _ = rc(
        f32(lw), roll, f32(mask), config=registry.get_rollout_correction("decoupled_seq_tis")
    )
    np.testing.assert_allclose(
        np.asarray(is_w)[:, 0], [math.exp(0.5), 2.0, math.exp(-0.6), 2.0], rtol=1e-6
    )
    # seq_mean_k3 ≤ 0.01: mean(w − 1 − log w) = 0.036, 0.10, 0.041, 0.24 → all rejected
    small = lw * 0.1  # k3 ≈ ½ (log w)² ≈ 1e-4..4e-3 → kept
    _, new_mask, _ = rc(
        f32(np.concatenate([lw, small])),
        jnp.zeros((8, 3)),
        f32(np.concatenate([mask, mask])),
        config=registry.get_rollout_correction("seq_mean_k3"),
    )
    np.testing.assert_array_equal(np.asarray(new_mask)[:, 0], [0, 0, 0, 0, 1, 1, 1, 1])
