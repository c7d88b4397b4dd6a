"""A hybrid Qwen3.5 (Gated DeltaNet + gated attention) next to a Qwen3 of about the same parameter
count: train-step and decode throughput on this machine; prints ONE JSON line.

    python benchmarks/hybrid_throughput.py [--hidden 256] [--layers 8] [--batch 8] [--seq 256]
        [--new 64] [--rounds 3]

Shapes (random init, float32): the hybrid is Qwen3.5 text with ``--layers`` layers in
transformers' default pattern (every 4th full attention), ``--hidden`` wide, FFN 3×, 4 query /
2 KV heads of 64 (partial rotary 0.25), Gated DeltaNet 2 key / 4 value heads of 64, conv 4. The
dense model is a Qwen3 of the same width, FFN and attention heads whose layer count gives the
parameter count closest to the hybrid's (both counts and their ratio are printed).

Train step: ``core.train_step.make_train_step`` (GRPO's clipped loss, AdamW, no KL, no SD) on a
``--batch`` × ``--seq`` batch, completion in the last three quarters. Decode: ``JaxEngine.generate``
of ``--batch`` prompts of ``--seq // 4`` tokens, ``--new`` tokens each (EOS ignored), T = 1: the
hybrid decodes with a KV cache for its full-attention layers and conv + recurrent state for the
linear ones. Each round times both models alternately (machine load hits both alike); figures
are the best round's, after one untimed compile round. ``ratio_*`` = hybrid ÷ dense tokens/s.
On a shared machine absolute figures mean little; the ratios are the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rubric_rl.util.tcmalloc import preload_env  # stdlib only: runs before jax is imported

if __name__ == "__main__":
    _env = preload_env(os.environ)
    if _env is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], _env)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_depth import make_batch  # noqa: E402

from rubric_rl.core import sharding  # noqa: E402
from rubric_rl.core import train_step as ts  # noqa: E402
from rubric_rl.models import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3ForCausalLM  # noqa: E402
from rubric_rl.models.config import Qwen3Config  # noqa: E402
from rubric_rl.models.qwen3_5_config import interval_layer_types  # noqa: E402
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams  # noqa: E402
from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig  # noqa: E402

VOCAB, HEADS, KV_HEADS, HEAD_DIM = 512, 4, 2, 64


def shapes(hidden: int, layers: int) -> tuple[Qwen3_5Config, Qwen3Config]:
    """(hybrid, dense of the closest parameter count)."""
    hybrid = Qwen3_5Config(
        VOCAB, hidden, 3 * hidden, layers, HEADS, KV_HEADS, HEAD_DIM,
        layer_types=interval_layer_types(layers, 4),
        linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    target = hybrid.num_params()

    def dense(n: int) -> Qwen3Config:
        return Qwen3Config(
            VOCAB, hidden, 3 * hidden, n, HEADS, KV_HEADS, HEAD_DIM,
            max_position_embeddings=4096, tie_word_embeddings=True,
        )  # fmt: skip

    best = min(range(1, 4 * layers + 1), key=lambda n: abs(dense(n).num_params() - target))
    return hybrid, dense(best)


def _best(fn, rounds: int) -> float:
    """Fastest of ``rounds`` timed calls (seconds)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def _train_runner(model, batch: int, seq: int):
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    config = ts.TrainConfig(lr=1e-5, rollout_correction="bypass", chunk_size=128)
    graphdef, state = ts.init_train_state(model, config, mesh)
    step = ts.make_train_step(config, graphdef, mesh)
    # compile_depth's GRPO batch: random ids, completion in the last three quarters
    data = sharding.shard_batch(make_batch(model.config, batch, seq), mesh)
    holder = {"state": state}

    def run():
        holder["state"], metrics = step(holder["state"], data)
        return metrics["loss"]

    return run


def _decode_runner(model, batch: int, prompt: int, new: int):
    engine = JaxEngine(model, JaxEngineConfig(prompt_buckets=(prompt,), batch_buckets=(batch,)))
    rng = np.random.default_rng(1)
    prompts = rng.integers(3, VOCAB, (batch, prompt))
    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    calls = {"n": 0}

    def run():
        calls["n"] += 1
        reqs = [
            GenerationRequest(tuple(int(t) for t in p), f"r{i}", step=calls["n"], task_index=i)
            for i, p in enumerate(prompts)
        ]
        out = engine.generate(reqs, params)
        assert sum(len(g[0].token_ids) for g in out) == batch * new
        return np.zeros(())

    return run


def measure(args: argparse.Namespace) -> dict:
    hybrid_cfg, dense_cfg = shapes(args.hidden, args.layers)
    models = {
        "hybrid": Qwen3_5ForCausalLM(hybrid_cfg, rngs=nnx.Rngs(0)),
        "dense": Qwen3ForCausalLM(dense_cfg, rngs=nnx.Rngs(0)),
    }
    params = {k: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
              for k, m in models.items()}  # fmt: skip
    runners = {}
    for k, m in models.items():
        runners[k] = {
            # the decode engine first: the train step donates (and so consumes) its state
            "decode": _decode_runner(m, args.batch, args.seq // 4, args.new),
            "train": _train_runner(m, args.batch, args.seq),
        }
    for k in models:  # compile round, untimed
        for r in runners[k].values():
            jax.block_until_ready(r())
    best: dict[str, dict[str, float]] = {k: {"train": float("inf"), "decode": float("inf")}
                                         for k in models}  # fmt: skip
    for _ in range(args.rounds):
        for k in models:
            for what, r in runners[k].items():
                best[k][what] = min(best[k][what], _best(r, 1))
    train_tokens, decode_tokens = args.batch * args.seq, args.batch * args.new
    out: dict = {
        "hidden": args.hidden,
        "hybrid_layers": hybrid_cfg.num_hidden_layers,
        "hybrid_linear_layers": sum(t == "linear_attention" for t in hybrid_cfg.layer_types),
        "dense_layers": dense_cfg.num_hidden_layers,
        "params_hybrid": params["hybrid"],
        "params_dense": params["dense"],
        "params_ratio": round(params["hybrid"] / params["dense"], 3),
        "batch": args.batch,
        "seq": args.seq,
        "new_tokens": args.new,
        "rounds": args.rounds,
    }
    for k in models:
        out[f"train_tokens_per_s_{k}"] = round(train_tokens / best[k]["train"], 1)
        out[f"decode_tokens_per_s_{k}"] = round(decode_tokens / best[k]["decode"], 1)
    out["ratio_train"] = round(
        out["train_tokens_per_s_hybrid"] / out["train_tokens_per_s_dense"], 3
    )
    out["ratio_decode"] = round(
        out["decode_tokens_per_s_hybrid"] / out["decode_tokens_per_s_dense"], 3
    )
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    return p


def main(argv: list[str] | None = None) -> dict:
    out = measure(build_parser().parse_args(argv))
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
