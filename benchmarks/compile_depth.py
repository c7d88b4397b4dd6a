"""Compile time of the train step against depth, looped vs scanned layers; prints ONE JSON line.

    python benchmarks/compile_depth.py [--depths 2,8,16] [--hidden 64]

Per depth L and layer mode (``Qwen3Config.scan_layers`` off / on): the seconds to trace, lower and
compile ``core.train_step.make_train_step``'s GRPO step (PPO loss over a chunked LM head, AdamW)
on a model of tiny width (``tiny`` preset, hidden 64, L layers) at batch 2 × 32 tokens: the
durations jax reports (``jax.monitoring``) for tracing, lowering to StableHLO and the XLA compile
of every program the first step call builds. The looped stack traces and compiles one
copy of the layer per layer; the scanned one traces one body, so its compile time should stay
about flat in depth.

Ratios (the CONVENTIONS' "ratio to a peer measured in the same run"):
  ``depth_ratio_loop`` / ``depth_ratio_scan``: compile at the deepest ÷ the shallowest depth;
  ``scan_over_loop``: scanned ÷ looped compile time at each depth;
  ``*_cpu``: the depth ratios in process CPU seconds (less sensitive to a busy machine);
  ``*_equations``: the depth ratios of the traced program's size (jaxpr equations of the loss
  and its gradient, nested bodies included): exact, whatever the machine's load.
The target: a 28-layer model compiles in at most 1.5× a 4-layer one of the same width
(``--depths 4,28``). Absolute seconds vary ≈2× on shared CPUs; the ratios are the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import numpy as np

from rubric_rl.core import sharding
from rubric_rl.core import train_step as ts
from rubric_rl.core.batch_types import TrainBatch
from rubric_rl.models.qwen3 import PRESETS, Qwen3Config, Qwen3ForCausalLM
from rubric_rl.models.rngs import init_rngs


def make_batch(cfg: Qwen3Config, batch: int, seq: int) -> TrainBatch:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
    loss_mask = np.zeros((batch, seq), np.float32)
    loss_mask[:, seq // 4 : seq - 1] = 1.0
    return TrainBatch(
        input_ids=ids,
        positions=np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
        attention_mask=np.ones((batch, seq), np.int32),
        loss_mask=loss_mask,
        rollout_logps=-rng.uniform(0.5, 8.0, (batch, seq)).astype(np.float32),
        advantages=rng.normal(size=batch).astype(np.float32),
        seq_weights=np.ones(batch, np.float32),
    )


_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "xla_s",
}
_durations: dict[str, float] = {}


def _listen(event: str, duration: float, **_: object) -> None:
    if event in _EVENTS:
        _durations[_EVENTS[event]] = _durations.get(_EVENTS[event], 0.0) + duration


jax.monitoring.register_event_duration_secs_listener(_listen)


def count_equations(jaxpr) -> int:
    """Equations of a jaxpr, those of nested jaxprs (scan / remat / pjit bodies) included: the
    traced program's size, a figure that does not depend on how busy the machine is."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for v in eqn.params.values():
            for sub in v if isinstance(v, tuple | list) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += count_equations(inner)
    return n


def compile_seconds(cfg: Qwen3Config, batch: int, seq: int) -> dict:
    """{"compile_s" (trace + lower + XLA compile of everything the first step call compiles),
    "trace_s", "lower_s", "xla_s", "step_s"} of a fresh train step for ``cfg`` on one device."""
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    config = ts.TrainConfig(lr=1e-5, chunk_size=seq)
    model = sharding.init_sharded(lambda: Qwen3ForCausalLM(cfg, rngs=init_rngs(0)), mesh)
    graphdef, state = ts.init_train_state(model, config, mesh)
    step = ts.make_train_step(config, graphdef, mesh)
    data = jax.block_until_ready(sharding.shard_batch(make_batch(cfg, batch, seq), mesh))
    _durations.clear()
    cpu = time.process_time()
    state, metrics = step(state, data)
    jax.block_until_ready(metrics)
    first_cpu = time.process_time() - cpu
    parts = {k: round(v, 3) for k, v in sorted(_durations.items())}
    start, cpu = time.perf_counter(), time.process_time()
    state, metrics = step(state, data)
    jax.block_until_ready(metrics)
    step_s, step_cpu = time.perf_counter() - start, time.process_time() - cpu
    jaxpr = jax.make_jaxpr(step.loss_and_grads)(state, data)
    return {
        "loss_and_grads_equations": count_equations(jaxpr.jaxpr),
        "compile_s": round(sum(_durations.values()), 3),
        "compile_cpu_s": round(first_cpu - step_cpu, 3),
        **parts,
        "step_s": round(step_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="2,8,16", help="comma-separated layer counts")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (tiny preset's: 64)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    base = dataclasses.replace(
        PRESETS["tiny"], hidden_size=args.hidden, intermediate_size=2 * args.hidden
    )
    jax.block_until_ready(jax.jit(lambda x: x + 1)(1))  # backend start-up outside the figures
    results: dict[str, dict[str, dict]] = {"loop": {}, "scan": {}}
    # Alternate the modes depth by depth, so drift on a shared machine hits both alike.
    for depth in depths:
        for mode in ("loop", "scan"):
            cfg = dataclasses.replace(base, num_hidden_layers=depth, scan_layers=mode == "scan")
            results[mode][str(depth)] = compile_seconds(cfg, args.batch, args.seq)
    lo, hi = str(depths[0]), str(depths[-1])
    c = {m: {d: r["compile_s"] for d, r in results[m].items()} for m in results}
    cpu = {m: {d: r["compile_cpu_s"] for d, r in results[m].items()} for m in results}
    eqns = {m: {d: r["loss_and_grads_equations"] for d, r in results[m].items()} for m in results}
    out = {
        "benchmark": "compile_depth",
        "step": "grpo",
        "hidden": args.hidden,
        "batch": args.batch,
        "seq": args.seq,
        "device": jax.devices()[0].device_kind,
        "compile_s": c,
        "parts": results,
        f"depth_ratio_loop_{hi}_over_{lo}": round(c["loop"][hi] / c["loop"][lo], 2),
        f"depth_ratio_scan_{hi}_over_{lo}": round(c["scan"][hi] / c["scan"][lo], 2),
        "scan_over_loop": {d: round(c["scan"][d] / c["loop"][d], 2) for d in c["loop"]},
        # The same ratios in process CPU seconds (the first call's minus a step's): less
        # sensitive to other processes on a shared machine than wall time.
        f"depth_ratio_loop_{hi}_over_{lo}_cpu": round(cpu["loop"][hi] / cpu["loop"][lo], 2),
        f"depth_ratio_scan_{hi}_over_{lo}_cpu": round(cpu["scan"][hi] / cpu["scan"][lo], 2),
        # The traced program's size (jaxpr equations of the loss and its gradient), exact.
        f"depth_ratio_loop_{hi}_over_{lo}_equations": round(eqns["loop"][hi] / eqns["loop"][lo], 2),
        f"depth_ratio_scan_{hi}_over_{lo}_equations": round(eqns["scan"][hi] / eqns["scan"][lo], 2),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
