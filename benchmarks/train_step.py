"""Throughput of the full GRPO + full-vocabulary self-distillation train step; prints ONE JSON line.

    python benchmarks/train_step.py [--presets 5m,20m] [--batch 8] [--seq 256] [--steps 3]

Per preset: tokens/s of ``make_train_step`` (PPO loss + reverse KL to the same-parameter teacher
over the full vocabulary, chunked; AdamW), and model FLOP/s against the float32 matmul FLOP/s of
this machine measured in the same run (a large ``jnp.dot``, timed between the steps), the ratio
the CONVENTIONS ask for. Best step vs best matmul; ``ratio_to_matmul_cpu_time`` does the same per
process CPU second, which discounts the time other processes on a shared machine take.

FLOP count (per step, "model FLOPs": no credit for rematerialisation):
  6 · N · B·T   student forward + backward      (N = matmul parameters: every attention and MLP
  2 · N · B·T'  teacher forward (no backward)    kernel plus the [D, V] unembedding; the embedding
                                                 lookup is not a matmul and is not counted)
``flops_attention`` adds the causal attention score/value matmuls (fwd 2·2·L·H·hd·T²/2 per
sequence, ×3 for the student's backward); ``ratio_with_attention`` uses it. The LM head's chunk
recomputation in the backward pass (remat) is real work not counted as model FLOPs.

Uses tcmalloc when ``libtcmalloc_minimal.so.4`` is present (glibc malloc costs ≈ 1.6× on XLA:CPU,
notes/jax-on-cpu.md): the script re-executes itself with ``LD_PRELOAD``
(``rubric_rl.util.tcmalloc``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rubric_rl.util.tcmalloc import preload_env  # stdlib only: runs before jax is imported

_env = preload_env(os.environ)
if _env is not None:
    os.execve(sys.executable, [sys.executable, *sys.argv], _env)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rubric_rl.core import sharding  # noqa: E402
from rubric_rl.core import train_step as ts  # noqa: E402
from rubric_rl.models.qwen3 import PRESETS, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from rubric_rl.models.rngs import init_rngs  # noqa: E402


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``fn()`` run to completion."""
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    return time.perf_counter() - wall, time.process_time() - cpu


