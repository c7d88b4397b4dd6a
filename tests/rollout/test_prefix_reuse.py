"""Prefix reuse (rollout/prefix_reuse.py): kept KV caches give the tokens and log-probs of a full
re-prefill, across turns, ragged lengths, episodes ending at different turns, weight swaps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

# Few buckets, so the file compiles few programs (each sampling kernel takes seconds to compile):
# a session's first turn is a fresh cache of 32 + N_NEW - 1 slots, every later turn of these
# episodes (at most 128 tokens) a cache of 128 + N_NEW - 1; five conversations take the 8-row
# bucket, four or fewer the 4-row one.
CFG = JaxEngineConfig(prompt_buckets=(32, 128), batch_buckets=(4, 8), pad_id=0)
# The re-prefill reference: every call in one shape (the bucket does not change the samples).
REF_CFG = JaxEngineConfig(prompt_buckets=(128,), batch_buckets=(8,), pad_id=0)
STOPS = tuple(range(1, 13))  # 12 of 128 ids stop a turn: turns end at ragged lengths
N_NEW = 10
LOGP_ATOL = 2e-6  # float32 summation order only (module docstring); a real bug is >> 1e-3


def _model(seed: int) -> Qwen3ForCausalLM:
    """Tiny Qwen3 with sharpened weights (the 0.02 init is near-uniform), so greedy paths and
    log-probs depend clearly on the context."""
    model = Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(seed))
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed + 100), len(jax.tree.leaves(state))))
    state = jax.tree.map(
        lambda p: (
            p + 0.08 * jax.random.normal(next(keys), p.shape, jnp.float32) if p.ndim == 2 else p
        ),
        state,
    )
    nnx.update(model, state)
    return model


@pytest.fixture(scope="module")
def engine():
    eng = JaxEngine(_model(0), CFG, weight_version=1)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference():
    """The same weights and version as `engine`, for the stateless re-prefill of every turn."""
    eng = JaxEngine(_model(0), REF_CFG, weight_version=1)
    yield eng
    eng.close()


def _episodes(engine, params, *, reuse, turns=(4, 2, 5, 3, 1), step=0, session=None):
    """Synthetic multi-turn episodes: episode e lives turns[e] turns; between turns its
    conversation grows by the model's tokens and an 'observation' of ragged length (fixed by
    (e, turn), independent of the path). Returns per episode the list of (tokens, logps, finish),
    and the session used (None without reuse)."""
    rs = np.random.RandomState(11)
    convs = [list(rs.randint(13, 128, rs.randint(3, 14))) for _ in turns]
    out = [[] for _ in turns]
    own = session is None and reuse
    if own:
        session = engine.prefix_session()
    for k in range(max(turns)):
        live = [e for e, n in enumerate(turns) if n > k]
        reqs = [
            GenerationRequest(
                tuple(convs[e]), f"e{e}/t{k}", step=step, task_index=e, sample_offset=k
            )
            for e in live
        ]
        if reuse:
            gens = session.generate(reqs, params, [f"e{e}" for e in live])
        else:
            gens = engine.generate(reqs, params)
        for e, (g,) in zip(live, gens):
            out[e].append((g.token_ids, g.logprobs, g.finish_reason, g.weight_version))
            obs = np.random.RandomState(1000 * e + k).randint(13, 128, 1 + (5 * e + 3 * k) % 9)
            convs[e] += list(g.token_ids) + [int(x) for x in obs]
    if own:
        session.close()
    return out, session


def _assert_same(a, b):
    for ea, eb in zip(a, b, strict=True):
        assert len(ea) == len(eb)
        for (ta, la, fa, va), (tb, lb, fb, vb) in zip(ea, eb, strict=True):
            assert ta == tb and fa == fb and va == vb
            np.testing.assert_allclose(la, lb, atol=LOGP_ATOL, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_reuse_equals_full_reprefill(engine, reference, temperature):
    params = SamplingParams(max_new_tokens=N_NEW, temperature=temperature, stop_token_ids=STOPS)
    session = engine.prefix_session()
    on, _ = _episodes(engine, params, reuse=True, session=session)
    off, _ = _episodes(reference, params, reuse=False)
    _assert_same(on, off)
    # The workload is what it claims: ragged turns (stops and lengths), history reused.
    lengths = [len(t) for ep in on for t, *_ in ep]
    finishes = {f for ep in on for _, _, f, _ in ep}
    assert finishes == {"stop", "length"} and len(set(lengths)) >= (2 if temperature == 0 else 4)
    assert session.stats["reused_tokens"] > session.stats["prefilled_tokens"]
    # Only the episode still live at the last turn keeps a cache; close frees it.
    assert session.num_conversations == 1
    session.close()
    assert session.num_conversations == 0


def test_reuse_with_filtering_and_min_new_tokens(engine, reference):
    params = SamplingParams(
        max_new_tokens=N_NEW,
        temperature=0.8,
        top_p=0.9,
        top_k=20,
        min_new_tokens=2,
        stop_token_ids=STOPS,
    )
    on, _ = _episodes(engine, params, reuse=True, turns=(3, 2, 3))
    off, _ = _episodes(reference, params, reuse=False, turns=(3, 2, 3))
    _assert_same(on, off)


def test_diverging_prompt_reuses_only_the_shared_prefix(engine, reference):
    params = SamplingParams(max_new_tokens=N_NEW, temperature=1.0)
    a = GenerationRequest(tuple(range(20, 40)), "a", task_index=0)
    with engine.prefix_session() as s:
        (g,) = s.generate([a], params, ["x"])[0]
        # Edit the middle of the conversation, and also resend the exact cached tokens.
        edited = a.prompt_ids[:10] + (99,) + a.prompt_ids[11:] + g.token_ids
        b = GenerationRequest(edited, "b", task_index=0, sample_offset=1)
        c = GenerationRequest(a.prompt_ids + g.token_ids[:-1], "c", task_index=1)
        got = s.generate([b, c], params, ["x", "y"])
        assert s.stats["reused_tokens"] == 10  # b reuses 10 tokens; y was never cached
        got2 = s.generate([c], params, ["y"])
        assert s.stats["reused_tokens"] == 10 + len(c.prompt_ids) - 1
    want = reference.generate([b, c], params)

    def rows(gens):
        return [[(g.token_ids, g.logprobs, g.finish_reason, g.weight_version)] for (g,) in gens]

    _assert_same(rows(got + got2), rows(want + [want[1]]))


def test_weight_swap_invalidates_kept_caches_and_programs_are_per_bucket():
    """A fresh engine counts its compiled programs: one per bucket, not per turn (the turns'
    ragged cache offsets are traced), and a second rollout or a weight swap compiles nothing.
    After the swap, the kept caches are dropped: the episodes equal a fresh engine's."""
    params = SamplingParams(max_new_tokens=N_NEW, temperature=1.0, stop_token_ids=STOPS)
    other = _model(5)
    fresh = JaxEngine(other, REF_CFG, weight_version=2)
    eng = JaxEngine(_model(0), CFG, weight_version=1)
    with eng.prefix_session() as s:
        first, _ = _episodes(eng, params, reuse=True, session=s)  # caches kept for live episodes
        assert s.num_conversations > 0
        # Five turns, 5 then 4, 3, 2, 1 conversations (batch buckets 8 then 4), the cache
        # growing from 41 to 137 slots: one fresh cache, one extend per (rows, cache) bucket,
        # one relayout per (old, new) bucket pair -- 5 programs for 15 turn-kernel calls.
        assert eng.num_traces == 5, eng.num_traces
        again, _ = _episodes(eng, params, reuse=True)  # a second rollout: nothing new
        assert eng.num_traces == 5
        _assert_same(again, first)
        eng.update_weights(other, 2)
        # Same conversations again (same keys, same prompts): every cached prefix would match.
        after, _ = _episodes(eng, params, reuse=True, session=s, step=1)
        assert s.stats["invalidations"] == 1
    assert eng.num_traces == 5
    want, _ = _episodes(fresh, params, reuse=False, step=1)
    _assert_same(after, want)
    assert all(v == 2 for ep in after for *_, v in ep)


def test_sharded_session_equals_unsharded(reference):
    """Rows and kept caches split over ("data", "fsdp") of an 8-device mesh, parameters sharded
    as in training: the same episodes as the 1-device engine's re-prefill."""
    from rubric_rl.core.sharding import make_mesh, shard_model

    mesh = make_mesh(data=2, fsdp=4, tensor=1)
    sharded = JaxEngine(shard_model(_model(0), mesh), CFG, mesh=mesh, weight_version=1)
    params = SamplingParams(max_new_tokens=N_NEW, temperature=1.0, stop_token_ids=STOPS)
    got, _ = _episodes(sharded, params, reuse=True, turns=(3, 1, 2))
    want, _ = _episodes(reference, params, reuse=False, turns=(3, 1, 2))
    for ea, eb in zip(got, want, strict=True):
        for (ta, la, fa, _), (tb, lb, fb, _) in zip(ea, eb, strict=True):
            assert ta == tb and fa == fb
            np.testing.assert_allclose(la, lb, atol=1e-5, rtol=0)
