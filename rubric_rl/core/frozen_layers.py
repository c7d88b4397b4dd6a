"""Training only the top N decoder layers (``TrainConfig.trainable_layers``, config
``train.trainable_layers``; 0 = every parameter trains, the default).

Frozen: the token embedding and the decoder layers below the top N. Trained: the top N layers,
the final norm and an untied LM head. With tied embeddings the unembedding is the frozen
embedding, so the LM head is frozen too (our choice: the alternative, a trained head over a
frozen lookup, needs a gradient path into the embedding and so a backward through every layer's
input). A cost option, not a method change: the loss and every trained parameter's gradient are
the full backward's (tested), the frozen parameters never move.

How the backward stops: the frozen parameters enter the loss under ``jax.lax.stop_gradient``,
so nothing below the first trained layer carries a tangent and JAX builds no backward pass for
those layers at all (not merely zero gradients); their gradients come back as zeros, and the
optimizer's updates for them are zeroed (`mask_frozen_updates`) so weight decay does not move
them either. The layers must be a loop (``model.scan_layers=False``): a scanned stack is one
``lax.scan`` whose backward runs every layer.
"""

from __future__ import annotations

from typing import Any

import jax

from rubric_rl.models.hf_io import param_keys, stacked_layer_param


def _is_var(x: Any) -> bool:
    from flax import nnx

    return isinstance(x, nnx.Variable)


def _frozen(params: Any, trainable_layers: int):
    """``frozen(path) -> bool`` for paths of ``params`` or of any pytree laid out like it (the
    optimizer's updates). ValueError naming ``train.trainable_layers`` for a scanned layer stack
    or N above the model's layer count."""
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_var)[0]
    keys = [param_keys(p) for p, _ in flat]
    if any(stacked_layer_param(k) for k in keys):
        raise ValueError(
            f"train.trainable_layers={trainable_layers}: needs model.scan_layers=False (a scanned "
            "layer stack is one lax.scan whose backward runs every layer)"
        )
    layers = 1 + max((k[1] for k in keys if k[0] == "layers"), default=-1)
    if trainable_layers > layers:
        raise ValueError(
            f"train.trainable_layers={trainable_layers} > the model's {layers} decoder layers"
        )
    first = layers - trainable_layers

    def frozen(path) -> bool:
        k = param_keys(path)
        return k[0] == "embed" or (k[0] == "layers" and k[1] < first)

    return frozen


def frozen_mask(params: Any, trainable_layers: int) -> Any:
    """A pytree like ``params`` of bools: True where the parameter is frozen."""
    frozen = _frozen(params, trainable_layers)
    return jax.tree_util.tree_map_with_path(lambda p, _: frozen(p), params, is_leaf=_is_var)


def _where_frozen(tree: Any, params: Any, trainable_layers: int, fn) -> Any:
    frozen = _frozen(params, trainable_layers)
    # fn maps inside a Variable (keeping the container: optax and nnx.merge expect the layout).
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jax.tree.map(fn, x) if frozen(p) else x, tree, is_leaf=_is_var
    )


def stop_frozen(params: Any, trainable_layers: int) -> Any:
    """``params`` with the frozen ones under ``stop_gradient`` (unchanged when N is 0)."""
    if trainable_layers <= 0:
        return params
    return _where_frozen(params, params, trainable_layers, jax.lax.stop_gradient)


def mask_frozen_updates(updates: Any, params: Any, trainable_layers: int) -> Any:
    """The optimizer's ``updates`` (laid out like ``params``) with the frozen ones zeroed."""
    if trainable_layers <= 0:
        return updates
    return _where_frozen(updates, params, trainable_layers, jax.numpy.zeros_like)