def matmul_rates(n: int = 2048, reps: int = 3) -> tuple[float, float]:
    """Best float32 [n, n] @ [n, n] FLOP/s over ``reps``: (per wall second, per CPU second)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    f(a, b).block_until_ready()
    times = [_timed(lambda: f(a, b)) for _ in range(reps)]
    flops = 2 * n**3
    return flops / min(t[0] for t in times), flops / min(t[1] for t in times)


def matmul_params(cfg: Qwen3Config) -> int:
    d, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    return cfg.num_hidden_layers * layer + d * cfg.vocab_size


def attention_flops(cfg: Qwen3Config, batch: int, seq: int) -> float:
    """Causal QK^T and PV matmuls of one forward pass over ``batch`` sequences of ``seq``."""
    per_seq = 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq**2 / 2
    return batch * per_seq


def make_batch(cfg: Qwen3Config, batch: int, seq: int, context: int) -> ts.TrainBatch:
    """Prompt (first quarter) + completion; the teacher sees ``context`` privileged tokens in
    place of the start of the prompt, same length, completion aligned at offset 0."""
    rng = np.random.default_rng(0)
    v = cfg.vocab_size
    ids = rng.integers(0, v, (batch, seq)).astype(np.int32)
    teacher = ids.copy()
    teacher[:, :context] = rng.integers(0, v, (batch, context))
    loss_mask = np.zeros((batch, seq), np.float32)
    loss_mask[:, seq // 4 : seq - 1] = 1.0
    pos = np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy()
    ones = np.ones((batch, seq), np.int32)
    return ts.TrainBatch(
        input_ids=ids,
        positions=pos,
        attention_mask=ones,
        loss_mask=loss_mask,
        rollout_logps=-rng.uniform(0.5, 8.0, (batch, seq)).astype(np.float32),
        advantages=rng.normal(size=batch).astype(np.float32),
        seq_weights=np.ones(batch, np.float32),
        teacher_input_ids=teacher,
        teacher_positions=pos,
        teacher_attention_mask=ones,
        teacher_offset=np.zeros(batch, np.int32),
        sd_mask=np.ones(batch, np.float32),
        sd_coef=np.full(batch, 0.5, np.float32),
    )


def bench_preset(name: str, args: argparse.Namespace) -> dict:
    cfg = PRESETS[name]
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    config = ts.TrainConfig(
        lr=1e-5,
        sd_estimator="full",
        rollout_correction="bypass",
        chunk_size=args.chunk_size,
        num_micro_batches=args.micro_batches,
    )
    model = sharding.init_sharded(lambda: Qwen3ForCausalLM(cfg, rngs=init_rngs(0)), mesh)
    graphdef, state = ts.init_train_state(model, config, mesh)
    step = ts.make_train_step(config, graphdef, mesh)
    batch = sharding.shard_batch(make_batch(cfg, args.batch, args.seq, args.seq // 8), mesh)
    holder = {"state": state}

    def run():
        holder["state"], holder["metrics"] = step(holder["state"], batch)
        return holder["metrics"]

    compile_s = _timed(run)[0]
    # Shared machines drift by ~2× within minutes: time the matmul between the steps and compare
    # best with best; the CPU-time figures discount time lost to other processes.
    times, matmuls = [], [matmul_rates()]
    for _ in range(args.steps):
        times.append(_timed(run))
        matmuls.append(matmul_rates())
    metrics = holder["metrics"]
    step_s, step_cpu = min(t[0] for t in times), min(t[1] for t in times)
    matmul, matmul_cpu = max(m[0] for m in matmuls), max(m[1] for m in matmuls)
    tokens = args.batch * args.seq
    n = matmul_params(cfg)
    flops = 6 * n * tokens + 2 * n * tokens  # student fwd+bwd, teacher fwd (T' = T here)
    attn = 4 * attention_flops(cfg, args.batch, args.seq)  # student fwd+bwd (3×) + teacher (1×)
    return {
        "params": cfg.num_params(),
        "matmul_params": n,
        "step_s": round(step_s, 4),
        "compile_s": round(compile_s, 2),
        "tokens_per_s": round(tokens / step_s, 1),
        "model_gflops_per_s": round(flops / step_s / 1e9, 2),
        "matmul_gflops_per_s": round(matmul / 1e9, 2),
        "ratio_to_matmul": round(flops / step_s / matmul, 3),
        "ratio_with_attention": round((flops + attn) / step_s / matmul, 3),
        "ratio_to_matmul_cpu_time": round(flops / step_cpu / matmul_cpu, 3),
        "loss": round(float(metrics["loss"]), 5),
        "sd_kl": round(float(metrics["sd/kl"]), 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="5m,20m", help="comma-separated model presets")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    parser.add_argument("--chunk-size", type=int, default=128, help="LM-head sequence chunk")
    parser.add_argument("--micro-batches", type=int, default=1)
    args = parser.parse_args()
    for name in args.presets.split(","):
        if name not in PRESETS:
            parser.error(f"--presets: unknown preset {name!r}; known: {sorted(PRESETS)}")
    results = {name: bench_preset(name, args) for name in args.presets.split(",")}
    out = {
        "benchmark": "train_step",
        "step": "grpo+sd_full",
        "batch": args.batch,
        "seq": args.seq,
        "chunk_size": args.chunk_size,
        "micro_batches": args.micro_batches,
        "device": jax.devices()[0].device_kind,
        "tcmalloc": "tcmalloc" in os.environ.get("LD_PRELOAD", ""),
        "presets": results,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
