"""Chunked log-probs / entropy / reverse KL == unchunked == numpy; memory; teacher alignment."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.core import logprobs as L
from rubric_rl.core.losses import generalized_jsd_from_logits
from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM

TEMP = 0.7
JSD_BETA = 0.3  # not 0.5: JSD_0.5 is symmetric, so a β bound to the wrong side would pass
# Tiny programs: XLA optimisation buys nothing here and halves the compile time.
FAST = {"xla_backend_optimization_level": 0}


def np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_stats(h, w, tgt, th, k):
    """Plain-numpy reference of every chunked output, at temperature TEMP (float64)."""
    a = np_log_softmax(h.astype(np.float64) @ w / TEMP)
    b = np_log_softmax(th.astype(np.float64) @ w / TEMP)
    lp = np.take_along_axis(a, tgt[..., None], -1)[..., 0]
    tlp = np.take_along_axis(b, tgt[..., None], -1)[..., 0]
    ent = -(np.exp(a) * a).sum(-1)
    kl = (np.exp(a) * (a - b)).sum(-1)
    idx = np.argsort(-a, -1)[..., :k]
    ak, bk = np.take_along_axis(a, idx, -1), np.take_along_axis(b, idx, -1)
    tail_s, tail_t = 1 - np.exp(ak).sum(-1), 1 - np.exp(bk).sum(-1)
    topk = (np.exp(ak) * (ak - bk)).sum(-1) + tail_s * np.log(tail_s / tail_t)
    ps, pt = np.exp(a), np.exp(b)
    m = JSD_BETA * pt + (1 - JSD_BETA) * ps
    jsd = JSD_BETA * (pt * np.log(pt / m)).sum(-1) + (1 - JSD_BETA) * (ps * np.log(ps / m)).sum(-1)
    return dict(logps=lp, teacher_logps=tlp, entropy=ent, kl_full=kl, kl_topk=topk, kl_jsd=jsd)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    b, t, d, v = 2, 13, 8, 50
    h = rng.normal(size=(b, t, d)).astype(np.float32)
    th = (h + 0.5 * rng.normal(size=(b, t, d))).astype(np.float32)
    w = rng.normal(size=(d, v)).astype(np.float32)
    tgt = rng.integers(0, v, (b, t))
    return h, th, w, tgt


@functools.partial(jax.jit, static_argnames=("chunk",), compiler_options=FAST)
def _chunked_outputs(h, th, w, tgt, *, chunk):
    """Every chunked output of one chunk size, as one program (eager, each call would compile
    its own scan and dispatch the rest op by op)."""
    full = L.chunked_token_stats(
        h, w, tgt, th, temperature=TEMP, chunk_size=chunk, with_entropy=True,
        kl_estimator="full", with_teacher_logps=True,
    )  # fmt: skip
    topk = L.reverse_kl_chunked(h, th, w, temperature=TEMP, estimator="topk", k=5, chunk_size=chunk)
    jsd = {
        beta: L.reverse_kl_chunked(
            h, th, w, temperature=TEMP, estimator="jsd", jsd_beta=beta, chunk_size=chunk
        )
        for beta in (JSD_BETA, 0.5, 1 - JSD_BETA)
    }
    lp, ent = L.token_logprobs(h, w, tgt, temperature=TEMP, chunk_size=chunk, with_entropy=True)
    lp1, _ = L.token_logprobs(h, w, tgt, temperature=1.0, chunk_size=chunk)
    return full, topk, jsd, lp, ent, lp1


@pytest.mark.parametrize("chunk", [1, 5, 100])  # 5 does not divide T = 13: padded
def test_chunked_matches_numpy(data, chunk):
    h, th, w, tgt = data
    ref = np_stats(h, w, tgt, th, k=5)
    full, topk, jsd, lp, ent, lp1 = _chunked_outputs(h, th, w, tgt, chunk=chunk)
    np.testing.assert_allclose(full["logps"], ref["logps"], atol=2e-5)
    np.testing.assert_allclose(lp, ref["logps"], atol=2e-5)
    np.testing.assert_allclose(full["teacher_logps"], ref["teacher_logps"], atol=2e-5)
    np.testing.assert_allclose(full["entropy"], ref["entropy"], atol=2e-5)
    np.testing.assert_allclose(ent, ref["entropy"], atol=2e-5)
    np.testing.assert_allclose(full["kl"], ref["kl_full"], atol=2e-5)
    np.testing.assert_allclose(topk, ref["kl_topk"], atol=2e-5)
    np.testing.assert_allclose(jsd[JSD_BETA], ref["kl_jsd"], atol=2e-5)
    # β reaches the estimator: its default (0.5) and the mirrored 0.7 give other values
    for other in (0.5, 1 - JSD_BETA):
        assert np.abs(np.asarray(jsd[other]) - ref["kl_jsd"]).max() > 1e-3
    assert full["logps"].shape == tgt.shape and full["logps"].dtype == jnp.float32
    # temperature really divides the logits: T = 1 gives different log-probs
    assert np.abs(np.asarray(lp1) - ref["logps"]).max() > 1e-2


@pytest.mark.default_codegen
def test_identical_teacher_gives_exactly_zero_kl(data):
    h, _, w, _ = data

    @functools.partial(jax.jit, compiler_options=FAST)
    def kls(h, w):
        return [
            L.reverse_kl_chunked(h, h, w, temperature=TEMP, estimator=est, k=5, chunk_size=4)
            for est in ("full", "topk", "jsd")
        ]

    for kl in kls(h, w):
        assert np.all(np.asarray(kl) == 0.0)


def _unchunked_objective(h, th, w, tgt, cw):
    """Same objective as `_chunked_objective`, from the full [B, T, V] logits (plain jnp)."""
    ls = jax.nn.log_softmax(h @ w / TEMP)
    lt = jax.lax.stop_gradient(jax.nn.log_softmax(th @ w / TEMP))
    lp = jnp.take_along_axis(ls, tgt[..., None], -1)[..., 0]
    ent = -jnp.sum(jnp.exp(ls) * ls, -1)
    kl = jnp.sum(jnp.exp(ls) * (ls - lt), -1)
    return jnp.sum(cw[0] * lp + cw[1] * ent + cw[2] * kl)


def _chunked_objective(h, th, w, tgt, cw, chunk):
    out = L.chunked_token_stats(
        h, w, tgt, th, temperature=TEMP, chunk_size=chunk, with_entropy=True, kl_estimator="full"
    )
    return jnp.sum(cw[0] * out["logps"] + cw[1] * out["entropy"] + cw[2] * out["kl"])


@pytest.mark.parametrize("chunk", [4, 13])
def test_gradients_chunked_equal_unchunked(data, chunk):
    h, th, w, tgt = data
    cw = np.random.default_rng(1).normal(size=(3,) + tgt.shape).astype(np.float32)

    @functools.partial(jax.jit, compiler_options=FAST)
    def grads(h, th, w, tgt, cw):  # both gradients, one program
        g_ref = jax.grad(_unchunked_objective, argnums=(0, 1, 2))(h, th, w, tgt, cw)
        return g_ref, jax.grad(_chunked_objective, argnums=(0, 1, 2))(h, th, w, tgt, cw, chunk)

    g_ref, g = grads(h, th, w, tgt, cw)
    np.testing.assert_allclose(g[0], g_ref[0], atol=2e-5)
    np.testing.assert_allclose(g[2], g_ref[2], atol=2e-5)
    # the teacher is under stop_gradient: no gradient reaches its hidden states
    assert np.all(np.asarray(g[1]) == 0.0) and np.all(np.asarray(g_ref[1]) == 0.0)
    assert np.abs(np.asarray(g_ref[0])).max() > 1e-3


@pytest.mark.parametrize("chunk", [4, 13])
def test_jsd_value_and_gradients_chunked_equal_unchunked(data, chunk):
    """The ``jsd`` estimator through the chunked LM-head pass == ``losses``' function on the
    full [B, T, V] logits, values and gradients (student hidden states and LM head)."""
    h, th, w, _ = data
    cw = np.random.default_rng(2).normal(size=h.shape[:2]).astype(np.float32)

    def unchunked(h, th, w):
        return generalized_jsd_from_logits(h @ w, th @ w, JSD_BETA, TEMP)

    def chunked(h, th, w):
        return L.reverse_kl_chunked(
            h, th, w, temperature=TEMP, estimator="jsd", jsd_beta=JSD_BETA, chunk_size=chunk
        )

    @functools.partial(jax.jit, compiler_options=FAST)
    def values_and_grads(h, th, w):  # one program
        g_ref = jax.grad(lambda *a: jnp.sum(cw * unchunked(*a)), argnums=(0, 1, 2))(h, th, w)
        g = jax.grad(lambda *a: jnp.sum(cw * chunked(*a)), argnums=(0, 1, 2))(h, th, w)
        return chunked(h, th, w), unchunked(h, th, w), g_ref, g

    got, want, g_ref, g = values_and_grads(h, th, w)
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(g[0], g_ref[0], atol=2e-5)
    np.testing.assert_allclose(g[2], g_ref[2], rtol=1e-4, atol=2e-5)
    assert np.all(np.asarray(g[1]) == 0.0)  # the teacher is under stop_gradient
    assert np.abs(np.asarray(g_ref[0])).max() > 1e-3


@pytest.mark.parametrize("chunk", [4, 13])
def test_external_teacher_head_of_another_hidden_size(data, chunk):
    """``teacher_unembed`` [D', V] with teacher hidden states [B, T, D'] (D' ≠ D): the teacher
    logits are ``th' @ W'`` — every output == numpy on the two models' logits; the student's
    gradients == the unchunked ones; none reaches the teacher (hidden states or head)."""
    h, _, w, tgt = data
    rng = np.random.default_rng(3)
    d2 = h.shape[-1] + 4
    th2 = rng.normal(size=h.shape[:2] + (d2,)).astype(np.float32)
    w2 = rng.normal(size=(d2, w.shape[1])).astype(np.float32)
    a = np_log_softmax(h.astype(np.float64) @ w / TEMP)
    b = np_log_softmax(th2.astype(np.float64) @ w2 / TEMP)
    cw = np.random.default_rng(4).normal(size=(3,) + tgt.shape).astype(np.float32)

    def unchunked(h, th, w, wt):
        ls = jax.nn.log_softmax(h @ w / TEMP)
        lt = jax.lax.stop_gradient(jax.nn.log_softmax(th @ wt / TEMP))
        lp = jnp.take_along_axis(ls, tgt[..., None], -1)[..., 0]
        ent = -jnp.sum(jnp.exp(ls) * ls, -1)
        kl = jnp.sum(jnp.exp(ls) * (ls - lt), -1)
        return jnp.sum(cw[0] * lp + cw[1] * ent + cw[2] * kl)

    def chunked(h, th, w, wt):
        o = L.chunked_token_stats(
            h, w, tgt, th, temperature=TEMP, chunk_size=chunk, with_entropy=True,
            kl_estimator="full", teacher_unembed=wt,
        )  # fmt: skip
        return jnp.sum(cw[0] * o["logps"] + cw[1] * o["entropy"] + cw[2] * o["kl"])

    @functools.partial(jax.jit, compiler_options=FAST)
    def outputs(h, th, w, wt):  # one program
        out = L.chunked_token_stats(
            h, w, tgt, th, temperature=TEMP, chunk_size=chunk, with_entropy=True,
            kl_estimator="full", with_teacher_logps=True, teacher_unembed=wt,
        )  # fmt: skip
        g_ref = jax.grad(unchunked, argnums=(0, 1, 2, 3))(h, th, w, wt)
        g = jax.grad(chunked, argnums=(0, 1, 2, 3))(h, th, w, wt)
        return out, chunked(h, th, w, wt), unchunked(h, th, w, wt), g_ref, g

    out, objective, objective_ref, g_ref, g = outputs(h, th2, w, w2)
    np.testing.assert_allclose(
        out["logps"], np.take_along_axis(a, tgt[..., None], -1)[..., 0], atol=2e-5
    )
    np.testing.assert_allclose(
        out["teacher_logps"], np.take_along_axis(b, tgt[..., None], -1)[..., 0], atol=2e-5
    )
    np.testing.assert_allclose(out["kl"], (np.exp(a) * (a - b)).sum(-1), atol=2e-5)
    # the student's own head would give another KL (the test can fail)
    self_kl = (np.exp(a) * (a - np_log_softmax(th2[..., : h.shape[-1]] @ w / TEMP))).sum(-1)
    assert np.abs(np.asarray(out["kl"]) - self_kl).max() > 1e-2

    np.testing.assert_allclose(objective, objective_ref, rtol=1e-5)
    np.testing.assert_allclose(g[0], g_ref[0], atol=2e-5)
    np.testing.assert_allclose(g[2], g_ref[2], atol=2e-5)
    assert np.all(np.asarray(g[1]) == 0.0) and np.all(np.asarray(g[3]) == 0.0)
    assert np.abs(np.asarray(g_ref[0])).max() > 1e-3


def test_external_teacher_vocab_mismatch_raises(data):
    h, th, w, tgt = data
    wt = np.zeros((h.shape[-1], w.shape[1] + 1), np.float32)
    with pytest.raises(
        ValueError, match=rf"vocabulary size {w.shape[1] + 1}.*student's {w.shape[1]}"
    ):
        L.chunked_token_stats(h, w, tgt, th, kl_estimator="full", teacher_unembed=wt)
    # a teacher of another hidden size needs its own head
    wide = np.concatenate([th, th], -1)
    with pytest.raises(ValueError, match="teacher_unembed"):
        L.chunked_token_stats(h, w, tgt, wide, kl_estimator="full")
    # the default (no teacher_unembed) is the self-teacher: the student's head
    same = L.chunked_token_stats(h, w, tgt, th, kl_estimator="full", teacher_unembed=w)
    default = L.chunked_token_stats(h, w, tgt, th, kl_estimator="full")
    np.testing.assert_array_equal(same["kl"], default["kl"])


def _temp_bytes(chunk, b, t, d, v, kl):
    def loss(h, th, w, tgt):
        out = L.chunked_token_stats(
            h, w, tgt, th if kl else None, temperature=TEMP, chunk_size=chunk,
            with_entropy=True, kl_estimator="full" if kl else None,
        )  # fmt: skip
        return jnp.sum(out["logps"]) + jnp.sum(out["entropy"]) + jnp.sum(out.get("kl", 0.0))

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 2)))
    shapes = (
        jax.ShapeDtypeStruct((b, t, d), jnp.float32),
        jax.ShapeDtypeStruct((b, t, d), jnp.float32),
        jax.ShapeDtypeStruct((d, v), jnp.float32),
        jax.ShapeDtypeStruct((b, t), jnp.int32),
    )
    return f.lower(*shapes).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("vocab,kl", [(32768, False), (32768, True), (65536, False)])
def test_memory_stays_under_a_quarter_of_full_logits(vocab, kl):
    b, t, d = 2, 256, 32
    quarter = b * t * vocab * 4 / 4
    chunked = _temp_bytes(8, b, t, d, vocab, kl)
    unchunked = _temp_bytes(t, b, t, d, vocab, kl)  # one chunk = the whole sequence
    assert chunked < quarter, (chunked, quarter)
    assert unchunked > quarter, (unchunked, quarter)  # the bound can fail


def test_layout_helpers():
    x = jnp.array([[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(L.token_to_prediction_layout(x), [[2, 3, 0], [5, 6, 0]])
    np.testing.assert_array_equal(L.shift_targets(x), [[2, 3, 0], [5, 6, 0]])
    teacher = jnp.arange(2 * 5).reshape(2, 5)
    got, valid = L.align_teacher(teacher, jnp.array([1, 3]), 3)
    np.testing.assert_array_equal(got, [[1, 2, 3], [8, 9, 9]])
    np.testing.assert_array_equal(valid, [[True, True, True], [True, True, False]])


def test_bad_arguments_raise(data):
    h, th, w, tgt = data
    with pytest.raises(ValueError, match="temperature"):
        L.token_logprobs(h, w, tgt, temperature=0.0)
    with pytest.raises(ValueError, match="teacher_hidden"):
        L.chunked_token_stats(h, w, tgt, None, kl_estimator="full")
    with pytest.raises(ValueError, match="advantage"):
        L.reverse_kl_chunked(h, th, w, estimator="sampled")
    with pytest.raises(KeyError, match="nope"):
        L.reverse_kl_chunked(h, th, w, estimator="nope")
    with pytest.raises(ValueError, match="beta"):
        L.reverse_kl_chunked(h, th, w, estimator="jsd", jsd_beta=1.5)


# One decoder layer: the model only has to produce hidden states and logits to align.
TINY = dataclasses.replace(PRESETS["tiny"], num_hidden_layers=1)


@pytest.fixture(scope="module")
def tiny_model():
    return nnx.split(Qwen3ForCausalLM(TINY, rngs=nnx.Rngs(0)))


def _run(tiny_model, fn, *args):
    """fn(model, *args) under one jit (eager NNX dispatches op by op: slow)."""
    graphdef, state = tiny_model
    return jax.jit(lambda st, *a: fn(nnx.merge(graphdef, st), *a), compiler_options=FAST)(
        state, *args
    )


def test_sequence_logprobs_matches_model_logits(tiny_model):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, TINY.vocab_size, (2, 9))
    mask = np.ones((2, 9), np.int32)
    mask[1, :3] = 0  # left padding

    def fn(model, ids, mask):
        lp, ent = L.sequence_logprobs(
            model, ids, None, mask, temperature=TEMP, chunk_size=4, with_entropy=True
        )
        return lp, ent, model(ids, None, mask)

    lp, ent, logits = _run(tiny_model, fn, ids, mask)
    a = np_log_softmax(np.asarray(logits, np.float64) / TEMP)
    ref = np.take_along_axis(a[:, :-1], ids[:, 1:, None], -1)[..., 0]  # position t -> token t+1
    np.testing.assert_allclose(lp[:, :-1], ref, atol=2e-5)
    np.testing.assert_allclose(ent[:, :-1], -(np.exp(a) * a).sum(-1)[:, :-1], atol=2e-5)
    assert np.all(np.asarray(lp[:, -1]) == 0.0)  # no target after the last token


def test_teacher_alignment_by_offset(tiny_model):
    """Teacher = prompt ⊕ context ⊕ completion; aligned teacher log-probs of the student's
    completion tokens equal a direct computation on the teacher sequence."""
    v = TINY.vocab_size
    rng = np.random.default_rng(3)
    prompt, completion = rng.integers(0, v, (2, 4)), rng.integers(0, v, (2, 6))
    contexts = [rng.integers(0, v, 3), rng.integers(0, v, 5)]
    student = np.concatenate([prompt, completion], 1)  # T = 10
    teacher = np.zeros((2, 15), np.int64)
    tmask = np.zeros((2, 15), np.int32)
    offsets = np.array([3, 5])
    for b in range(2):
        row = np.concatenate([prompt[b], contexts[b], completion[b]])
        teacher[b, : len(row)], tmask[b, : len(row)] = row, 1  # right padding

    def fn(model, student, teacher, tmask, offsets):
        hidden = model.hidden_states(student)
        th, valid = L.teacher_hidden_aligned(model, teacher, None, tmask, offsets, 10)
        out = L.chunked_token_stats(
            hidden, model.unembed(), L.shift_targets(student), th,
            temperature=TEMP, chunk_size=3, with_teacher_logps=True,
        )  # fmt: skip
        return out["teacher_logps"], valid, model(teacher, None, tmask)

    tlp, valid, logits = _run(tiny_model, fn, student, teacher, tmask, offsets)
    a = np_log_softmax(np.asarray(logits, np.float64) / TEMP)
    for b in range(2):
        for t in range(3, 9):  # positions predicting completion tokens 4..9
            tt = t + offsets[b]
            assert teacher[b, tt + 1] == student[b, t + 1]
            np.testing.assert_allclose(tlp[b, t], a[b, tt, teacher[b, tt + 1]], atol=2e-5)
    assert bool(np.all(valid))
    # a wrong offset would score other tokens
    assert abs(float(tlp[0, 5]) - a[0, 5, teacher[0, 6]]) > 1e-3
