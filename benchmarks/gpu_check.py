r"""One-shot GPU acceptance check; prints ONE JSON line.

    python benchmarks/gpu_check.py --mode=cpu                   # tiny shapes, seconds (the test)
    python benchmarks/gpu_check.py --mode=gpu --out OUT.json    # one H200, fits 8 minutes

Parts (``--parts``, comma-separated; each a sub-object of the line with ``ok``, ``wall_s`` and
either its figures, ``error`` (the check raised: the others still run) or ``skipped`` (the
``--budget-s`` left was below the part's estimate)):

- ``parity``: logits of a small random Qwen3 in bf16 compute (attention "auto": cuDNN on GPU)
  against the same parameters in float32 (attention "xla"), one row left-padded: max abs / rel
  error of the log-softmax over the real positions, argmax agreement, KL(p32 ‖ pbf16), and no
  NaN/inf on the padded positions.
- ``attention``: the attention kernels (``qwen3.attention``, its causal-block variant,
  ``qwen3.fused_attention`` "xla", and on GPU "cudnn" — cuDNN's padding-causal kernel, the
  model's path for these contiguous rows — and "cudnn_masked", the mask-as-bias path it
  replaced) on bf16 inputs whose mask has fully padded query rows, against a float64 numpy
  reference on the real rows; every output and every gradient finite; gradients against a
  plain-einsum float32 reference; each kernel's compiled forward + backward milliseconds.
- ``logprob_memory``: compiled temp bytes (``jit(...).lower(...).compile().memory_analysis()``) of
  ``core/logprobs.py``'s chunked log-probs, forward + backward, against the naive B·T·V·4 bytes of
  float32 logits and against the unchunked log-softmax compiled in the same run; also the SD path
  (chunked log-probs + full-vocabulary KL to a teacher).
- ``train_step``: ``make_train_step`` (GRPO + full-vocabulary self-distillation, AdamW) on the
  Qwen3-0.6B and Qwen3-1.7B shapes (random init, bf16 compute, float32 master weights and
  log-softmax, attention "auto") at 4096 tokens per sequence, remat ``--train-remat`` (default
  "dots": the weight matmuls' outputs kept, so no matmul is recomputed and the counted FLOPs are
  the executed ones; "full" recomputes each layer's forward, +2·N·B·T uncounted FLOPs, capping
  MFU near 0.8× the matmul rate); the batch halves on out-of-memory. tokens/s, MFU and the
  allocator's peak bytes. Expected activation memory per policy at these shapes:
  ``benchmarks/remat_memory.py --preset=qwen3_0_6b --batch=8 --seq=4096`` (dots 27.5 GiB, none
  202 GiB: the reason the default is not "none").
- ``decode``: ``JaxEngine.generate`` at batch 64 (T = 1, ``ignore_eos``: every row decodes
  ``max_new_tokens``; prefill included) against the memory-bandwidth bound.
- ``loop``: ``rubric_rl.trainer.Trainer`` on ``configs/grpo.py:gpu`` with what the device lacks
  replaced: random weights (a preset; the embedded word tokenizer), the in-process JAX engine, the
  embedded constraints domain and its programmatic judge; no warm start, evaluation, calibration,
  checkpoints or TensorBoard; 10 steps (CPU: 3 on the tiny preset).

FLOPs (model FLOPs, no credit for rematerialisation or the LM-head chunk recomputation):
  N = matmul parameters (every attention and MLP kernel plus the [D, V] unembedding).
  train step = 6·N·B·T (student forward + backward) + 2·N·B·T (teacher forward, same length)
               + 4 · 2·L·H·hd·T²·B (causal QK^T and PV: 2·2·L·H·hd·T²/2 per forward, ×3 for the
               student's forward + backward, ×1 for the teacher).
  MFU = FLOPs / step seconds / peak; peak = the chip's dense bf16 datasheet figure (H100/H200:
  989 TFLOP/s; ``--peak-tflops``); ``ratio_to_measured_matmul`` uses a bf16 8192³ matmul timed in
  the same run (CPU mode: a float32 one; there "mfu" is that ratio, no datasheet).
Decode bound: tokens/s ≤ B · bandwidth / (weight bytes + KV bytes read per step); the engine
attends over the whole preallocated cache (prompt + max_new_tokens − 1 slots), so
``bound_tok_s`` reads the full cache each step and ``bound_live_tok_s`` only the filled slots
(average). Bandwidth: the datasheet (H200 4.8 TB/s, ``--bandwidth-tbs``) and a device copy timed in
the same run. Goals: ``train_step`` MFU ≥ 0.45 (Qwen3-0.6B and 1.7B), log-prob temp
bytes ≤ 0.25 × B·T·V·4; ``goals`` holds them as booleans (null where not measured).

RUNNING IT ON THE DEVICE MACHINE (nvidia-h200: no network; its own python3 3.12 with jax 0.11.x
CUDA 13, flax, optax, orbax-checkpoint, numpy, ml-dtypes, absl-py, pyyaml, safetensors, tokenizers,
transformers, jinja2, httpx, tqdm, pyarrow; /work/.library/device/KINDS.md). Of setup.py's CORE it
lacks ``ml-collections`` (configs/, builders, Trainer: needed by the ``loop`` part only) and
``tensorboardX`` (optional in metrics.py; the loop turns TensorBoard off anyway); its versions of
jax/flax/transformers differ from our pins (the JSON's ``env.versions`` records them). The other
parts import only jax, flax, optax, numpy and rubric_rl.{core,models,rollout}. The script puts
the repo root on ``sys.path`` itself: no install of rubric_rl. Once, here, in the repo root:

    mkdir -p .git/info && echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux2014_x86_64 -d .whl ml-collections==1.1.0

(a 77 kB pure-Python wheel; its needs, absl-py and PyYAML, are on the device). Then ONE device
call, ``run`` with ``carry=[".whl"]`` and ``timeout_s=600``:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \
    PYTHONUNBUFFERED=1 timeout 560 python3 benchmarks/gpu_check.py --mode=gpu \
      --out $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log

``--out`` is rewritten after every part, so a run cut short (``timeout 560``) still returns what
it measured; progress lines go to stderr. The default ``--budget-s`` (GPU 420) starts no part
after 7 minutes; a part it skipped says so, and a second call can run just those
(``--parts=decode,loop --budget-s=400``) if device time is left (15 minutes per session, the
machine's start included). ``--loop-preset=20m`` makes the loop a small embedded model when the
28-layer compiles do not fit.

FIRST H200 RUN (2026-12-04, benchmarks/results/gpu_check-2026-12-04.jsonl; two calls: all parts
with ``--budget-s=380``, then ``--parts=decode,loop --loop-preset=20m --budget-s=140``): parity,
attention (cuDNN too), log-prob memory and decode passed; train_step MFU 0.108 / 0.192 (0.6B /
1.7B) with "auto" = jax's XLA attention (see `qwen3._use_fused`: "auto" is cuDNN from then on);
the loop part never ran (skipped by budget; the tiny-shape loop on that GPU outlasted a 35-s
window). That run's train step used remat "full" (the default then). The train step's four
parts took 277 s, so a session should give the next run the skipped parts first:
``--parts=attention,train_step,loop --loop-preset=20m`` (the two cuDNN attention paths timed,
the train step with cuDNN's padding-causal kernel and remat "dots", the loop), then the rest;
``--train-remat=full`` repeats the first run's policy for an A/B.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PARTS = ("parity", "attention", "logprob_memory", "train_step", "decode", "loop")
# Dense bf16 datasheet peaks (TFLOP/s) and HBM bandwidth (TB/s), by device_kind substring.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
BANDWIDTH_TBS = {"H200": 4.8, "H100": 3.35, "A100": 2.0}
GOAL_MFU, GOAL_LOGPROB_MEMORY = 0.45, 0.25  # the acceptance goals (module docstring)

# Per-mode shapes and the seconds a part needs at least (skipped when less budget is left; ours).
SHAPES: dict[str, dict[str, Any]] = {
    "cpu": dict(
        budget_s=600.0,  # a guard only: the tiny parts take about a minute
        parity=dict(vocab=512, layers=2, batch=2, seq=32),
        attention=dict(batch=2, seq=64, heads=4, kv_heads=2, head_dim=16),
        logprob=dict(batch=2, seq=256, hidden=64, vocab=4096, chunk=32),
        train=dict(presets=("tiny",), batch=4, seq=64, steps=2),
        decode=dict(preset="tiny", batch=64, prompt=16, new=16, repeats=1),
        loop=dict(preset="tiny", steps=3, tasks=2, samples=4, new=8, prompt=96),
        min_s=dict(parity=5, attention=5, logprob_memory=5, train_step=10, decode=5, loop=20),
    ),
    "gpu": dict(
        budget_s=420.0,
        parity=dict(vocab=151936, layers=4, batch=4, seq=512),
        attention=dict(batch=4, seq=1024, heads=16, kv_heads=8, head_dim=128),
        logprob=dict(batch=8, seq=4096, hidden=1024, vocab=151936, chunk=128),
        train=dict(presets=("qwen3_0_6b", "qwen3_1_7b"), batch=8, seq=4096, steps=3),
        decode=dict(preset="qwen3_0_6b", batch=64, prompt=128, new=256, repeats=2),
        loop=dict(preset="qwen3_0_6b", steps=10, tasks=8, samples=8, new=256, prompt=96),
        min_s=dict(parity=20, attention=15, logprob_memory=20, train_step=90, decode=60, loop=120),
    ),
}


def _log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def _r(x: float, n: int = 6) -> float:
    return float(f"{float(x):.{n}g}")


def _block(x: Any) -> Any:
    import jax

    return jax.block_until_ready(x)


def _peak(kind: str, table: dict[str, float]) -> float | None:
    return next((v for k, v in table.items() if k in kind), None)


# ----------------------------------------------------------------------------- environment


def environment(mode: str) -> dict[str, Any]:
    import importlib.metadata as md

    import jax

    versions = {}
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    dev = jax.devices()[0]
    return {
        "mode": mode,
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def measured_matmul_flops(mode: str) -> float:
    """Best FLOP/s of a square matmul (GPU: bf16 8192³; CPU: float32 512³) over 3 runs."""
    import jax
    import jax.numpy as jnp

    n, dtype = (8192, jnp.bfloat16) if mode == "gpu" else (512, jnp.float32)
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(jnp.dot)
    _block(f(a, b))
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        _block(f(a, b))
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def measured_bandwidth(mode: str) -> float:
    """Best bytes/s (read + write) of a device copy (x * 1) of 2 GiB (CPU: 64 MiB)."""
    import jax
    import jax.numpy as jnp

    n = (2 << 30) // 4 if mode == "gpu" else (64 << 20) // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda x: x * 1.0001)
    _block(f(x))
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        _block(f(x))
        best = min(best, time.perf_counter() - t0)
    return 2 * 4 * n / best


# ----------------------------------------------------------------------------- helpers


def _one_device_mesh():
    import jax

    from rubric_rl.core import sharding

    return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def _model(cfg, mesh, *, dtype, param_dtype=None, impl="xla", remat=False):
    import jax.numpy as jnp

    from rubric_rl.core import sharding
    from rubric_rl.models.qwen3 import Qwen3ForCausalLM
    from rubric_rl.models.rngs import init_rngs

    return sharding.init_sharded(
        lambda: Qwen3ForCausalLM(
            cfg,
            rngs=init_rngs(0),
            dtype=dtype,
            param_dtype=param_dtype or jnp.float32,
            remat=remat,
            attention_impl=impl,
        ),
        mesh,
    )


def matmul_params(cfg) -> int:
    d, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    return cfg.num_hidden_layers * layer + d * cfg.vocab_size


def train_step_flops(cfg, batch: int, seq: int) -> tuple[float, float]:
    """(matmul FLOPs, attention FLOPs) of one GRPO + SD step (module docstring)."""
    n = matmul_params(cfg)
    dense = 8 * n * batch * seq
    attn = 4 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq**2 * batch
    return float(dense), float(attn)


# ----------------------------------------------------------------------------- parts


def part_parity(ctx: dict) -> dict:
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from rubric_rl.models.qwen3 import PRESETS

    s = ctx["shapes"]["parity"]
    # Qwen3-0.6B's widths and vocabulary, fewer layers (GPU); the tiny preset's on CPU.
    base = PRESETS["qwen3_0_6b" if ctx["mode"] == "gpu" else "tiny"]
    cfg = dataclasses.replace(base, vocab_size=s["vocab"], num_hidden_layers=s["layers"])
    mesh = _one_device_mesh()
    m32 = _model(cfg, mesh, dtype=jnp.float32, impl="xla")
    m16 = _model(cfg, mesh, dtype=jnp.bfloat16, impl="auto")
    b, t = s["batch"], s["seq"]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.int32)
    pad = t // 4
    mask[0, :pad] = 0  # row 0 left-padded: its first `pad` query rows are fully masked
    real = mask.astype(bool)

    def logits(graphdef, params, ids, mask):
        return nnx.merge(graphdef, params)(ids, None, mask)

    def stats(l32, l16, real):
        a, c = jax.nn.log_softmax(l32, -1), jax.nn.log_softmax(l16, -1)
        err = jnp.abs(a - c)
        rel = err / jnp.maximum(jnp.abs(a), 1.0)
        r = real[..., None]
        agree = jnp.argmax(l32, -1) == jnp.argmax(l16, -1)
        kl = jnp.sum(jnp.exp(a) * (a - c), -1)
        n_real = jnp.sum(real)
        return {
            "logsoftmax_max_abs_err": jnp.max(jnp.where(r, err, 0.0)),
            "logsoftmax_max_rel_err": jnp.max(jnp.where(r, rel, 0.0)),
            "logsoftmax_mean_abs_err": jnp.sum(jnp.where(r, err, 0.0)) / (n_real * a.shape[-1]),
            "argmax_agreement": jnp.sum(agree & real) / n_real,
            "kl_f32_bf16_mean": jnp.sum(jnp.where(real, kl, 0.0)) / n_real,
            "finite_all_positions": jnp.all(jnp.isfinite(l16)) & jnp.all(jnp.isfinite(l32)),
            "logit_std_f32": jnp.std(jnp.where(r, l32, 0.0)),
        }

    g32, p32 = nnx.split(m32)
    g16, p16 = nnx.split(m16)
    same = all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(p32), jax.tree.leaves(p16))
    )
    run = jax.jit(logits, static_argnums=0)
    # The reference in full float32 (GPUs may run float32 dots as TF32 by default); the bf16
    # model at the default precision, as training runs it.
    with jax.default_matmul_precision("highest"):
        l32 = run(g32, p32, ids, mask)
    l16 = run(g16, p16, ids, mask)
    out = {k: v.item() for k, v in jax.jit(stats)(l32, l16, real).items()}
    out = {k: v if isinstance(v, bool) else _r(v) for k, v in out.items()}
    out.update(
        same_parameters=same,
        shape=dict(
            vocab=cfg.vocab_size,
            hidden=cfg.hidden_size,
            layers=cfg.num_hidden_layers,
            batch=b,
            seq=t,
            padded_rows=pad,
        ),
        attention_bf16=ctx["attention_auto"],
    )
    return out


def _reference_attention_np(q, k, v, mask):
    """float64 numpy GQA attention; rows with no allowed key -> NaN (compared nowhere)."""
    import numpy as np

    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [B, H, T, hd]: batched GEMMs
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    s = np.where(mask[:, None], s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3)


def _reference_attention_jnp(q, k, v, mask):
    """Plain float32 einsum GQA attention (the gradient reference); masked rows output 0."""
    import jax.numpy as jnp

    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
    m = mask[:, None]
    s = jnp.where(m, s, -1e30)
    p = jnp.exp(s - s.max(-1, keepdims=True)) * m
    p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
    return jnp.einsum("bhts,bshd->bthd", p, v)


def part_attention(ctx: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from rubric_rl.models import qwen3

    s = ctx["shapes"]["attention"]
    b, t, h, kv, hd = s["batch"], s["seq"], s["heads"], s["kv_heads"], s["head_dim"]
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (b, t, h, hd), jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, t, kv, hd), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, t, kv, hd), jnp.bfloat16)
    valid = np.ones((b, t), bool)
    valid[0, : t // 4] = False  # left padding: these query rows see no key (causal)
    valid[-1, : t // 2] = False
    mask = np.tril(np.ones((t, t), bool))[None] & valid[:, None, :]
    real = mask.any(-1)  # [B, T]
    ref = _reference_attention_np(q, k, v, mask)
    # Gradient weights: real rows only (what a loss sees), so masked rows' garbage is ignored.
    w = jax.random.normal(jax.random.key(2), (b, t, h, hd), jnp.float32) * real[..., None, None]
    with jax.default_matmul_precision("highest"):  # full float32 reference (not TF32)
        ref_grads = jax.jit(
            jax.grad(
                lambda q, k, v: jnp.sum(_reference_attention_jnp(q, k, v, mask) * w), (0, 1, 2)
            )
        )(q, k, v)
    blocks = 4  # the training forward's query blocks (causal_blocks_for: 4 from T = 256 on)
    impls: dict[str, Callable] = {
        "model_xla": lambda q, k, v, m: qwen3.attention(q, k, v, m),
        f"model_xla_causal_blocks_{blocks}": lambda q, k, v, m: qwen3.attention(
            q, k, v, m, causal_blocks=blocks
        ),
        "jax_xla": lambda q, k, v, m: qwen3.fused_attention(q, k, v, m, "xla"),
    }
    if ctx["mode"] == "gpu":
        # the model's path (`fused_attention`: these rows are contiguous, so cuDNN's
        # padding-causal kernel) and the mask-as-bias one it replaced
        impls["cudnn"] = lambda q, k, v, m: qwen3.fused_attention(q, k, v, m, "cudnn")
        impls["cudnn_masked"] = lambda q, k, v, m: qwen3.masked_attention(q, k, v, m, "cudnn")
    tol = 2e-2  # bf16 output of a float32 softmax: relative 2^-8 of |out| <= ~3
    out: dict[str, Any] = {
        "shape": dict(batch=b, seq=t, heads=h, kv_heads=kv, head_dim=hd),
        "masked_rows": int((~real).sum()),
        "tolerance": tol,
    }
    ok = True
    for name, fn in impls.items():
        try:
            o = np.asarray(jax.jit(fn)(q, k, v, mask), np.float64)
            grad_fn = jax.jit(
                jax.grad(
                    lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v, mask).astype(jnp.float32) * w),
                    (0, 1, 2),
                )
            )
            grads = _block(grad_fn(q, k, v))
            best = math.inf  # forward + backward, compiled, best of 3
            for _ in range(3):
                t0 = time.perf_counter()
                _block(grad_fn(q, k, v))
                best = min(best, time.perf_counter() - t0)
            gerr = max(
                float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(r, np.float64))))
                / max(float(np.max(np.abs(np.asarray(r, np.float64)))), 1e-9)
                for g, r in zip(grads, ref_grads)
            )
            r = {
                "max_abs_err_real_rows": _r(np.max(np.abs(o - ref)[real])),
                "finite": bool(np.isfinite(o).all()),
                "grads_finite": bool(all(np.isfinite(np.asarray(g)).all() for g in grads)),
                "grad_max_rel_err": _r(gerr),
                "fwd_bwd_ms": _r(best * 1e3),
            }
            r["ok"] = bool(
                r["finite"]
                and r["grads_finite"]
                and r["max_abs_err_real_rows"] <= tol
                and r["grad_max_rel_err"] <= 5e-2
            )
        except Exception as e:  # noqa: BLE001 - one kernel failing is a finding, not a crash
            r = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        ok = ok and r["ok"]
        out[name] = r
    out["all_ok"] = ok
    return out


def part_logprob_memory(ctx: dict) -> dict:
    import jax
    import jax.numpy as jnp

    from rubric_rl.core.logprobs import chunked_token_stats, token_logprobs

    s = ctx["shapes"]["logprob"]
    b, t, d, v, chunk = s["batch"], s["seq"], s["hidden"], s["vocab"], s["chunk"]
    hdt = jnp.bfloat16 if ctx["mode"] == "gpu" else jnp.float32
    h = jax.ShapeDtypeStruct((b, t, d), hdt)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    tgt = jax.ShapeDtypeStruct((b, t), jnp.int32)
    m = jax.ShapeDtypeStruct((b, t), jnp.float32)

    def chunked(h, w, tgt, m):
        return jnp.sum(token_logprobs(h, w, tgt, chunk_size=chunk)[0] * m)

    def naive(h, w, tgt, m):
        logits = jnp.dot(h.reshape(b * t, d).astype(jnp.float32), w)
        lp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tgt.reshape(-1, 1), -1)
        return jnp.sum(lp.reshape(b, t) * m)

    def sd(h, w, tgt, m, th):
        o = chunked_token_stats(h, w, tgt, th, chunk_size=chunk, kl_estimator="full")
        return jnp.sum((o["logps"] + o["kl"]) * m)

    def temp(fn, *args) -> int:
        grad = jax.grad(fn, argnums=(0, 1))
        analysis = jax.jit(grad).lower(*args).compile().memory_analysis()
        return int(analysis.temp_size_in_bytes)

    naive_bytes = b * t * v * 4
    c, n, t_sd = temp(chunked, h, w, tgt, m), temp(naive, h, w, tgt, m), temp(sd, h, w, tgt, m, h)
    return {
        "shape": dict(batch=b, seq=t, hidden=d, vocab=v, chunk=chunk, hidden_dtype=str(hdt.dtype)),
        "naive_bytes_BTV4": naive_bytes,
        "chunked_temp_bytes": c,
        "unchunked_temp_bytes": n,
        "sd_full_chunked_temp_bytes": t_sd,
        "ratio_to_naive": _r(c / naive_bytes, 4),
        "ratio_unchunked_to_naive": _r(n / naive_bytes, 4),
        "ratio_sd_to_naive": _r(t_sd / naive_bytes, 4),
        "what": "forward + backward (grad wrt hidden and unembedding), compiled temp bytes",
    }


def _train_batch(cfg, batch: int, seq: int):
    """Prompt (first quarter) + completion; the teacher sees privileged tokens in place of the
    first eighth, same length, completion aligned at offset 0 (as benchmarks/train_step.py)."""
    import numpy as np

    from rubric_rl.core import train_step as ts

    rng = np.random.default_rng(0)
    v = cfg.vocab_size
    ids = rng.integers(0, v, (batch, seq)).astype(np.int32)
    teacher = ids.copy()
    teacher[:, : seq // 8] = rng.integers(0, v, (batch, seq // 8))
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


def _is_oom(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}"
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _bench_train_preset(ctx: dict, name: str, batch: int) -> dict:
    import gc

    import jax
    import jax.numpy as jnp

    from rubric_rl.core import sharding
    from rubric_rl.core import train_step as ts
    from rubric_rl.models.qwen3 import PRESETS

    s = ctx["shapes"]["train"]
    cfg, seq, gpu = PRESETS[name], s["seq"], ctx["mode"] == "gpu"
    mesh = _one_device_mesh()
    config = ts.TrainConfig(
        lr=1e-5,
        sd_estimator="full",
        rollout_correction="bypass",
        chunk_size=128,
        num_micro_batches=ctx["args"].micro_batches,
    )
    dtype = jnp.bfloat16 if gpu else jnp.float32
    remat = ctx["args"].train_remat
    model = _model(cfg, mesh, dtype=dtype, impl=ctx["args"].train_attention, remat=remat)
    graphdef, state = ts.init_train_state(model, config, mesh)
    del model
    step = ts.make_train_step(config, graphdef, mesh)
    data = sharding.shard_batch(_train_batch(cfg, batch, seq), mesh)
    holder = {"state": state}
    del state

    def run() -> float:
        t0 = time.perf_counter()
        holder["state"], holder["metrics"] = step(holder["state"], data)
        _block(holder["metrics"])
        return time.perf_counter() - t0

    try:
        compile_s = run()
        times = [run() for _ in range(s["steps"])]
        metrics = {k: float(v) for k, v in holder["metrics"].items() if k in ("loss", "sd/kl")}
        peak_bytes = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    finally:
        holder.clear()
        gc.collect()
    step_s = min(times)
    dense, attn = train_step_flops(cfg, batch, seq)
    flops_s = (dense + attn) / step_s
    out = {
        "batch": batch,
        "seq": seq,
        "tokens_per_step": batch * seq,
        "attention_impl": ctx["args"].train_attention,
        "remat": remat,
        "params": cfg.num_params(),
        "matmul_params": matmul_params(cfg),
        "compile_plus_first_step_s": round(compile_s, 2),
        "step_s": _r(step_s),
        "step_s_all": [_r(x) for x in times],
        "tokens_per_s": _r(batch * seq / step_s),
        "model_tflops_per_s": _r(flops_s / 1e12),
        "attention_flop_share": _r(attn / (dense + attn), 3),
        "ratio_to_measured_matmul": _r(flops_s / ctx["matmul_flops"], 4),
        "loss": _r(metrics.get("loss", math.nan)),
        "sd_kl": _r(metrics.get("sd/kl", math.nan)),
        # the allocator's high-water mark since the process started (GPU; None on CPU): after
        # the first preset it is at least the earlier presets' peak
        "peak_bytes_in_use": peak_bytes,
    }
    peak = ctx["peak_flops"]
    out["mfu"] = _r(flops_s / peak, 4) if peak else out["ratio_to_measured_matmul"]
    out["mfu_reference"] = "datasheet_bf16" if peak else "measured_matmul"
    return out


def part_train_step(ctx: dict) -> dict:
    import gc

    s = ctx["shapes"]["train"]
    out: dict[str, Any] = {}
    for name in s["presets"]:
        left = ctx["deadline"] - time.perf_counter()
        if left < ctx["shapes"]["min_s"]["train_step"]:
            out[name] = {"skipped": f"budget: {left:.0f} s left"}
            continue
        batch, tries = ctx["args"].train_batch or s["batch"], []
        while True:
            try:
                out[name] = _bench_train_preset(ctx, name, batch)
                break
            except Exception as e:  # noqa: BLE001 - recorded per preset
                if _is_oom(e) and batch > 1:
                    tries.append(batch)
                    batch //= 2
                    gc.collect()  # the failed attempt's buffers
                    continue
                out[name] = {"error": f"{type(e).__name__}: {e}"[:800]}
                break
        if tries:
            out[name]["out_of_memory_at_batch"] = tries
        gc.collect()  # this preset's parameters and optimizer state, before the next one
    return out


def part_decode(ctx: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from rubric_rl.models.qwen3 import PRESETS
    from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
    from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

    s = ctx["shapes"]["decode"]
    cfg = PRESETS[s["preset"]]
    b, p, n = s["batch"], s["prompt"], s["new"]
    dtype = jnp.bfloat16 if ctx["mode"] == "gpu" else jnp.float32
    # Served weights in the compute dtype (what an inference engine reads per step; ours).
    model = _model(cfg, _one_device_mesh(), dtype=dtype, param_dtype=dtype)
    engine = JaxEngine(model, JaxEngineConfig(prompt_buckets=(p,), batch_buckets=(b,)))
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, cfg.vocab_size, (b, p))
    params = SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True)

    def run(step: int) -> tuple[float, int]:
        reqs = [
            GenerationRequest(tuple(x.tolist()), f"r{i}", step=step, task_index=i)
            for i, x in enumerate(prompts)
        ]
        t0 = time.perf_counter()
        gens = engine.generate(reqs, params)
        return time.perf_counter() - t0, sum(len(g[0].token_ids) for g in gens)

    compile_s, _ = run(0)
    runs = [run(i + 1) for i in range(s["repeats"])]
    best, tokens = min(r[0] for r in runs), runs[0][1]
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    itemsize = jnp.dtype(dtype).itemsize
    per_slot = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize
    cache_slots = p + n - 1
    kv_full, kv_live = b * cache_slots * per_slot, b * (p + n / 2) * per_slot
    bw_sheet, bw_measured = ctx["bandwidth"], ctx["bandwidth_measured"]
    tok_s = tokens / best
    out = {
        "preset": s["preset"],
        "batch": b,
        "prompt_len": p,
        "max_new_tokens": n,
        "tokens": tokens,
        "compile_plus_first_s": round(compile_s, 2),
        "generate_s": _r(best),
        "tokens_per_s": _r(tok_s),
        "weight_bytes": int(weight_bytes),
        "kv_bytes_per_step_full_cache": int(kv_full),
        "kv_bytes_per_step_live_avg": int(kv_live),
        "measured_bandwidth_bytes_s": _r(bw_measured),
        "compiles": engine.num_traces,
    }
    for label, bw in (("datasheet", bw_sheet), ("measured", bw_measured)):
        if bw:
            bound = b * bw / (weight_bytes + kv_full)
            live = b * bw / (weight_bytes + kv_live)
            out[f"bound_tok_s_{label}"] = _r(bound)
            out[f"bound_live_tok_s_{label}"] = _r(live)
            out[f"ratio_to_bound_{label}"] = _r(tok_s / bound, 4)
    engine.close()
    return out


def part_loop(ctx: dict) -> dict:
    try:
        import ml_collections  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            "ml_collections is missing: carry its wheel (see this script's docstring)"
        ) from e
    from configs import grpo
    from rubric_rl.config.builders import EMBEDDED_PRESETS, build_domain, build_word_tokenizer
    from rubric_rl.trainer import Trainer

    s = dict(ctx["shapes"]["loop"])
    if ctx["args"].loop_preset:
        s["preset"] = ctx["args"].loop_preset
    c = grpo.get_config("gpu")
    # What the device lacks (a checkpoint, SGLang, an LLM judge, the network) replaced; the
    # rest of configs/grpo.py:gpu (bf16, fsdp mesh, micro-batches, schedule, KL, advantage) kept.
    workdir = tempfile.mkdtemp(prefix="gpu_check_loop_")
    c.model.update(
        name=s["preset"], tokenizer="", max_prompt_len=s["prompt"], prompt_buckets=(s["prompt"],)
    )
    if ctx["mode"] == "cpu":
        c.model.dtype = "float32"
        c.optim.num_micro_batches = 2  # 4 rows per update on the tiny shape
    c.warmstart.update(steps=0, max_prompt_len=s["prompt"])
    c.rollout.update(
        engine="jax",
        tasks_per_step=s["tasks"],
        samples_per_task=s["samples"],
        max_new_tokens=s["new"],
        buckets=(s["new"],),
    )
    c.judge.kind = "programmatic"
    c.domain.update(name="constraints", n_train=64, n_heldout=8, n_ood=8)
    c.eval.update(at_start=False, every=0)
    c.calibration.enabled = False
    c.checkpoint.update(every=0, final=False)
    c.logging.update(tensorboard=False, progress_bar=False)
    c.train.steps = s["steps"]
    if s["preset"] not in EMBEDDED_PRESETS:
        # A Qwen3 shape with the embedded domain: its word tokenizer (vocab < 151936) by path.
        build_word_tokenizer(build_domain(c).vocabulary, os.path.join(workdir, "tok"))
        c.model.tokenizer = os.path.join(workdir, "tok")
    t0 = time.perf_counter()
    trainer = Trainer(c, os.path.join(workdir, "run"))
    try:
        rows = trainer.run()
    finally:
        trainer.close()
    wall = time.perf_counter() - t0
    steps = [r for r in rows if "loss" in r]
    step_s = [r.get("time/step") for r in steps]
    later = [x for x in step_s[1:] if x is not None]
    return {
        "preset": s["preset"],
        "dtype": c.model.dtype,
        "num_micro_batches": int(c.optim.num_micro_batches),
        "rollouts_per_step": s["tasks"] * s["samples"],
        "steps_requested": s["steps"],
        "steps_recorded": len(steps),
        "step_numbers": [int(r["step"]) for r in steps if "step" in r],
        "losses": [_r(r["loss"]) for r in steps],
        "all_losses_finite": all(math.isfinite(r["loss"]) for r in steps),
        "step_s": [_r(x) if x is not None else None for x in step_s],
        "median_step_s_after_first": _r(sorted(later)[len(later) // 2]) if later else None,
        "wall_s_including_build": round(wall, 2),
    }


PART_FNS: dict[str, Callable[[dict], dict]] = {
    "parity": part_parity,
    "attention": part_attention,
    "logprob_memory": part_logprob_memory,
    "train_step": part_train_step,
    "decode": part_decode,
    "loop": part_loop,
}


# ----------------------------------------------------------------------------- driver


def goals(result: dict) -> dict[str, bool | None]:
    """The issue's goals as booleans; None where the figure was not measured."""
    mfu: dict[str, bool | None] = {}
    ts = result.get("train_step", {})
    for name, r in ts.items() if isinstance(ts, dict) else []:
        if isinstance(r, dict) and "mfu" in r:
            mfu[name] = r["mfu_reference"] == "datasheet_bf16" and r["mfu"] >= GOAL_MFU
    lm = result.get("logprob_memory", {})
    ratio = lm.get("ratio_to_naive") if isinstance(lm, dict) else None
    return {
        "train_step_mfu_ge_0.45": mfu or None,
        "logprob_temp_le_0.25_naive": None if ratio is None else ratio <= GOAL_LOGPROB_MEMORY,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from rubric_rl.models.layer_stack import REMAT_POLICIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mode",
        choices=("cpu", "gpu"),
        default=None,
        help="shapes: tiny (cpu) or real (gpu); default gpu when jax sees a GPU",
    )
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {PARTS}")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="global seconds; a part starts only if its estimate fits (gpu 420, cpu 600)",
    )
    ap.add_argument("--train-batch", type=int, default=0, help="0 = the mode's default")
    ap.add_argument("--micro-batches", type=int, default=1, help="train_step part")
    ap.add_argument(
        "--train-attention",
        choices=("auto", "cudnn", "xla"),
        default="auto",
        help="train_step part's attention_impl (auto: cudnn on GPU, xla on CPU)",
    )
    ap.add_argument(
        "--train-remat",
        choices=REMAT_POLICIES,
        default="dots",
        help="train_step part's remat policy (the first H200 run: full)",
    )
    ap.add_argument("--loop-preset", default="", help="loop part's model; '' = the mode's")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="0 = by device kind")
    ap.add_argument("--bandwidth-tbs", type=float, default=0.0, help="0 = by device kind")
    ap.add_argument("--out", default="", help="also write the JSON here after every part")
    args = ap.parse_args(argv)
    unknown = [p for p in args.parts.split(",") if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown {unknown}; known: {list(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    import jax

    mode = args.mode or ("gpu" if jax.default_backend() == "gpu" else "cpu")
    shapes = SHAPES[mode]
    budget = args.budget_s if args.budget_s is not None else shapes["budget_s"]
    result: dict[str, Any] = {"benchmark": "gpu_check", "budget_s": budget}

    def dump() -> None:
        result["wall_s"] = round(time.perf_counter() - start, 2)
        result["goals"] = goals(result)
        if args.out:
            with open(args.out, "w") as f:
                f.write(json.dumps(result) + "\n")

    result["env"] = environment(mode)
    kind = result["env"]["device_kind"]
    peak = args.peak_tflops or (_peak(kind, PEAK_BF16_TFLOPS) if mode == "gpu" else None)
    bw = args.bandwidth_tbs or (_peak(kind, BANDWIDTH_TBS) if mode == "gpu" else None)
    ctx: dict[str, Any] = {
        "mode": mode,
        "args": args,
        "shapes": shapes,
        "deadline": start + budget,
        "peak_flops": peak * 1e12 if peak else None,
        "bandwidth": bw * 1e12 if bw else None,
        # what qwen3's "auto" resolves to for bf16 and head_dim 128 (`qwen3._use_fused`); jax's
        # own implementation=None would be its XLA path on GPU, not cuDNN.
        "attention_auto": "cudnn" if jax.default_backend() == "gpu" else "xla",
    }
    t0 = time.perf_counter()
    ctx["matmul_flops"] = measured_matmul_flops(mode)
    ctx["bandwidth_measured"] = measured_bandwidth(mode)
    result["env"].update(
        peak_tflops_datasheet=peak,
        bandwidth_tbs_datasheet=bw,
        measured_matmul_tflops=_r(ctx["matmul_flops"] / 1e12),
        measured_copy_bandwidth_tbs=_r(ctx["bandwidth_measured"] / 1e12),
        calibration_s=round(time.perf_counter() - t0, 2),
    )
    dump()
    for name in args.parts.split(","):
        left = ctx["deadline"] - time.perf_counter()
        if left < shapes["min_s"][name]:
            result[name] = {"ok": False, "skipped": f"budget: {left:.0f} s left of {budget:.0f}"}
            _log(f"{name}: skipped ({left:.0f} s left)")
            dump()
            continue
        _log(f"{name}: start ({left:.0f} s left)")
        t0 = time.perf_counter()
        try:
            r = PART_FNS[name](ctx)
            r["ok"] = not _has_error(r)
        except Exception as e:  # noqa: BLE001 - recorded; the other parts still run
            r = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}"[:800],
                "traceback": traceback.format_exc()[-1500:],
            }
        r["wall_s"] = round(time.perf_counter() - t0, 2)
        result[name] = r
        _log(f"{name}: {'ok' if r['ok'] else 'FAILED'} in {r['wall_s']} s")
        dump()
    dump()
    print(json.dumps(result), flush=True)
    return result


def _has_error(r: Any) -> bool:
    """An ``error`` anywhere in a part's result, or a sub-check's ``ok: False``."""
    if isinstance(r, dict):
        if "error" in r or r.get("ok") is False or r.get("all_ok") is False:
            return True
        return any(_has_error(v) for v in r.values())
    return False


if __name__ == "__main__":
    main()
