"""``warmstart.tie_case``: during the warm start each cased token's embedding row is its lowercase
row plus one shared vector per case; the saved parameters are a plain embedding matrix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common, grpo
from rubric_rl.pre_rl import warmstart
from tests.trainer_spy import one_device


def test_case_pairs_finds_each_cased_twin():
    vocab = {
        "cairo": 0, "CAIRO": 1, "Cairo": 2, "McX": 3, "mcx": 4, "Oslo": 5, "A": 6, "a": 7,
        "I": 8, ",": 9, "ABC1": 10, "abc1": 11, "<eos>": 12,
    }  # fmt: skip
    p = warmstart.case_pairs(vocab)
    got = sorted(zip(p.lower.tolist(), p.cased.tolist(), p.kind.tolist()))
    upper, cap = warmstart.CASE_KINDS.index("upper"), warmstart.CASE_KINDS.index("capitalized")
    # McX is mixed case, Oslo and I have no lowercase twin, ABC1 is not all letters; a single
    # capital letter is the Capitalized form.
    assert got == [(0, 1, upper), (0, 2, cap), (7, 6, cap)]
    assert p.cased.dtype == np.int32
    empty = warmstart.case_pairs({"a": 0, ",": 1})
    assert empty.cased.shape == (0,) and empty.lower.shape == (0,)


def _toy():
    rng = np.random.default_rng(0)
    params = {
        "embed": {"embedding": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)},
        "layer": {"kernel": jnp.asarray(rng.normal(size=(4, 4)), jnp.float32)},
    }
    pairs = warmstart.CasePairs(
        np.array([0, 0, 3], np.int32), np.array([1, 2, 4], np.int32), np.array([0, 1, 0], np.int32)
    )
    vecs = jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)
    return params, vecs, pairs


def test_tie_case_writes_lowercase_row_plus_case_vector():
    params, vecs, pairs = _toy()
    tied = warmstart.tie_case(params, vecs, pairs)
    e, t, v = (
        np.asarray(x) for x in (params["embed"]["embedding"], tied["embed"]["embedding"], vecs)
    )
    np.testing.assert_allclose(t[1], e[0] + v[0], rtol=1e-6)
    np.testing.assert_allclose(t[2], e[0] + v[1], rtol=1e-6)
    np.testing.assert_allclose(t[4], e[3] + v[0], rtol=1e-6)
    for row in (0, 3, 5):  # lowercase and untouched rows
        np.testing.assert_array_equal(t[row], e[row])
    np.testing.assert_array_equal(tied["layer"]["kernel"], params["layer"]["kernel"])


def test_tie_case_gradient_reaches_lowercase_rows_and_case_vectors_only():
    params, vecs, pairs = _toy()
    weights = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)

    def loss(trainable):
        tied = warmstart.tie_case(*trainable, pairs)
        return jnp.sum(tied["embed"]["embedding"] * weights) + jnp.sum(tied["layer"]["kernel"])

    g_params, g_vecs = jax.grad(loss)((params, vecs))
    g = np.asarray(g_params["embed"]["embedding"])
    # Reference: d/dE[lower] collects its own row's weight and every cased twin's; the raw cased
    # rows are overwritten, so they get none; each case vector collects its twins' weights.
    ref = weights.copy()
    ref[[1, 2, 4]] = 0.0
    ref[0] += weights[1] + weights[2]
    ref[3] += weights[4]
    np.testing.assert_allclose(g, ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g_vecs[0]), weights[1] + weights[4], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g_vecs[1]), weights[2], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(g_params["layer"]["kernel"]), np.ones((4, 4)))


def _warm_embedding(workdir, tie_case):
    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke")
    c.warmstart.tie_case = tie_case
    t = Trainer(c, str(workdir), devices=one_device())
    try:
        t._restore_or_warmstart(resume=False)
        emb = np.asarray(warmstart._embedding(t.state.params))
        return emb, warmstart.case_pairs(t.tokenizer.vocab()), warmstart.cache_key(c)
    finally:
        t.close()


def test_warm_start_saves_rows_that_share_one_vector_per_case(tmp_path):
    emb, pairs, key_on = _warm_embedding(tmp_path / "on", True)
    assert len(pairs.cased) > 100  # the embedded vocabulary has cased twins of its words
    diff = emb[pairs.cased] - emb[pairs.lower]
    for kind in range(len(warmstart.CASE_KINDS)):
        d = diff[pairs.kind == kind]
        assert len(d) > 10
        np.testing.assert_allclose(d, np.broadcast_to(d[0], d.shape), atol=1e-5)
        assert np.linalg.norm(d[0]) > 1e-3
    off, _, key_off = _warm_embedding(tmp_path / "off", False)
    d_off = off[pairs.cased] - off[pairs.lower]
    assert np.abs(d_off - d_off[0]).max() > 1e-2  # untied rows are independent
    assert key_on != key_off  # a cached warm start is never reused across the two


def test_tie_case_refuses_a_pretrained_checkpoint(tmp_path):
    c = grpo.get_config("smoke")
    c.model.name = str(tmp_path)  # an existing directory: a checkpoint
    with pytest.raises(ValueError, match=r"config\.warmstart\.tie_case"):
        common.validate_config(c, num_devices=8)
    c.warmstart.tie_case = False
    common.validate_config(c, num_devices=8)
    c.warmstart.tie_case, c.warmstart.steps = True, 0  # no warm start: nothing is tied
    common.validate_config(c, num_devices=8)


def test_tie_case_refuses_an_untied_lm_head():
    class Vocab:
        def vocab(self):
            return {"cairo": 0, "CAIRO": 1}

    c = grpo.get_config("smoke")
    params = {
        "embed": {"embedding": jnp.zeros((4, 2))},
        "lm_head": {"kernel": jnp.zeros((2, 4))},
    }
    with pytest.raises(ValueError, match=r"config\.warmstart\.tie_case: .*untied lm_head"):
        warmstart._case_pairs_for(c, Vocab(), params)
    del params["lm_head"]
    assert warmstart._case_pairs_for(c, Vocab(), params).cased.tolist() == [1]
