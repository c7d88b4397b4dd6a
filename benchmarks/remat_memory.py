"""Activation memory of the train step under each remat policy; prints ONE JSON line.

    python benchmarks/remat_memory.py --preset=qwen3_4b --batch=4 --seq=2048
    python benchmarks/remat_memory.py --preset=qwen3_0_6b --batch=8 --seq=4096 --device-gib=141

For choosing ``config.model.remat`` (`layer_stack.REMAT_POLICIES`) and the micro-batch size of a
run before spending device time on it: batch × seq are the rows × tokens ONE device holds in one
micro-batch (a data/FSDP mesh divides the micro-batch's rows by its size). Nothing is allocated
or computed: one decoder layer is traced abstractly (`nnx.eval_shape`, shapes only) and jax lists
the residuals its backward pass keeps (`jax._src.ad_checkpoint.saved_residuals`, the function
behind `jax.ad_checkpoint.print_saved_residuals`), so any shape runs in seconds on a CPU.

Per policy:
  ``kept_per_layer_bytes``: what one layer keeps for its backward beyond its inputs (parameters,
      residual stream, rotary tables, mask): "full" keeps nothing, "dots" the outputs of its
      weight matmuls, "none" every intermediate.
  ``scores_per_layer_bytes``: of those, the [T, T] attention scores/probabilities that the "xla"
      attention path materialises ("none" only; cuDNN flash attention keeps O(T) statistics
      instead, and cannot be traced on a machine without cuDNN, so it is not listed).
  ``activation_bytes`` = L × (layer input + kept) + the transient of the layer being
      differentiated (its "none" residuals less what is already kept) — with ``--attention=xla``
      the scores counted, with ``cudnn`` (the default: the GPU configs' "auto") left out.
  ``state_bytes``: float32 master weights, their gradient and AdamW's two moments (16 B/param)
      over ``--fsdp`` devices (1: replicated).
  ``total_bytes`` = activation + state, and with ``--device-gib`` its ratio to that memory.
A lower bound of the step's peak: the LM head's chunked log-probs, a teacher forward and XLA's
own temporaries come on top (benchmarks/gpu_check.py measures those on a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_rl.models.layer_stack import REMAT_POLICIES, remat_policy
from rubric_rl.models.qwen3 import PRESETS, DecoderLayer, full_sequence_inputs, rope_tables
from rubric_rl.models.rngs import init_rngs


def _saved_residuals(fn, *args):
    try:
        from jax._src.ad_checkpoint import saved_residuals
    except ImportError as e:  # private in jax <= 0.10; the public printer wraps it
        raise RuntimeError(f"this jax ({jax.__version__}) has no saved_residuals") from e
    return saved_residuals(fn, *args)


def layer_residuals(preset: str, batch: int, seq: int, dtype: str, policy: str) -> dict:
    """Bytes one decoder layer of ``preset`` keeps for its backward pass under ``policy``."""
    cfg = PRESETS[preset]
    compute = jnp.dtype(dtype)
    layer = nnx.eval_shape(
        lambda: DecoderLayer(cfg, rngs=init_rngs(0), dtype=compute, param_dtype=jnp.float32)
    )
    graphdef, params = nnx.split(layer)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    positions, mask, _ = jax.eval_shape(lambda i: full_sequence_inputs(i, None, None), ids)
    rot = jax.eval_shape(lambda p: rope_tables(p, cfg.head_dim, cfg.rope_theta), positions)
    x = jax.ShapeDtypeStruct((batch, seq, cfg.hidden_size), compute)
    remat, checkpoint_policy = remat_policy(policy)

    def run(params, x, rot, mask):
        # one causal block: what the GPU configs run (cuDNN or XLA attention over the sequence)
        return nnx.merge(graphdef, params)(x, rot, mask, attention_impl="xla", causal_blocks=1)[0]

    if remat:
        run = jax.checkpoint(run, policy=checkpoint_policy)

    def loss(params, x, rot, mask):
        return run(params, x, rot, mask).astype(jnp.float32).sum()

    kept = scores = 0
    for aval, source in _saved_residuals(loss, params, x, rot, mask):
        if "argument" in source:  # the layer's inputs: the same under every policy
            continue
        n = math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        kept += n
        if len(aval.shape) >= 2 and aval.shape[-2:] == (seq, seq):
            scores += n
    return {"kept_per_layer_bytes": kept, "scores_per_layer_bytes": scores}


def remat_memory(
    preset: str,
    batch: int,
    seq: int,
    dtype: str = "bfloat16",
    attention: str = "cudnn",
    device_gib: float = 0.0,
    fsdp: int = 1,
) -> dict:
    if preset not in PRESETS:
        raise ValueError(f"--preset={preset!r}: known {sorted(PRESETS)}")
    if batch < 1 or seq < 1 or fsdp < 1:
        raise ValueError(f"--batch={batch} --seq={seq} --fsdp={fsdp}: each must be >= 1")
    if attention not in ("cudnn", "xla"):
        raise ValueError(f"--attention={attention!r}: expected cudnn or xla")
    try:
        itemsize = jnp.dtype(dtype).itemsize
    except TypeError as e:
        raise ValueError(f"--dtype={dtype!r}: not a dtype ({e})") from e
    cfg = PRESETS[preset]
    layers = cfg.num_hidden_layers
    layer_input = batch * seq * cfg.hidden_size * itemsize
    per = {p: layer_residuals(preset, batch, seq, dtype, p) for p in REMAT_POLICIES}

    def counted(p: str) -> int:
        r = per[p]
        return r["kept_per_layer_bytes"] - (
            0 if attention == "xla" else r["scores_per_layer_bytes"]
        )

    state = 16 * cfg.num_params() // fsdp
    out: dict = {
        "benchmark": "remat_memory",
        "preset": preset,
        "batch": batch,
        "seq": seq,
        "dtype": dtype,
        "attention": attention,
        "fsdp": fsdp,
        "layers": layers,
        "layer_input_bytes": layer_input,
        "state_bytes": state,
        "policies": {},
    }
    for p in REMAT_POLICIES:
        kept = counted(p)
        activation = layers * (layer_input + kept) + (counted("none") - kept)
        row = dict(per[p], activation_bytes=activation, total_bytes=activation + state)
        if device_gib:
            row["ratio_to_device"] = round((activation + state) / (device_gib * 2**30), 4)
        out["policies"][p] = row
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3_0_6b", help=f"one of {sorted(PRESETS)}")
    ap.add_argument("--batch", type=int, default=8, help="rows per device per micro-batch")
    ap.add_argument("--seq", type=int, default=4096, help="tokens per row")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype")
    ap.add_argument("--attention", default="cudnn", help="cudnn (scores not kept) or xla")
    ap.add_argument(
        "--fsdp", type=int, default=1, help="devices the optimizer state is sharded over"
    )
    ap.add_argument("--device-gib", type=float, default=0.0, help="device memory for the ratio")
    a = ap.parse_args(argv)
    try:
        out = remat_memory(a.preset, a.batch, a.seq, a.dtype, a.attention, a.device_gib, a.fsdp)
    except ValueError as e:
        ap.error(str(e))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
