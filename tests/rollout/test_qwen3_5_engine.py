"""JaxEngine decoding a hybrid Qwen3.5 model: KV cache for the full-attention layers,
conv + recurrent state for the Gated DeltaNet ones, through the engine's unchanged code path
(`model.init_cache` / `model.decode`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import QWEN3_5_PRESETS, Qwen3_5ForCausalLM
from rubric_rl.models.qwen3_5_config import interval_layer_types
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

N_NEW = 8
REF_LEN = 48
# Generated tokens go through the recurrent Gated DeltaNet step, the full forward through the
# chunked form: equal up to float32 rounding (the goal is 1e-5, not met for hybrid models).
LOGP_ATOL = 5e-5
CFG = JaxEngineConfig(prompt_buckets=(32,), batch_buckets=(8,), pad_id=0)
# qwen3_5_tiny cut to [linear, full]: one layer of each kind holds every kind of cache entry the
# engine carries (K/V, conv and recurrent state). Deeper stacks' per-layer cache bookkeeping is
# the model's, checked against the full forward in tests/models/test_qwen3_5.py.
HYBRID = dataclasses.replace(
    QWEN3_5_PRESETS["qwen3_5_tiny"], num_hidden_layers=2, layer_types=interval_layer_types(2, 2)
)
PROMPT_LENS = (3, 9, 17, 5, 12, 7, 2, 20)  # eight rows: the batch bucket, ragged prompts


def _sharpened_model(seed: int) -> Qwen3_5ForCausalLM:
    """`HYBRID` with its matrices perturbed (normal(0, 0.02) init gives near-uniform logits,
    which would make greedy paths ties)."""
    model = Qwen3_5ForCausalLM(HYBRID, rngs=nnx.Rngs(seed))
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(state))))
    state = jax.tree.map(
        lambda p: p + 0.15 * jax.random.normal(next(keys), p.shape) if p.ndim == 2 else p, state
    )
    nnx.update(model, state)
    return model


def _requests() -> list[GenerationRequest]:
    rs = np.random.RandomState(11)
    return [
        GenerationRequest(tuple(int(t) for t in rs.randint(1, 128, n)), f"m{i}", step=0,
                          task_index=i)
        for i, n in enumerate(PROMPT_LENS)
    ]  # fmt: skip


GREEDY = SamplingParams(max_new_tokens=N_NEW, temperature=0.0)


@pytest.fixture(scope="module")
def one_device():
    """The 1-device engine's greedy samples: checked against the full forward below, and the
    reference of the mesh tests."""
    model = _sharpened_model(2)
    engine = JaxEngine(model, CFG, weight_version=1)
    try:
        gens = engine.generate(_requests(), GREEDY)
        scored = engine.score(
            [(r.prompt_ids, g[0].token_ids) for r, g in zip(_requests(), gens)], temperature=1.0
        )
    finally:
        engine.close()
    return model, gens, scored


def test_hybrid_greedy_equals_stepwise_argmax_and_logprobs(one_device):
    model, gens, scored = one_device
    assert {g[0].weight_version for g in gens} == {1}
    logits_fn = nnx.jit(lambda m, ids: m(ids))
    seqs = [list(r.prompt_ids) for r in _requests()]
    want, want_lp = [[] for _ in seqs], [[] for _ in seqs]
    for _ in range(N_NEW):  # one full forward per step over right-padded rows
        ids = np.zeros((len(seqs), REF_LEN), np.int32)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
        logits = np.asarray(logits_fn(model, jnp.asarray(ids)), np.float64)
        for i, s in enumerate(seqs):
            row = logits[i, len(s) - 1]
            tok = int(np.argmax(row))
            want[i].append(tok)
            want_lp[i].append(row[tok] - (np.log(np.exp(row - row.max()).sum()) + row.max()))
            s.append(tok)
    for (g,), w, wl, sc in zip(gens, want, want_lp, scored, strict=True):
        assert list(g.token_ids) == w
        np.testing.assert_allclose(g.logprobs, wl, atol=LOGP_ATOL, rtol=0)
        np.testing.assert_allclose(sc, wl, atol=1e-5, rtol=0)  # score: the full forward
    assert len({t for w in want for t in w}) > 2  # not a degenerate constant output
    assert len({tuple(w) for w in want}) > 1


@pytest.mark.parametrize("axes", [(2, 4, 1), (1, 2, 4)])
def test_hybrid_engine_on_a_mesh_equals_one_device(one_device, axes):
    """(data, fsdp, tensor) meshes of 8 CPU devices: rows split over (data, fsdp), the model
    sharded as in training (Gated DeltaNet heads over tensor, FSDP over fsdp) — the same greedy
    tokens as the 1-device engine, log-probs within the hybrid's float32 tolerance."""
    from rubric_rl.core.sharding import make_mesh, shard_model

    _, want, _ = one_device
    data, fsdp, tensor = axes
    mesh = make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    sharded = JaxEngine(shard_model(_sharpened_model(2), mesh), CFG, mesh=mesh)
    try:
        got = sharded.generate(_requests(), GREEDY)
    finally:
        sharded.close()
    assert [g[0].token_ids for g in got] == [w[0].token_ids for w in want]
    for (g,), (w,) in zip(got, want, strict=True):
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=LOGP_ATOL, rtol=0)
