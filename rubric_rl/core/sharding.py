"""Device mesh, parameter sharding rules and batch sharding (pure: no I/O, no Python state).

Mesh axes: ("data", "fsdp", "tensor").
- "data": pure data parallelism (parameters replicated across it).
- "fsdp": batch AND parameters sharded over it (ZeRO-3 style; XLA all-gathers weights per use).
- "tensor": attention heads and the MLP hidden dimension split across it (Megatron style).

Parameter rules live on the parameters themselves as `out_sharding` metadata (see
`rubric_rl.models.qwen3`): kernels `('fsdp', 'tensor')` / `('tensor', 'fsdp')`, the embedding
`(('tensor', 'fsdp'), None)` (its vocabulary over both axes, so tensor = 1 does not replicate it;
sharding its model dim on "fsdp" while the batch is on "fsdp" makes the lookup's backward
rematerialise the full table), norms replicated. A scanned model's stacked layer
parameters carry a leading None (`models.layer_stack.stack_layers`): the layer axis is replicated.

Divisibility fallback: when a dimension is not divisible by the product of the mesh axes named for
it, it is split over the longest leading part of those axes that divides it, else replicated (so
a tiny test model runs on any mesh). The fallback is per dimension and silent; `spec_for` is the
single place that decides it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def make_mesh(
    data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """Mesh with axes ("data", "fsdp", "tensor") over `devices` (default: jax.devices(), i.e.
    every device of every host after jax.distributed.initialize()).

    At most one size may be -1: it takes all remaining devices. Axis types are Auto (jax 0.10's
    make_mesh defaults to Explicit, which makes embedding lookups demand an out_sharding).
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, s in sizes.items():
        if not isinstance(s, int) or (s < 1 and s != -1):
            raise ValueError(f"mesh.{name} must be a positive int or -1, got {s!r}")
    fill = [k for k, s in sizes.items() if s == -1]
    if len(fill) > 1:
        raise ValueError(f"only one mesh axis may be -1, got {fill}")
    known = math.prod(s for s in sizes.values() if s != -1)
    if fill:
        if n % known:
            raise ValueError(
                f"mesh.{fill[0]}=-1: {n} devices are not divisible by the other axes' product "
                f"{known} ({sizes})"
            )
        sizes[fill[0]] = n // known
    if math.prod(sizes.values()) != n:
        raise ValueError(
            f"mesh data*fsdp*tensor = {sizes['data']}*{sizes['fsdp']}*{sizes['tensor']} = "
            f"{math.prod(sizes.values())} must equal the number of devices ({n})"
        )
    shape = tuple(sizes[a] for a in MESH_AXES)
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
    except Exception:  # noqa: BLE001 - topology-aware layout unavailable: plain reshape
        return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES)


def _axis_size(mesh: Mesh, names: Any) -> int:
    if names is None:
        return 1
    if isinstance(names, str):
        names = (names,)
    return math.prod(mesh.shape[n] for n in names)


def spec_for(shape: Sequence[int], names: Sequence[Any] | None, mesh: Mesh) -> P:
    """PartitionSpec for an array of `shape` whose dims want mesh axes `names` (None entries =
    replicated). A dim that a group of axes does not divide takes the group's longest leading
    part that does (("tensor", "fsdp") -> "tensor"), else is replicated; axes absent from the
    mesh are dropped; size-1 axes are kept (harmless)."""
    if not names:
        return P()
    if len(names) != len(shape):
        raise ValueError(f"sharding names {tuple(names)} do not match array shape {tuple(shape)}")
    out = []
    for dim, n in zip(shape, names, strict=True):
        if n is None:
            out.append(None)
            continue
        group = (n,) if isinstance(n, str) else tuple(n)
        group = tuple(a for a in group if a in mesh.shape)
        while group and dim % _axis_size(mesh, group):
            group = group[:-1]
        if not group:
            out.append(None)
        else:
            out.append(group[0] if len(group) == 1 else group)
    return P(*out)


def _leaf_sharding(x: Any, mesh: Mesh) -> Any:
    if isinstance(x, nnx.Variable):
        names = x.get_metadata().get("out_sharding")
        return x.replace(NamedSharding(mesh, spec_for(x.shape, names, mesh)))
    return NamedSharding(mesh, P())


