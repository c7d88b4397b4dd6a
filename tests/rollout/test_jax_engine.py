"""JaxEngine: trainer-equal log-probs, greedy = stepwise argmax, seeds, buckets, stops."""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.core.logprobs import sequence_logprobs
from rubric_rl.core.sharding import make_mesh, shard_model
from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rollout.jax_engine import (
    JaxEngine,
    JaxEngineConfig,
    filter_logits,
    sample_tokens,
    seed_key_data,
)
from rubric_rl.util.buckets import round_up_to_bucket

N_NEW = 12
# One bucket of each kind: every generate call below shares one compiled shape.
CFG = JaxEngineConfig(prompt_buckets=(32,), batch_buckets=(8,), pad_id=0)
PROMPT_LENS = (3, 9, 17, 5)


def _model(seed: int, preset: str = "tiny") -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM(PRESETS[preset], rngs=nnx.Rngs(seed))
    if model.config.attention_bias:  # Qwen2's q/k/v biases start at zero: make them matter
        for i, layer in enumerate(model.layers):
            for j, proj in enumerate((layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj)):
                key = jax.random.key(100 * seed + 3 * i + j)
                proj.bias[...] = 0.1 * jax.random.normal(key, proj.bias.shape)
    return model


@pytest.fixture(scope="module")
def engine():
    eng = JaxEngine(_model(0), CFG, weight_version=3)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def qwen2_engine():
    """The Qwen2 family (q/k/v biases, no q/k norm) in the same engine."""
    eng = JaxEngine(_model(0, "qwen2_tiny"), CFG, weight_version=3)
    yield eng
    eng.close()


@pytest.fixture(params=["qwen3", "qwen2"])
def family_engine(request):
    return request.getfixturevalue({"qwen3": "engine", "qwen2": "qwen2_engine"}[request.param])


def _requests(step=0, offset=0, lens=PROMPT_LENS):
    rs = np.random.RandomState(7)
    return [
        GenerationRequest(
            tuple(int(t) for t in rs.randint(1, 128, n)),
            f"r{i}",
            step=step,
            task_index=i,
            sample_offset=offset,
        )
        for i, n in enumerate(lens)
    ]


REF_LEN = 48  # one padded length for every reference call below: compiled once


@functools.partial(nnx.jit, static_argnames=("temperature",))
def _jit_trainer_logps(model, ids, mask, temperature):
    lp, _ = sequence_logprobs(model, ids, attention_mask=mask, temperature=temperature)
    return lp


def _trainer_logps(model, seqs, temperature):
    """The trainer's code (core.logprobs.sequence_logprobs) on right-padded sequences
    [(prompt, completion)]; returns each completion's log-probs."""
    ids = np.zeros((8, REF_LEN), np.int32)
    mask = np.zeros((8, REF_LEN), np.int32)
    for i, (p, c) in enumerate(seqs):
        ids[i, : len(p) + len(c)] = list(p) + list(c)
        mask[i, : len(p) + len(c)] = 1
    lp = np.asarray(_jit_trainer_logps(model, ids, mask, temperature))
    return [lp[i, len(p) - 1 : len(p) - 1 + len(c)] for i, (p, c) in enumerate(seqs)]


@nnx.jit
def _jit_logits(model, ids):
    return model(ids)


