"""Rollout throughput: the in-process JAX engine vs `transformers`' PyTorch `generate`.

Prints ONE JSON line. For each preset (default "5m" and "20m", random weights): generated tokens
per second of `JaxEngine.generate` at batch 32 (prefill + KV-cache decode, sampling at T = 1,
top-p 1, no stop token so every row decodes `max_new_tokens`), and of `transformers`
`Qwen3ForCausalLM.generate` on the SAME weights (exported with `rubric_rl.models.save_pretrained`)
with the same prompts, lengths and `do_sample=True`, torch threads = 2, in the same process.
`ratio_vs_hf` = JAX tok/s ÷ HF tok/s (aim ≥ 3). Runs alternate JAX/HF and each figure is the best
of `--repeats` timed runs (after one untimed warm-up / compile), so load from other processes on a
shared machine hits both sides alike. Absolute numbers only mean something on a quiet machine.

`--sglang`: also the tokens/s of a local SGLang server (`.venv-sglang`, via
`rubric_rl.rollout.sglang_server`) on the same checkpoint, batch 32 in flight.

Usage: LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
  python benchmarks/rollout.py [--presets 5m,20m] [--prompt_len 64] [--max_new_tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


def _jax_side(cfg, batch, prompts, max_new, repeats, timings):
    from flax import nnx

    from rubric_rl.models.qwen3 import Qwen3ForCausalLM
    from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
    from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    engine = JaxEngine(
        model, JaxEngineConfig(prompt_buckets=(prompts.shape[1],), batch_buckets=(batch,))
    )
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0)

    def run(step: int) -> float:
        reqs = [
            GenerationRequest(tuple(p.tolist()), f"r{i}", step=step, task_index=i)
            for i, p in enumerate(prompts)
        ]
        t0 = time.perf_counter()
        gens = engine.generate(reqs, params)
        dt = time.perf_counter() - t0
        n = sum(len(g[0].token_ids) for g in gens)
        assert n == batch * max_new, f"JAX engine produced {n} tokens, expected {batch * max_new}"
        return n / dt

    run(0)  # compile
    timings["compiles"] = engine.num_traces
    return model, run


def _hf_side(model, batch, prompts, max_new, path):
    import torch
    import transformers

    from rubric_rl.models import save_pretrained

    save_pretrained(model, path)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts, dtype=torch.long)
    mask = torch.ones_like(ids)

    def run(step: int) -> float:
        torch.manual_seed(step)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                pad_token_id=0,
                eos_token_id=None,
            )
        dt = time.perf_counter() - t0
        n = (out.shape[1] - ids.shape[1]) * batch
        assert n == batch * max_new, f"transformers produced {n} tokens"
        return n / dt

    return run


def _sglang_side(path, batch, prompts, max_new):
    from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
    from rubric_rl.rollout.sglang_client import SGLangEngine
    from rubric_rl.rollout.sglang_server import SGLangServer, SGLangServerConfig

    server = SGLangServer(SGLangServerConfig(model_path=path)).start()
    try:
        engine = SGLangEngine([server], seed_mode="none", max_concurrency=batch)
        params = SamplingParams(max_new_tokens=max_new, temperature=1.0)
        reqs = [GenerationRequest(tuple(p.tolist()), f"s{i}") for i, p in enumerate(prompts)]
        engine.generate(reqs[:2], params)  # warm-up
        t0 = time.perf_counter()
        gens = engine.generate(reqs, params)
        dt = time.perf_counter() - t0
        engine.close()
        return sum(len(g[0].token_ids) for g in gens) / dt
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="5m,20m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--torch_threads", type=int, default=2)
    ap.add_argument("--sglang", action="store_true", help="also time a local SGLang server")
    args = ap.parse_args()

    import torch

    from rubric_rl.models.qwen3 import PRESETS

    torch.set_num_threads(args.torch_threads)
    result: dict = {
        "benchmark": "rollout",
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "max_new_tokens": args.max_new_tokens,
        "torch_threads": args.torch_threads,
        "tcmalloc": "tcmalloc" in os.environ.get("LD_PRELOAD", ""),
    }
    for name in args.presets.split(","):
        cfg = PRESETS[name]
        rs = np.random.RandomState(0)
        prompts = rs.randint(1, cfg.vocab_size, (args.batch, args.prompt_len)).astype(np.int64)
        timings: dict = {}
        model, jax_run = _jax_side(
            cfg, args.batch, prompts, args.max_new_tokens, args.repeats, timings
        )
        with tempfile.TemporaryDirectory() as tmp:
            hf_run = _hf_side(model, args.batch, prompts, args.max_new_tokens, tmp)
            hf_run(0)  # warm-up
            jax_tps, hf_tps = [], []
            for r in range(args.repeats):
                jax_tps.append(jax_run(r + 1))
                hf_tps.append(hf_run(r + 1))
            entry = {
                "params": cfg.num_params(),
                "jax_tok_s": round(max(jax_tps), 1),
                "hf_generate_tok_s": round(max(hf_tps), 1),
                "ratio_vs_hf": round(max(jax_tps) / max(hf_tps), 2),
                "jax_compiles": timings["compiles"],
            }
            if args.sglang:
                try:
                    entry["sglang_tok_s"] = round(
                        _sglang_side(tmp, args.batch, prompts, args.max_new_tokens), 1
                    )
                except Exception as e:  # noqa: BLE001 - optional figure
                    entry["sglang_error"] = f"{type(e).__name__}: {e}"[:300]
        result[name] = entry
    print(json.dumps(result))


if __name__ == "__main__":
    main()