def param_shardings(model_or_state: Any, mesh: Mesh) -> Any:
    """NamedShardings for a model's state (or any nnx State/pytree of Variables, concrete or
    abstract, e.g. from jax.eval_shape; also optax states built on it). Same tree structure as
    `nnx.state(model)`; plain arrays without metadata are replicated."""
    state = nnx.state(model_or_state) if isinstance(model_or_state, nnx.Module) else model_or_state
    return jax.tree.map(
        lambda x: _leaf_sharding(x, mesh), state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )


def param_partition_specs(model_or_state: Any, mesh: Mesh) -> Any:
    """Like `param_shardings` but PartitionSpecs (for jit in/out_shardings under jax.set_mesh)."""
    return jax.tree.map(
        lambda s: s.spec,
        param_shardings(model_or_state, mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Places an existing model's parameters on `mesh` per the rules (in place; returns it)."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, param_shardings(state, mesh)))
    return model


def init_sharded(constructor: Callable[[], nnx.Module], mesh: Mesh) -> nnx.Module:
    """Creates a model directly sharded: each device initialises only its own shards (no full
    host copy). `constructor` builds the model, e.g.
    `lambda: Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))`; values equal the unsharded constructor's."""
    abstract = nnx.eval_shape(constructor)
    graphdef, abs_state = nnx.split(abstract)
    shardings = param_shardings(abs_state, mesh)

    def init():
        return nnx.split(constructor())[1]

    state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (sequence) dim over ("data", "fsdp"); the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES))


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Places a pytree of host arrays with leading dim B on `mesh`, B split over data*fsdp.

    Single process: `batch` is the global batch. Several processes: each passes its local slice
    (jax.make_array_from_process_local_data assembles the global array). 0-d leaves are
    replicated. Raises ValueError naming the leaf when B is not divisible.
    """
    n = _axis_size(mesh, BATCH_AXES)
    sharding = batch_sharding(mesh)
    replicated = NamedSharding(mesh, P())
    multi = jax.process_count() > 1

    def put(path, x):
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        if x.ndim == 0:
            return jax.device_put(x, replicated)
        global_b = x.shape[0] * (jax.process_count() if multi else 1)
        if global_b % n:
            raise ValueError(
                f"batch field {jax.tree_util.keystr(path)}: leading dim {global_b} is not "
                f"divisible by data*fsdp = {n}"
            )
        if multi:
            return jax.make_array_from_process_local_data(sharding, x)
        return jax.device_put(x, sharding)

    return jax.tree_util.tree_map_with_path(put, batch)


def to_host(x: Any) -> np.ndarray:
    """A jax.Array as one numpy array on every process. Several processes: an array spanning
    other hosts' devices cannot be read locally, so it is all-gathered (every process runs the
    same rollouts, so each gets the whole result)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def one_program_at_a_time(mesh: Mesh) -> bool:
    """Whether programs on ``mesh`` must run one at a time: a CPU mesh of several devices.

    XLA:CPU runs each device's share of a program as a task on one shared pool of
    max(cores, devices) threads, and a collective holds its thread until every device's task
    arrives. Two independent programs with collectives in flight together (a mini-batch gather
    and the previous update, say) can fill the pool with waiting tasks of both: a deadlock that
    XLA ends after 40 s by aborting the process ("Termination timeout for all reduce ...
    Expected 8 threads to join the rendezvous, but only 7 of them arrived"). GPUs, TPUs and
    one CPU device are unaffected."""
    return mesh.devices.size > 1 and mesh.devices.flat[0].platform == "cpu"


def settle(x: Any, mesh: Mesh) -> Any:
    """``x`` once computed, where ``mesh`` needs one program at a time (one_program_at_a_time);
    elsewhere ``x`` at once, keeping asynchronous dispatch."""
    return jax.block_until_ready(x) if one_program_at_a_time(mesh) else x


def kv_cache_shardings(cache: Any, mesh: Mesh) -> Any:
    """Shardings for a KV cache pytree of [B, KV, ·, ·] arrays (`Qwen3ForCausalLM.init_cache`:
    k [B, KV, hd, S], v [B, KV, S, hd]) or, for a scanned model, [B, L, KV, ·, ·]: batch over
    ("data", "fsdp") like the batch, kv heads over "tensor" (divisibility fallback), the
    stacked layer axis replicated."""

    def one(x):
        names = (BATCH_AXES, "tensor", None, None)
        if x.ndim == 5:
            names = (BATCH_AXES, None, "tensor", None, None)
        return NamedSharding(mesh, spec_for(x.shape, names, mesh))

    return jax.tree.map(one, cache)
