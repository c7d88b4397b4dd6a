"""Save and restore a ``TrainState`` with orbax, sharded, onto any mesh.

Each process writes only its shards (orbax/tensorstore); a restore reads straight into the target
shardings, so a state saved on one mesh shape restores onto another (or onto one device) without
a full host copy. Restores are bit-exact. ``rubric_rl/checkpoint.py`` adds the controller states,
data cursors and RNG on top of this (as extra items of the same step).

Usage::

    mgr = make_checkpoint_manager(workdir + "/checkpoints")
    save_train_state(mgr, step, state)                  # async; mgr.wait_until_finished()
    target = abstract_train_state(state, train_state_shardings(state, new_mesh))
    state = restore_train_state(mgr, target)            # latest step
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

ITEM = "train_state"


def make_checkpoint_manager(
    directory: str,
    *,
    max_to_keep: int | None = None,
    async_save: bool = True,
) -> ocp.CheckpointManager:
    """An orbax CheckpointManager over ``directory`` (created if missing; absolute path)."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save_train_state(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    *,
    extra: dict[str, Any] | None = None,
    wait: bool = False,
) -> bool:
    """Saves ``state`` (any pytree of jax arrays, e.g. a TrainState) as item ``train_state`` of
    ``step``; ``extra`` maps further item names to orbax save args (e.g. ``ocp.args.JsonSave``).
    Async unless ``wait``; returns whether a save happened (the manager's interval policy)."""
    items = {ITEM: ocp.args.StandardSave(state)}
    items.update(extra or {})
    saved = manager.save(step, args=ocp.args.Composite(**items))
    if wait:
        manager.wait_until_finished()
    return saved


def abstract_train_state(state: Any, shardings: Any) -> Any:
    """``jax.ShapeDtypeStruct`` tree of ``state`` (concrete or from ``jax.eval_shape``) carrying
    ``shardings`` (same structure, e.g. ``train_step.train_state_shardings(state, mesh)``): the
    restore target on the new layout."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )


def restore_train_state(
    manager: ocp.CheckpointManager,
    target: Any,
    step: int | None = None,
) -> Any:
    """Restores item ``train_state`` of ``step`` (default: the latest) into ``target``'s
    structure, shapes, dtypes and shardings (see ``abstract_train_state``)."""
    manager.wait_until_finished()
    if step is None:
        step = manager.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {manager.directory}")
    restored = manager.restore(
        step, args=ocp.args.Composite(**{ITEM: ocp.args.StandardRestore(target)})
    )
    return restored[ITEM]
