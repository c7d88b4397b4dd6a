"""The engine's copy of the policy: the live train state after an update (``sync``), or a copy
taken for a pipeline that runs ahead of the update (``copy_weights`` then ``serve``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rubric_rl.config import builders
from rubric_rl.loop.async_rollouts import Weights


class WeightServer:
    """Gives the engine parameters: in memory (the JAX engine) or, with ``rollout.engine =
    sglang``, as versioned safetensors the server loads (``rollout.weight_sync``). ``graphdef``
    is the model's structure the parameters are merged into for an export; the trainer replaces
    it when a warm start rebuilds the train state."""

    def __init__(self, config: Any, engine: Any, graphdef: Any, workdir: str):
        self.engine, self.graphdef = engine, graphdef
        self.weight_sync = None
        if config.rollout.engine == "sglang":
            from rubric_rl.rollout.weight_sync import WeightSync

            self.weight_sync = WeightSync(
                builders.weight_sync_root(config, workdir),
                dtype=str(config.rollout.sglang.export_dtype),
            )

    def sync(self, state: Any, version: int) -> None:
        """The engine serves the live train state ``state`` (``params`` and ``rest``)."""
        if self.weight_sync is not None:
            model = nnx.merge(self.graphdef, state.params, state.rest)
            self.weight_sync.sync(self.engine, model, int(version))
        else:
            self.engine.update_weights(state, int(version))

    def serve(self, weights: Weights) -> None:
        """The engine serves ``weights`` (a copy, see ``copy_weights``) from now on."""
        if self.weight_sync is not None:
            if self.engine.weight_version == weights.version:
                return  # the server already holds this version (its own copy, on disk)
            model = nnx.merge(self.graphdef, weights.params, weights.rest)
            self.weight_sync.sync(self.engine, model, weights.version)
        else:
            self.engine.update_weights(weights, weights.version)


def copy_weights(state: Any, version: int) -> Weights:
    """The live policy copied (the next update donates its buffers), complete before the update
    is dispatched."""
    params = jax.tree.map(jnp.copy, state.params)
    rest = jax.tree.map(jnp.copy, state.rest)
    jax.block_until_ready((params, rest))
    return Weights(params, rest, int(version))
