"""`init_rngs(seed)`: an `nnx.Rngs` for building a model under a trace (`nnx.eval_shape`, `jit`),
drawing the same keys as `nnx.Rngs(seed)` in a fraction of the tracing time.

Why: each draw from an `nnx.Rngs` stream increments its counter variable. Built under a trace, the
counter is a tracer, and flax's variable update reads ``.sharding`` off the new value; on a tracer
that raises an AttributeError whose message jax builds by walking the whole jaxpr traced so far
(`find_progenitors`). One walk per parameter: quadratic in the model's size. Building Qwen3.5-27B
abstractly took 10 s, 8 of them in these messages; Qwen3.5-4B 2.3 s.

Here every stream's counter is a host (numpy) array instead: the draw is still
``fold_in(key, count)`` with the same counts, so the keys and every initial value are the same,
and the update is plain numpy. Each read hands out a copy: jax may keep a traced operation's numpy
constant by reference until lowering, so a counter updated in place would change the keys already
drawn."""

from __future__ import annotations

import numpy as np
from flax import nnx


class _HostCount(np.ndarray):
    """A numpy counter whose reads are copies (see the module docstring)."""

    def __getitem__(self, index):
        return np.array(np.asarray(self)[index])


def init_rngs(seed: int) -> nnx.Rngs:
    """`nnx.Rngs(seed)` with host counters: the same draws, for building a model under a trace
    (eager construction gains nothing from it, and loses nothing)."""
    rngs = nnx.Rngs(seed)
    streams = [s for s in vars(rngs).values() if isinstance(s, nnx.RngStream)]
    if not streams:
        raise RuntimeError("nnx.Rngs has no RngStream attribute: flax's layout has changed")
    for stream in streams:
        count = np.zeros(np.shape(stream.count[...]), np.uint32).view(_HostCount)
        stream.count = nnx.RngCount(count, tag=stream.tag)
    return rngs
