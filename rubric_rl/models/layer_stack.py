"""Decoder layers as one scanned stack, and the rematerialisation settings of the decoders.

`stack_layers` turns L modules of one structure into one module whose every variable has a
leading layer axis (its `out_sharding` gains a leading None: the layer axis is never sharded);
`unstack_layers` inverts it; `scan_decoder_layers` runs a body over the stacked layers as one
`jax.lax.scan`, so a model's forward is traced and compiled once whatever its depth
(`Qwen3Config.scan_layers`; benchmarks/compile_depth.py). `remat_policy` reads a remat setting
(`REMAT_POLICIES`, ``config.model.remat``) for the looped and the scanned layers alike.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "REMAT_POLICIES",
    "remat_policy",
    "scan_decoder_layers",
    "stack_layers",
    "unstack_layers",
]


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def stack_layers(layers: list[nnx.Module]) -> nnx.Module:
    """One module of the layers' (common) structure whose every variable holds the layers' values
    stacked on a new leading axis, its `out_sharding` extended by a leading None (the layer axis
    stays replicated: each device runs every layer of its shard)."""
    splits = [nnx.split(layer) for layer in layers]
    graphdef = splits[0][0]

    def stack(*vs: nnx.Variable) -> nnx.Variable:
        value = jnp.stack([v.get_value() for v in vs])
        names = vs[0].get_metadata().get("out_sharding")
        if names is None:
            return vs[0].replace(value)
        return vs[0].replace(value, out_sharding=(None, *names))

    state = jax.tree.map(stack, *(st for _, st in splits), is_leaf=_is_variable)
    return nnx.merge(graphdef, state)


def unstack_layers(stacked: nnx.Module) -> list[nnx.Module]:
    """The inverse of `stack_layers`: one module per index of the leading layer axis."""
    graphdef, state = nnx.split(stacked)
    leaves = jax.tree.leaves(state, is_leaf=_is_variable)
    n = leaves[0].shape[0]

    def take(v: nnx.Variable, i: int) -> nnx.Variable:
        names = v.get_metadata().get("out_sharding")
        if names is None:
            return v.replace(v.get_value()[i])
        return v.replace(v.get_value()[i], out_sharding=tuple(names[1:]))

    return [
        nnx.merge(graphdef, jax.tree.map(lambda v, i=i: take(v, i), state, is_leaf=_is_variable))
        for i in range(n)
    ]


# Rematerialisation (`Qwen3ForCausalLM(remat=)`, ``config.model.remat``): "none"; "full" (each
# layer's activations recomputed in the backward pass: memory O(layers · B·T·D)); "dots" (matmul
# outputs without batch dims kept, the elementwise work around them recomputed: jax's
# dots_with_no_batch_dims_saveable, the usual middle ground on accelerators).
REMAT_POLICIES = ("none", "full", "dots")


def remat_policy(remat: bool | str) -> tuple[bool, Any]:
    """(rematerialise?, the `jax.checkpoint` policy) of a `remat` setting: True = "full", False =
    "none", or a name in `REMAT_POLICIES`."""
    if remat is True or remat == "full":
        return True, None
    if remat is False or remat == "none":
        return False, None
    if remat == "dots":
        return True, jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    raise ValueError(f"remat={remat!r}: expected True, False or one of {REMAT_POLICIES}")


def scan_decoder_layers(
    stacked: nnx.Module,
    body: Any,
    carry: Any,
    xs: Any = None,
    *,
    remat: bool = False,
    policy: Any = None,
) -> tuple[Any, Any]:
    """`jax.lax.scan` of ``body(layer, carry, x) -> (carry, y)`` over the layers of a
    `stack_layers` module: ``layer`` is layer i's module (its slice of every stacked parameter),
    ``x`` its slice of ``xs`` (a pytree with leading axis L, or None).

    The body is traced once for all layers, so compile time does not grow with depth. remat:
    `jax.checkpoint` around the body with `policy` (each layer's activations recomputed in the
    backward pass; prevent_cse=False is safe and faster inside scan, per the jax.checkpoint
    docs)."""
    graphdef, state = nnx.split(stacked)

    def step(carry, inputs):
        layer_state, x = inputs
        return body(nnx.merge(graphdef, layer_state), carry, x)

    if remat:
        step = jax.checkpoint(step, prevent_cse=False, policy=policy)
    return jax.lax.scan(step, carry, (state, xs))
