"""Training only the top N layers (core/frozen_layers.py, ``train.trainable_layers``): the trained
parameters' gradients equal the full backward's, the frozen ones get none and never move, and
the backward of the frozen layers is not built at all."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.core import sharding
from rubric_rl.core import train_step as ts
from rubric_rl.core.frozen_layers import frozen_mask
from rubric_rl.models import Qwen3Config, Qwen3ForCausalLM

# Untied, so the LM head (trained) and the embedding (frozen) are separate parameters.
CFG = Qwen3Config(96, 32, 64, 4, 4, 2, 8, tie_word_embeddings=False, model_type="llama")
B, T = 4, 12
BASE = ts.TrainConfig(lr=1e-2, weight_decay=0.1, chunk_size=6)
# Tiny programs: XLA optimisation buys nothing here and halves the compile time.
FAST = {"xla_backend_optimization_level": 0}


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    lm = np.zeros((B, T), np.float32)
    lm[:, 3 : T - 1] = 1
    return ts.TrainBatch(
        input_ids=rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32),
        positions=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
        attention_mask=np.ones((B, T), np.int32),
        loss_mask=lm,
        rollout_logps=-rng.uniform(0.5, 6.0, (B, T)).astype(np.float32),
        advantages=rng.normal(size=B).astype(np.float32),
        seq_weights=np.ones(B, np.float32),
    )


def _flat(tree):
    """{"a/b/c": leaf} of a params-like pytree (Variables unwrapped)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}


def _frozen_names(params, n):
    mask = jax.tree_util.tree_flatten_with_path(frozen_mask(params, n))[0]
    return {jax.tree_util.keystr(p).replace(".value", "") for p, f in mask if f}


@pytest.fixture(scope="module")
def state():
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0))
    graphdef, st = ts.init_train_state(model, BASE, mesh)
    return graphdef, st, mesh


def _loss_grads(graphdef, config, params, rest, batch):
    return jax.jit(
        lambda p, r, b: ts.loss_and_grads(config, graphdef, p, r, b), compiler_options=FAST
    )(params, rest, batch)


def test_trained_gradients_equal_the_full_backward_and_frozen_get_none(state):
    graphdef, st, _ = state
    batch = _batch()
    loss_full, g_full, _ = _loss_grads(graphdef, BASE, st.params, st.rest, batch)
    cfg2 = dataclasses.replace(BASE, trainable_layers=2)
    loss2, g2, _ = _loss_grads(graphdef, cfg2, st.params, st.rest, batch)
    assert float(loss2) == pytest.approx(float(loss_full), abs=1e-6)
    full, part = _flat(g_full), _flat(g2)
    frozen = {k for k in full if "embed" in k or "layers'][0]" in k or "layers'][1]" in k}
    assert frozen and len(frozen) < len(full)
    for k in full:
        if k in frozen:
            assert not part[k].any(), k  # exactly zero
            assert np.abs(full[k]).max() > 0, k  # ... where the full backward has a gradient
        else:
            np.testing.assert_allclose(part[k], full[k], atol=1e-6, rtol=1e-5, err_msg=k)
            assert np.abs(full[k]).max() > 0, k


def _dots(graphdef, config, st, batch):
    jaxpr = jax.make_jaxpr(lambda p, r, b: ts.loss_and_grads(config, graphdef, p, r, b))(
        st.params, st.rest, batch
    )
    return str(jaxpr).count("dot_general")


def test_the_frozen_layers_backward_is_not_built(state):
    """Each of the 2 frozen layers drops at least the weight- and input-gradient matmuls of its
    7 projections: 28 fewer dot_generals in the traced step (none if the freezing only zeroed
    the gradients)."""
    graphdef, st, _ = state
    batch = _batch()
    full = _dots(graphdef, BASE, st, batch)
    part = _dots(graphdef, dataclasses.replace(BASE, trainable_layers=2), st, batch)
    top1 = _dots(graphdef, dataclasses.replace(BASE, trainable_layers=1), st, batch)
    assert part <= full - 2 * 2 * 7
    assert top1 <= part - 2 * 7


def test_frozen_parameters_never_move(state):
    """Two steps with weight decay: frozen parameters bit for bit unchanged, the rest moved."""
    graphdef, st, mesh = state
    cfg = dataclasses.replace(BASE, trainable_layers=1)
    st = jax.tree.map(jnp.copy, st)  # the step donates its input: keep the fixture's
    before = _flat(st.params)
    frozen = _frozen_names(st.params, 1)
    step = ts.make_train_step(cfg, graphdef, mesh, compiler_options=FAST)
    for i in range(2):
        st, metrics = step(st, _batch(i))
    after = _flat(st.params)
    assert any("layers'][2]" in k for k in frozen) and not any("layers'][3]" in k for k in frozen)
    for k in before:
        if k.replace(".value", "") in frozen or k in frozen:
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)
        else:
            assert np.abs(after[k] - before[k]).max() > 0, k


def test_refusals():
    scanned = Qwen3ForCausalLM(dataclasses.replace(CFG, scan_layers=True), rngs=nnx.Rngs(0))
    params = nnx.state(scanned, nnx.Param)
    with pytest.raises(ValueError, match=r"trainable_layers=2: needs model\.scan_layers=False"):
        frozen_mask(params, 2)
    looped = nnx.state(Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0)), nnx.Param)
    with pytest.raises(ValueError, match=r"trainable_layers=5 > the model's 4 decoder layers"):
        frozen_mask(looped, 5)
    with pytest.raises(ValueError, match="trainable_layers must be an int >= 0"):
        ts.TrainConfig(trainable_layers=-1)
    from configs import common, grpo

    c = grpo.get_config("smoke")
    c.train.trainable_layers = 1
    common.validate_config(c, num_devices=8)
    c.model.scan_layers = True
    with pytest.raises(ValueError, match=r"config\.train\.trainable_layers: needs"):
        common.validate_config(c, num_devices=8)
