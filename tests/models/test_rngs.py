"""`models.rngs.init_rngs`: the same initial parameters as `nnx.Rngs` under a trace,
without the per-draw error message that made tracing a model's construction quadratic."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import QWEN3_5_PRESETS, Qwen3_5ForCausalLM, Qwen3ForCausalLM
from rubric_rl.models.config import PRESETS
from rubric_rl.models.rngs import init_rngs

MODELS = {
    "qwen3": (Qwen3ForCausalLM, PRESETS["tiny"]),
    # One layer of each kind: every parameter kind the hybrid model draws.
    "qwen3_5": (
        Qwen3_5ForCausalLM,
        dataclasses.replace(
            QWEN3_5_PRESETS["qwen3_5_tiny"],
            num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"),
        ),
    ),
}


def _params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


@pytest.mark.parametrize("family", list(MODELS))
def test_same_parameters_as_nnx_rngs_under_jit(family):
    """Under jit the counts are host constants of the traced draws (a counter updated in place
    would give every draw the last count). Eagerly the two are the same code path."""
    cls, cfg = MODELS[family]
    want = _params(nnx.jit(lambda: cls(cfg, rngs=nnx.Rngs(3)))())
    got = _params(nnx.jit(lambda: cls(cfg, rngs=init_rngs(3)))())
    assert len(want) == len(got) > 10
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


def test_draws_follow_the_stream_counts():
    ref, ours = nnx.Rngs(11), init_rngs(11)
    for _ in range(3):
        a, b = ref.params(), ours.params()
        assert np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    assert int(ours.params.count[...]) == 3


def test_tracing_a_construction_builds_no_origin_message(monkeypatch):
    """The cost removed: with `nnx.Rngs`, every draw under a trace walks the jaxpr for an error
    message (`find_progenitors`); with `init_rngs`, none does."""
    from jax._src.interpreters import partial_eval

    calls = []
    real = partial_eval.JaxprStackFrame.find_progenitors

    def counting(self, tracer):
        calls.append(1)
        return real(self, tracer)

    monkeypatch.setattr(partial_eval.JaxprStackFrame, "find_progenitors", counting)
    cls, cfg = MODELS["qwen3"]
    nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    assert len(calls) > 0  # the control: the plain Rngs does pay it
    calls.clear()
    nnx.eval_shape(lambda: cls(cfg, rngs=init_rngs(0)))
    assert calls == []
