"""The machine's float32 matmul rate, for the peer workload's roofline; prints ONE JSON line.

    python benchmarks/peers/matmul_peak.py [--repeats 20]

Run by ``benchmarks/peer_step.py`` with our side's Python and environment, between its rounds'
conditions (same CPU, same allocator), one JAX device (XLA's CPU dots use every core). Times the
workload's own largest dots — the MLP's forward at the train step's tokens (32 rows × 72:
[2304, 256] × [256, 768] and [2304, 768] × [768, 256]) — and a 1024³ square one, each the best of
``--repeats``; ``matmul_flops_s`` is the best of them: the rate no side's dots can beat here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workload  # noqa: E402

TOKENS = (
    workload.PROMPTS_PER_STEP
    * workload.GENERATIONS
    * (workload.PROMPT_TOKENS + workload.NEW_TOKENS)
)
D, F = workload.SHAPE["hidden_size"], workload.SHAPE["intermediate_size"]
SHAPES = {"mlp_up": (TOKENS, D, F), "mlp_down": (TOKENS, F, D), "square_1024": (1024, 1024, 1024)}


def best_rate(m: int, k: int, n: int, repeats: int) -> float:
    """FLOP/s of the fastest of ``repeats`` jitted float32 [m, k] × [k, n] products."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    jax.block_until_ready(dot(a, b))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(dot(a, b))
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats ({a.repeats}) must be >= 1")
    import jax

    by_shape = {name: best_rate(*shape, a.repeats) for name, shape in SHAPES.items()}
    out = dict(
        matmul_flops_s=max(by_shape.values()),
        by_shape=by_shape,
        shapes={name: list(shape) for name, shape in SHAPES.items()},
        devices=jax.device_count(),
        backend=jax.default_backend(),
    )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
