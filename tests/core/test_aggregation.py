"""Aggregation modes vs the numpy reference, exactness under micro-batching, metrics helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_rl.core.aggregation import (
    AGGREGATORS,
    aggregate,
    combine_metrics,
    finalize_metrics,
    masked_max_part,
    masked_mean_parts,
)
from tests.core import reference as ref

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "dr-grpo"]
CONSTANT = 16.0


def _case(seed, batch=6, length=9):
    rng = np.random.default_rng(seed)
    per_token = rng.normal(size=(batch, length)).astype(np.float32)
    mask = ref.random_mask(rng, batch, length, empty_rows=(2,))
    seq_weights = rng.uniform(0.2, 3.0, size=batch).astype(np.float32)
    return per_token, mask, seq_weights


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_modes_match_reference(mode, seed, weighted):
    per_token, mask, seq_weights = _case(seed)
    u = seq_weights if weighted else None
    num, den = aggregate(
        jnp.asarray(per_token),
        jnp.asarray(mask),
        mode=mode,
        seq_weights=None if u is None else jnp.asarray(u),
        constant=CONSTANT,
    )
    ref_num, ref_den = ref.aggregate(per_token, mask, mode, u, CONSTANT)
    np.testing.assert_allclose(float(num), ref_num, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(den), ref_den, rtol=1e-6)


def test_hand_computed_modes():
    # two sequences: losses [1, 2, 3] (3 tokens) and [4, _, _] (1 token), one empty row
    per_token = jnp.array([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], jnp.float32)
    u = jnp.array([1.0, 0.5, 3.0])
    expect = {
        "token-mean": (6 + 4, 4),  # Σ m L over Σ m
        "seq-mean-token-mean": (2 + 4, 2),  # per-sequence means over non-empty sequences
        "seq-mean-token-sum": (6 + 4, 2),
        "dr-grpo": (6 + 4, 3 * 5.0),  # rows × constant
    }
    for mode, (e_num, e_den) in expect.items():
        num, den = aggregate(per_token, mask, mode=mode, constant=5.0)
        assert (float(num), float(den)) == (e_num, e_den), mode
    num, den = aggregate(per_token, mask, mode="seq-mean-token-mean", seq_weights=u)
    assert (float(num), float(den)) == (1.0 * 2 + 0.5 * 4, 2)


@pytest.mark.parametrize("mode", MODES)
def test_microbatch_split_equals_full_batch(mode):
    """Σ num / Σ den over micro-batches of unequal size, each trimmed to its own padded length."""
    rng = np.random.default_rng(7)
    batch, length = 7, 12
    per_token = rng.normal(size=(batch, length)).astype(np.float32)
    lengths = rng.integers(1, length + 1, size=batch)
    lengths[3] = 0  # a fully masked row
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    u = rng.uniform(0.5, 2.0, size=batch).astype(np.float32)
    full_num, full_den = aggregate(
        jnp.asarray(per_token),
        jnp.asarray(mask),
        mode=mode,
        seq_weights=jnp.asarray(u),
        constant=CONSTANT,
    )
    total_num = total_den = 0.0
    for rows in (slice(0, 2), slice(2, 5), slice(5, 7)):
        width = max(int(lengths[rows].max()), 1)  # each micro-batch padded to its own length
        num, den = aggregate(
            jnp.asarray(per_token[rows, :width]),
            jnp.asarray(mask[rows, :width]),
            mode=mode,
            seq_weights=jnp.asarray(u[rows]),
            constant=CONSTANT,
        )
        total_num += float(num)
        total_den += float(den)
    np.testing.assert_allclose(total_num / total_den, float(full_num) / float(full_den), rtol=1e-5)
    np.testing.assert_allclose(total_den, float(full_den), rtol=1e-6)


def test_token_mean_exact_even_when_split_inside_sequences():
    per_token, mask, _ = _case(3)
    full_num, full_den = aggregate(jnp.asarray(per_token), jnp.asarray(mask), mode="token-mean")
    parts = [
        aggregate(jnp.asarray(per_token[:, s]), jnp.asarray(mask[:, s]), mode="token-mean")
        for s in (slice(0, 4), slice(4, None))
    ]
    np.testing.assert_allclose(sum(float(n) for n, _ in parts), float(full_num), rtol=1e-5)
    assert sum(float(d) for _, d in parts) == float(full_den)


@pytest.mark.parametrize("mode", MODES)
def test_padding_and_garbage_at_masked_slots_change_nothing(mode):
    per_token, mask, u = _case(4)
    base = aggregate(jnp.asarray(per_token), jnp.asarray(mask), mode=mode, constant=CONSTANT)
    pad = 5
    garbage = np.where(mask == 0, np.inf, per_token)  # garbage where the mask is 0 must not leak
    padded_tokens = np.concatenate([garbage, np.full((6, pad), np.nan, np.float32)], axis=1)
    padded_mask = np.concatenate([mask, np.zeros((6, pad), np.float32)], axis=1)
    padded = aggregate(
        jnp.asarray(padded_tokens), jnp.asarray(padded_mask), mode=mode, constant=CONSTANT
    )
    assert float(padded[0]) == pytest.approx(float(base[0]), rel=1e-6)
    assert float(padded[1]) == float(base[1])  # dr-grpo: rows × constant, whatever T is


def test_jit_and_errors():
    per_token, mask, u = _case(5)
    f = jax.jit(lambda p, m, w: aggregate(p, m, mode="seq-mean-token-mean", seq_weights=w))
    got = f(jnp.asarray(per_token), jnp.asarray(mask), jnp.asarray(u))
    want = ref.aggregate(per_token, mask, "seq-mean-token-mean", u)
    np.testing.assert_allclose([float(got[0]), float(got[1])], want, rtol=1e-5)
    with pytest.raises(ValueError, match="dr-grpo.*constant"):
        aggregate(jnp.asarray(per_token), jnp.asarray(mask), mode="dr-grpo")
    with pytest.raises(KeyError, match="unknown aggregation mode 'mean'; known: dr-grpo"):
        aggregate(jnp.asarray(per_token), jnp.asarray(mask), mode="mean")
    with pytest.raises(ValueError, match=r"seq_weights must be \[B\]"):
        aggregate(jnp.asarray(per_token), jnp.asarray(mask), mode="token-mean", seq_weights=u[:2])
    assert AGGREGATORS.get("seq-mean-token-sum-norm") is AGGREGATORS.get("dr-grpo")


def test_metrics_combine_across_microbatches_like_the_full_batch():
    rng = np.random.default_rng(9)
    values = rng.normal(size=(6, 5)).astype(np.float32)
    mask = ref.random_mask(rng, 6, 5, empty_rows=(0, 1, 2))

    def parts(rows):
        v, m = jnp.asarray(values[rows]), jnp.asarray(mask[rows])
        return masked_mean_parts("x", v, m) | masked_max_part("x", v, m)

    first = parts(slice(0, 3))  # all rows masked: count 0, max -inf
    assert float(first["x/count"]) == 0 and float(first["x/max"]) == -np.inf
    combined = finalize_metrics(combine_metrics(first, parts(slice(3, 6))))
    on = mask != 0
    np.testing.assert_allclose(float(combined["x"]), values[on].mean(), rtol=1e-5)
    assert float(combined["x/max"]) == values[on].max()
    empty = finalize_metrics(first)
    assert np.isnan(float(empty["x"])) and np.isnan(float(empty["x/max"]))
    kept = finalize_metrics({"tokens/count": jnp.float32(3.0), "n/sum": jnp.float32(2.0)})
    assert float(kept["tokens/count"]) == 3.0 and float(kept["n/sum"]) == 2.0
    with pytest.raises(ValueError, match="must end with one of"):
        combine_metrics({}, {"x": jnp.float32(1.0)})
