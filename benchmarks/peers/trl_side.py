"""TRL's side of the peer workload (shared/notes/peers.md): TRL 1.16 ``GRPOTrainer`` on torch 2.13
CPU; prints one JSON line with the fields of ``examples/peer_workload.py``'s.

    /work/peer-venvs/trl/bin/python benchmarks/peers/trl_side.py --steps=12 --warmup=2 --workdir=DIR

As configured in the note: ``min_new_tokens=64`` with ``max_completion_length=64`` (EOS cannot stop
a completion), temperature 1.0 over the full vocabulary (top_k 0, top_p 1), beta 0, one generation
and one optimizer step per batch (``num_iterations=1``, no gradient accumulation, so TRL skips the
old-log-prob pass), lr 1e-5 constant, AdamW (0.9, 0.999, 1e-8, no weight decay), clip 1.0,
token-mean loss (``loss_type="bnpo"``: the masked per-token loss summed over the batch over its
token count),
float32 (``bf16=False``; TRL's default is True), gradient checkpointing off, 2 torch threads
(``--threads`` or ``$TRL_TORCH_THREADS``).

Timing: a step ends when ``on_step_end`` fires (after the optimizer step; torch on CPU is
synchronous); generation is ``_generate_and_score_completions`` (sampling, rewards, advantages,
as ``time/rollout`` is in ours); the train part is the rest of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import workload as w  # benchmarks/peers/workload.py (this script's folder is on sys.path)
from datasets import Dataset
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def build_model(tokenizer) -> Qwen3ForCausalLM:
    """The workload's Qwen3, random init, float32."""
    config = Qwen3Config(
        **w.SHAPE,
        tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=w.ROPE_THETA),
        rms_norm_eps=w.RMS_NORM_EPS,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).float()


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that records each generation's seconds and completion lengths."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gen_s: list[float] = []
        self.completion_tokens: list[int] = []
        self.prompt_tokens: set[int] = set()

    def _generate_and_score_completions(self, inputs):
        start = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.gen_s.append(time.perf_counter() - start)
        self.completion_tokens += out["completion_mask"].sum(-1).tolist()
        self.prompt_tokens |= set(out["prompt_mask"].sum(-1).tolist())
        return out


class StepEnds(TrainerCallback):
    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def main(a: argparse.Namespace) -> dict:
    torch.set_num_threads(a.threads)
    tokenizer = AutoTokenizer.from_pretrained(w.byte_bpe(os.path.join(a.workdir, "bpe")))
    rewards: list[float] = []

    def peer_reward(prompts, completions, **kw):  # TRL logs a reward under its function's name
        r = w.peer_reward(prompts, completions, **kw)
        rewards.extend(r)
        return r

    args = GRPOConfig(
        output_dir=os.path.join(a.workdir, "run"),
        max_steps=a.warmup + a.steps,
        seed=0,
        per_device_train_batch_size=w.PROMPTS_PER_STEP * w.GENERATIONS,
        gradient_accumulation_steps=1,
        num_generations=w.GENERATIONS,
        max_completion_length=w.NEW_TOKENS,
        generation_kwargs=dict(min_new_tokens=w.NEW_TOKENS),
        temperature=w.TEMPERATURE,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="bnpo",
        learning_rate=w.LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=w.BETAS[0],
        adam_beta2=w.BETAS[1],
        adam_epsilon=w.ADAM_EPS,
        weight_decay=0.0,
        max_grad_norm=w.MAX_GRAD_NORM,
        bf16=False,
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        dataloader_num_workers=0,
    )
    steps = StepEnds()
    trainer = TimedGRPOTrainer(
        model=build_model(tokenizer),
        reward_funcs=[peer_reward],
        args=args,
        train_dataset=Dataset.from_list(w.ROWS),
        processing_class=tokenizer,
        callbacks=[steps],
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    change = max(
        (p.detach() - b).abs().max().item() for p, b in zip(trainer.model.parameters(), before)
    )
    return w.summary(
        steps.ends,
        trainer.gen_s,
        a.warmup,
        completion_tokens=trainer.completion_tokens,
        rewards=rewards,
        params=sum(p.numel() for p in trainer.model.parameters()),
        side="trl",
        prompt_tokens=sorted(trainer.prompt_tokens),
        max_param_change=change,
        tokenizer_digest=w.tokenizer_digest(os.path.join(a.workdir, "bpe")),
        versions=dict(
            trl=__import__("trl").__version__,
            torch=torch.__version__,
            threads=torch.get_num_threads(),
        ),
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--workdir", default="/tmp/trl_peer")
    # The note's 2 torch threads; on a loaded machine OpenMP's spinning threads make that 20-40x
    # slower unless OMP_WAIT_POLICY=PASSIVE is set (measured here, ours).
    p.add_argument("--threads", type=int, default=int(os.environ.get("TRL_TORCH_THREADS", "2")))
    print(json.dumps(main(p.parse_args())))