def _full_logits(model, seqs):
    """Full-forward logits (float64 on the host) of right-padded token sequences, in the one
    [8, REF_LEN] shape of every call (compiled once per model family)."""
    ids = np.zeros((8, REF_LEN), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return np.asarray(_jit_logits(model, jnp.asarray(ids)), np.float64)[: len(seqs)]


def test_logprobs_equal_trainer_and_score(family_engine):
    engine = family_engine
    reqs = _requests()
    gens = engine.generate(reqs, SamplingParams(max_new_tokens=N_NEW, temperature=0.7, n=2))
    model = engine.model()
    pairs = []
    for r, gs in zip(reqs, gens):
        assert len(gs) == 2
        for g in gs:
            assert g.weight_version == 3 and g.finish_reason == "length"
            assert len(g.token_ids) == N_NEW
            pairs.append((r.prompt_ids, g.token_ids))
    flat = [g for gs in gens for g in gs]
    ref = _trainer_logps(model, pairs, 0.7)
    for g, want in zip(flat, ref):
        np.testing.assert_allclose(g.logprobs, want, atol=1e-5, rtol=0)
    scored = engine.score(pairs, temperature=0.7)
    for g, s in zip(flat, scored):
        np.testing.assert_allclose(s, g.logprobs, atol=1e-5, rtol=0)
    # the temperature is applied: T = 1 log-probs of the same tokens differ
    assert not np.allclose(_trainer_logps(model, pairs[:1], 1.0)[0], flat[0].logprobs, atol=1e-3)


def test_greedy_equals_stepwise_argmax_of_full_forward(family_engine):
    engine = family_engine
    reqs = _requests()
    gens = engine.generate(reqs, SamplingParams(max_new_tokens=N_NEW, temperature=0.0))
    model = engine.model()
    seqs = [list(r.prompt_ids) for r in reqs]
    want = [[] for _ in reqs]
    want_lp = [[] for _ in reqs]
    for _ in range(N_NEW):  # one full forward per step over right-padded rows
        logits = _full_logits(model, seqs)
        for i, s in enumerate(seqs):
            row = logits[i, len(s) - 1]
            tok = int(np.argmax(row))
            lse = np.log(np.sum(np.exp(row - row.max()))) + row.max()
            want[i].append(tok)
            want_lp[i].append(row[tok] - lse)  # greedy: T = 1 log-probs
            s.append(tok)
    for (g,), w, wl in zip(gens, want, want_lp):
        assert list(g.token_ids) == w
        np.testing.assert_allclose(g.logprobs, wl, atol=1e-5, rtol=0)
    assert len({t for w in want for t in w}) > 2  # not a degenerate constant output


def test_seeds_reproduce_and_group_members_differ(engine):
    sp = SamplingParams(max_new_tokens=N_NEW, temperature=1.0, n=2)
    reqs = _requests(lens=(6, 6))
    # identical prompts: samples can differ only through their seeds
    reqs = [GenerationRequest(reqs[0].prompt_ids, f"q{i}", task_index=5, sample_offset=2 * i)
            for i in range(2)]  # fmt: skip
    a = engine.generate(reqs, sp)
    b = engine.generate(reqs, sp)
    toks_a = [g.token_ids for gs in a for g in gs]
    assert toks_a == [g.token_ids for gs in b for g in gs]
    assert [g.logprobs for gs in a for g in gs] == [g.logprobs for gs in b for g in gs]
    assert len(set(toks_a)) == 4  # four distinct sample indices of one task
    assert [g.seed for gs in a for g in gs] == list(reqs[0].seeds(2) + reqs[1].seeds(2))
    # another step: other seeds, other samples
    c = engine.generate(
        [GenerationRequest(r.prompt_ids, r.request_id, step=1, task_index=5,
                           sample_offset=r.sample_offset) for r in reqs], sp
    )  # fmt: skip
    assert [g.token_ids for gs in c for g in gs] != toks_a


def test_no_recompilation_and_weight_swap(engine):
    sp = SamplingParams(max_new_tokens=N_NEW, temperature=0.0)
    engine.generate(_requests(), sp)  # make sure this shape is compiled
    before = engine.num_traces
    g1 = engine.generate(_requests(lens=(4, 30, 2)), sp)  # other lengths, same buckets
    engine.generate(_requests(step=9), SamplingParams(max_new_tokens=N_NEW, temperature=1.3))
    engine.generate(
        _requests(), SamplingParams(max_new_tokens=N_NEW, temperature=0.5, stop_token_ids=(7, 9))
    )
    other = _model(1)
    engine.update_weights(nnx.state(other, nnx.Param), version=4)
    assert engine.weight_version == 4
    assert (
        engine.model().embed.embedding[...]
        is nnx.state(other, nnx.Param)["embed"]["embedding"].get_value()
    )  # a reference, not a copy
    g2 = engine.generate(_requests(lens=(4, 30, 2)), sp)
    assert engine.num_traces == before  # nothing recompiled
    assert all(g[0].weight_version == 4 for g in g2)
    assert [g[0].token_ids for g in g1] != [g[0].token_ids for g in g2]
    g3 = engine.generate(_requests(lens=(4, 30, 2)), sp)
    assert [g[0].token_ids for g in g3] == [g[0].token_ids for g in g2]
    # a TrainState-like object (.params, .rest) and a module are accepted too
    engine.update_weights(types.SimpleNamespace(params=nnx.state(_model(0), nnx.Param)), 5)
    g4 = engine.generate(_requests(lens=(4, 30, 2)), sp)
    assert [g[0].token_ids for g in g4] == [g[0].token_ids for g in g1]
    engine.update_weights(_model(0), version=5)  # back to the fixture's weights
    with pytest.raises(ValueError, match="parameter tree differs"):
        engine.update_weights({"x": jnp.zeros(3)}, version=6)


def test_top_k_one_equals_greedy(engine):
    reqs = _requests()
    greedy = engine.generate(reqs, SamplingParams(max_new_tokens=N_NEW, temperature=0.0))
    topk = engine.generate(reqs, SamplingParams(max_new_tokens=N_NEW, temperature=1.0, top_k=1))
    assert [g[0].token_ids for g in topk] == [g[0].token_ids for g in greedy]
    # log-probs stay those of the FULL distribution at T (not the renormalised top-1 = 0)
    assert all(max(g[0].logprobs) < -1e-3 for g in topk)


def _stop_case(engine):
    reqs = _requests()
    greedy = engine.generate(reqs, SamplingParams(max_new_tokens=N_NEW, temperature=0.0))
    row0 = greedy[0][0].token_ids
    stop = row0[4]
    out = engine.generate(
        reqs, SamplingParams(max_new_tokens=N_NEW, temperature=0.0, stop_token_ids=(stop,))
    )
    for (g,), (full,) in zip(out, greedy):
        toks = full.token_ids
        if stop in toks:
            k = toks.index(stop)
            assert g.finish_reason == "stop" and g.token_ids == toks[: k + 1]
            assert g.logprobs == pytest.approx(full.logprobs[: k + 1], abs=1e-6)
        else:
            assert g.finish_reason == "length" and g.token_ids == toks
    assert out[0][0].finish_reason == "stop" and len(out[0][0].token_ids) <= 5
    return stop, out


def test_stop_tokens_end_rows(engine):
    _stop_case(engine)


def test_sharded_engine_with_config_eos_matches(engine):
    """Rows split over ("data", "fsdp") of an 8-device mesh, parameters sharded as in training:
    same tokens as the 1-device engine; eos ids from the config stop like stop_token_ids."""
    stop, want = _stop_case(engine)
    mesh = make_mesh(data=2, fsdp=4, tensor=1)
    model = shard_model(_model(0), mesh)
    cfg = JaxEngineConfig(prompt_buckets=(32,), batch_buckets=(8,), eos_token_ids=(stop,))
    sharded = JaxEngine(model, cfg, mesh=mesh)
    got = sharded.generate(_requests(), SamplingParams(max_new_tokens=N_NEW, temperature=0.0))
    assert [g[0].token_ids for g in got] == [g[0].token_ids for g in want]
    assert [g[0].finish_reason for g in got] == [g[0].finish_reason for g in want]
    for (g,), (w,) in zip(got, want):
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    sharded.close()
    assert not sharded.health()
    with pytest.raises(RuntimeError, match="closed"):
        sharded.generate(_requests(), SamplingParams(max_new_tokens=N_NEW))


# ----------------------------------------------------------------------------- pure pieces


def _np_filter(scaled, top_p, top_k):
    out = np.full_like(scaled, -np.inf)
    for b in range(scaled.shape[0]):
        order = np.argsort(-scaled[b], kind="stable")
        k = top_k if top_k > 0 else scaled.shape[1]
        keep = order[:k]
        z = scaled[b, keep]
        p = np.exp(z - z.max())
        p /= p.sum()
        mass_before = np.cumsum(p) - p
        keep = keep[mass_before < top_p]
        out[b, keep] = scaled[b, keep]
    return out


@pytest.mark.parametrize(
    "top_p,top_k", [(1.0, 0), (0.9, 0), (0.5, 0), (1.0, 5), (0.7, 10), (0.3, 1)]
)
def test_filter_logits_matches_numpy(top_p, top_k):
    scaled = np.random.RandomState(0).randn(4, 40).astype(np.float32) * 2
    got = np.asarray(filter_logits(jnp.asarray(scaled), jnp.float32(top_p), jnp.int32(top_k)))
    np.testing.assert_array_equal(got, _np_filter(scaled, top_p, top_k))


def test_sample_tokens_logps_and_frequencies():
    rs = np.random.RandomState(1)
    logits = rs.randn(1, 6).astype(np.float32)
    keys = jax.random.split(jax.random.key(0), 4000)
    toks, lps = jax.jit(jax.vmap(
        lambda k: sample_tokens(
            jnp.asarray(logits), k[None], jnp.float32(0.5), jnp.float32(1.0), jnp.int32(0),
            filtering=False,
        )
    ))(keys)  # fmt: skip
    z = logits[0] / 0.5
    ref = z - np.log(np.exp(z).sum())
    toks, lps = np.asarray(toks)[:, 0], np.asarray(lps)[:, 0]
    np.testing.assert_allclose(lps, ref[toks], atol=1e-6)
    freq = np.bincount(toks, minlength=6) / len(toks)
    np.testing.assert_allclose(freq, np.exp(ref), atol=0.03)


def test_buckets_and_seed_key_data():
    assert round_up_to_bucket(5, (4, 8, 16)) == 8
    assert round_up_to_bucket(16, (4, 8, 16)) == 16
    assert round_up_to_bucket(17, (4, 8, 16)) == 32
    assert round_up_to_bucket(3, (1, 2, 4), multiple=8) == 8
    seed = (1 << 62) + 12345
    kd = seed_key_data([seed, 7])
    assert kd.dtype == np.uint32
    assert (int(kd[0, 0]) << 32) | int(kd[0, 1]) == seed
    assert kd[1].tolist() == [0, 7]
    with pytest.raises(ValueError, match="prompt_buckets"):
        JaxEngineConfig(prompt_buckets=(64, 32))


# ----------------------------------------------------------------------------- min_new_tokens,
# ignore_eos

STOPS16 = tuple(range(100, 116))  # an eighth of the tiny vocabulary: rows stop early
# Today's outputs with the defaults (recorded before min_new_tokens / ignore_eos existed):
# _requests(step=3), T = 1, n = 2, stop_token_ids = STOPS16.
GOLDEN_TOKENS = [
    [34, 17, 119, 118, 3, 105],
    [83, 74, 77, 57, 67, 111],
    [21, 83, 126, 126, 106],
    [121, 38, 64, 79, 80, 122, 32, 84, 36, 84, 99, 85],
    [114],
    [74, 115],
    [49, 27, 63, 85, 62, 52, 20, 100],
    [26, 42, 59, 90, 82, 64, 95, 110],
]
GOLDEN_FINISH = ["stop"] * 3 + ["length"] + ["stop"] * 4


def _flat(gens):
    return [g for gs in gens for g in gs]


def test_defaults_sample_exactly_as_before(engine):
    sp = SamplingParams(max_new_tokens=N_NEW, temperature=1.0, n=2, stop_token_ids=STOPS16)
    for params in (sp, dataclasses.replace(sp, min_new_tokens=0, ignore_eos=False)):
        got = _flat(engine.generate(_requests(step=3), params))
        assert [list(g.token_ids) for g in got] == GOLDEN_TOKENS
        assert [g.finish_reason for g in got] == GOLDEN_FINISH


def test_sampling_params_check_min_new_tokens_and_ignore_eos():
    with pytest.raises(ValueError, match=r"min_new_tokens must be in \[0, max_new_tokens=4\]"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5)
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams(max_new_tokens=4, min_new_tokens=-1)
    with pytest.raises(TypeError, match="ignore_eos must be a bool"):
        SamplingParams(max_new_tokens=4, ignore_eos=1)


def test_min_new_tokens_keeps_stops_out_and_logprobs_trainer_exact(engine):
    m = 5
    reqs = _requests(step=3)
    base = SamplingParams(max_new_tokens=N_NEW, temperature=1.0, n=2, stop_token_ids=STOPS16)
    free = _flat(engine.generate(reqs, base))
    assert sum(len(g.token_ids) <= m for g in free) >= 3  # without it rows stop early
    before = engine.num_traces
    got = _flat(engine.generate(reqs, dataclasses.replace(base, min_new_tokens=m)))
    assert engine.num_traces == before  # a traced mask: nothing recompiled
    for g in got:
        assert not set(g.token_ids[:m]) & set(STOPS16)
        assert len(g.token_ids) >= m + 1
        assert (g.finish_reason == "stop") == (g.token_ids[-1] in STOPS16)
    assert sum(g.finish_reason == "stop" for g in got) >= 3  # stops still end rows after m
    # The returned log-probs are the trainer's full-vocabulary ones of the sampled tokens ...
    pairs = [(reqs[i // 2].prompt_ids, g.token_ids) for i, g in enumerate(got)]
    model = engine.model()
    for g, want in zip(got, _trainer_logps(model, pairs, 1.0)):
        np.testing.assert_allclose(g.logprobs, want, atol=1e-5, rtol=0)
    for g, s in zip(got, engine.score(pairs, temperature=1.0)):
        np.testing.assert_allclose(s, g.logprobs, atol=1e-5, rtol=0)
    # ... not those of the masked distribution the first m tokens were drawn from, which are
    # higher by -log(1 - p_stop).
    logits = _full_logits(model, [list(p) + list(c) for p, c in pairs])
    for i, ((p, c), g) in enumerate(zip(pairs, got)):
        rows = logits[i, len(p) - 1 : len(p) - 1 + m]
        probs = np.exp(rows - rows.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        p_stop = probs[:, list(STOPS16)].sum(-1)
        full = np.log(probs[np.arange(m), list(c[:m])])
        np.testing.assert_allclose(g.logprobs[:m], full, atol=1e-5)
        assert np.all(-np.log1p(-p_stop) > 0.02)  # the renormalised values would differ


def test_min_new_tokens_greedy_takes_the_best_non_stop_token(engine):
    reqs = _requests()[:1]
    greedy = engine.generate(reqs, SamplingParams(max_new_tokens=N_NEW, temperature=0.0))
    stop = greedy[0][0].token_ids[0]
    sp = SamplingParams(max_new_tokens=N_NEW, temperature=0.0, stop_token_ids=(stop,))
    (g,) = engine.generate(reqs, sp)[0]
    assert g.token_ids == (stop,) and g.finish_reason == "stop"
    (g,) = engine.generate(reqs, dataclasses.replace(sp, min_new_tokens=3))[0]
    assert stop not in g.token_ids[:3] and len(g.token_ids) >= 4
    prompt = reqs[0].prompt_ids
    row = _full_logits(engine.model(), [prompt])[0, len(prompt) - 1]
    second = int(np.argsort(-row)[1])
    assert int(np.argmax(row)) == stop and g.token_ids[0] == second
    lse = np.log(np.sum(np.exp(row - row.max()))) + row.max()
    assert g.logprobs[0] == pytest.approx(row[second] - lse, abs=1e-5)  # full-vocabulary, T = 1


def test_ignore_eos_runs_every_row_to_max_new_tokens():
    """EOS ids from the engine config and the call's stop ids: with ignore_eos no row ends early,
    and each row's tokens up to its first stop are the ones it samples without ignore_eos."""
    cfg = JaxEngineConfig(prompt_buckets=(32,), batch_buckets=(8,), eos_token_ids=STOPS16[:8])
    eng = JaxEngine(_model(0), cfg)
    reqs = _requests(step=3)
    base = SamplingParams(max_new_tokens=N_NEW, temperature=1.0, n=2, stop_token_ids=STOPS16[8:])
    free = _flat(eng.generate(reqs, base))
    assert sum(g.finish_reason == "stop" for g in free) >= 4
    before = eng.num_traces
    got = _flat(eng.generate(reqs, dataclasses.replace(base, ignore_eos=True)))
    assert eng.num_traces == before
    assert all(len(g.token_ids) == N_NEW and g.finish_reason == "length" for g in got)
    mid = [g for g in got if set(g.token_ids[:-1]) & set(STOPS16)]
    assert len(mid) >= 4  # stop and EOS tokens sampled mid-row did not end it
    for f, g in zip(free, got):
        assert g.token_ids[: len(f.token_ids)] == f.token_ids
    pairs = [(reqs[i // 2].prompt_ids, g.token_ids) for i, g in enumerate(got)]
    for g, s in zip(got, eng.score(pairs, temperature=1.0)):
        np.testing.assert_allclose(s, g.logprobs, atol=1e-5, rtol=0)
    eng.close()


def test_sample_tokens_banned_renormalises_the_draw_not_the_logprob():
    rs = np.random.RandomState(2)
    logits = rs.randn(1, 6).astype(np.float32)
    banned = jnp.asarray([[False, True, False, False, True, False]])
    keys = jax.random.split(jax.random.key(1), 4000)
    toks, lps = jax.jit(jax.vmap(
        lambda k: sample_tokens(
            jnp.asarray(logits), k[None], jnp.float32(1.0), jnp.float32(1.0), jnp.int32(0),
            filtering=False, banned=banned,
        )
    ))(keys)  # fmt: skip
    toks, lps = np.asarray(toks)[:, 0], np.asarray(lps)[:, 0]
    full = logits[0] - np.log(np.exp(logits[0]).sum())
    np.testing.assert_allclose(lps, full[toks], atol=1e-6)
    freq = np.bincount(toks, minlength=6) / len(toks)
    renorm = np.where(np.asarray(banned[0]), 0.0, np.exp(full))
    np.testing.assert_allclose(freq, renorm / renorm.sum(), atol=0.03)
    assert freq[1] == 0 and freq[4] == 0


def test_snapshot_serves_the_frozen_parameters_after_an_update(tmp_path):
    """A second parameter set (ARISE-RL's frozen solver): a snapshot is a copy, ``serving``
    samples from it inside the block and the live weights after it, and it is rebuilt from its
    parts (what a checkpoint keeps: a resumed run gets it back)."""
    eng = JaxEngine(_model(0), CFG, weight_version=3)
    sp = SamplingParams(max_new_tokens=N_NEW, temperature=1.0)
    frozen_tokens = [g[0].token_ids for g in eng.generate(_requests(step=2), sp)]
    snap = eng.snapshot()
    # a copy: deleting the buffers it was taken from (as a donating train step does) leaves it
    jax.tree.map(lambda x: x.delete(), nnx.state(eng.model(), nnx.Param))
    eng.update_weights(nnx.state(_model(1), nnx.Param), version=4)
    now = [g[0].token_ids for g in eng.generate(_requests(step=2), sp)]
    assert now != frozen_tokens
    with eng.serving(snap):
        held = eng.generate(_requests(step=2), sp)
    assert [g[0].token_ids for g in held] == frozen_tokens
    assert {g[0].weight_version for g in held} == {3}
    assert [g[0].token_ids for g in eng.generate(_requests(step=2), sp)] == now
    params, version = eng.snapshot_parts(snap)
    assert version == 3
    loaded = eng.snapshot_of(jax.tree.map(np.asarray, params), version)
    assert loaded[2] == 3
    with eng.serving(loaded):
        again = [g[0].token_ids for g in eng.generate(_requests(step=2), sp)]
    assert again == frozen_tokens
    eng.close()
