"""Tunix's side of the peer workload (shared/notes/peers.md): Tunix 0.1.7 ``GRPOLearner`` +
``RLCluster`` with its own jitted sampler, on jax 0.10.2 CPU; prints one JSON line with the fields
of ``examples/peer_workload.py``'s.

    /work/peer-venvs/tunix/bin/python benchmarks/peers/tunix_side.py --steps=12 --warmup=2 \
        --workdir=DIR

As configured in the note: ``rollout_engine="vanilla"``, ``eos_tokens=[-1]`` (no sampled token ends
a completion: exactly 64 new tokens), temperature 1.0 over the full vocabulary (top_p 1, no top_k),
beta 0 (no reference pass), ``num_iterations=1`` (no old-log-prob pass), one optimizer step per
batch of 8 prompts x 4 generations, ``loss_agg_mode="token-mean"``, AdamW (0.9, 0.999, 1e-8, no
weight decay, lr 1e-5 constant) after a global-norm clip of 1.0, float32. Actor, reference and
rollout share one mesh over ("fsdp", "tp") whose axes are ``AxisType.Auto`` (with jax 0.10.2's
default Explicit axes the sampler's KV-cache update fails a sharding check), so the sampler shares
the actor's weights (no weight sync). The mesh is (every local device, 1) unless ``--mesh`` says
otherwise: one CPU device by default, two with XLA's host-device count at 2 (``XLA_FLAGS``; then
parameters and batch are sharded over fsdp; on a 2-core CPU that was slower than
one device: 1.04 s against 0.80 s per step). The learner's train loop runs outside any mesh
context: inside one, Tunix shards the optimizer state with a constraint that its single-device
step counter fails.
The Hugging Face tokenizer is given to Tunix with no BOS token: Tunix's sampler prepends the
tokenizer's BOS when it has one, and the workload prepends none (ours).

Timing: a step ends when ``_run_global_step`` returns and the actor's parameters are ready
(``block_until_ready``); generation is ``_generate_and_compute_advantage`` (sampling, rewards,
advantages, as ``time/rollout`` is in ours); the train part is the rest of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np
import optax
import workload as w  # benchmarks/peers/workload.py (this script's folder is on sys.path)
from flax import nnx
from transformers import AutoTokenizer
from tunix.models.qwen3 import model as qwen3
from tunix.rl import rl_cluster as rlc
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout


def build_model(mesh) -> qwen3.Qwen3:
    """The workload's Qwen3, random init, float32, on ``mesh``."""
    s = w.SHAPE
    config = qwen3.ModelConfig(
        num_layers=s["num_hidden_layers"],
        vocab_size=s["vocab_size"],
        embed_dim=s["hidden_size"],
        hidden_dim=s["intermediate_size"],
        num_heads=s["num_attention_heads"],
        head_dim=s["head_dim"],
        num_kv_heads=s["num_key_value_heads"],
        rope_theta=int(w.ROPE_THETA),
        norm_eps=w.RMS_NORM_EPS,
        use_tied_embedding=True,
    )
    with jax.set_mesh(mesh):
        return qwen3.Qwen3(config, rngs=nnx.Rngs(0))


class TimedGRPOLearner(grpo_learner.GRPOLearner):
    """GRPOLearner that records step ends, generation seconds and completion lengths."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ends: list[float] = []
        self.gen_s: list[float] = []
        self.completion_tokens: list[int] = []
        self.prompt_tokens: set[int] = set()
        generate = self.rl_cluster.generate

        def counted_generate(*a, **kw):  # the sampler's own completions, before Tunix pads them
            out = generate(*a, **kw)
            self.completion_tokens += [len(t) for t in out.tokens]
            self.prompt_tokens |= set(
                np.sum(np.asarray(out.left_padded_prompt_tokens) != w.PAD_ID, -1).tolist()
            )
            return out

        self.rl_cluster.generate = counted_generate

    def _generate_and_compute_advantage(self, training_input, mode=rlc.Mode.TRAIN):
        start = time.perf_counter()
        example = jax.block_until_ready(
            super()._generate_and_compute_advantage(training_input, mode)
        )
        self.gen_s.append(time.perf_counter() - start)
        return example

    def _run_global_step(self, *args, **kwargs):
        super()._run_global_step(*args, **kwargs)
        jax.block_until_ready(nnx.state(self.rl_cluster.actor_trainer.model, nnx.Param))
        self.ends.append(time.perf_counter())


def batches(steps: int):
    """``steps`` batches of 8 prompts, walking the 64 rows in order (numpy arrays: Tunix repeats
    every field 4 times and hands k and topic to the reward)."""
    for i in range(steps):
        rows = [
            w.ROWS[(i * w.PROMPTS_PER_STEP + j) % len(w.ROWS)] for j in range(w.PROMPTS_PER_STEP)
        ]
        yield dict(
            prompts=np.array([r["prompt"] for r in rows]),
            k=np.array([r["k"] for r in rows]),
            topic=np.array([r["topic"] for r in rows]),
        )


def main(a: argparse.Namespace) -> dict:
    bpe = w.byte_bpe(os.path.join(a.workdir, "bpe"))
    tokenizer = AutoTokenizer.from_pretrained(bpe, bos_token=None)
    prompt_len = max(map(len, w.prompt_ids(bpe)))
    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh(
        tuple(a.mesh or (jax.device_count(), 1)), ("fsdp", "tp"), axis_types=(auto, auto)
    )
    steps = a.warmup + a.steps
    optimizer = optax.chain(
        optax.clip_by_global_norm(w.MAX_GRAD_NORM),
        optax.adamw(w.LR, b1=w.BETAS[0], b2=w.BETAS[1], eps=w.ADAM_EPS, weight_decay=0.0),
    )
    cluster_config = rlc.ClusterConfig(
        role_to_mesh={rlc.Role.ACTOR: mesh, rlc.Role.REFERENCE: mesh, rlc.Role.ROLLOUT: mesh},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rlc.RLTrainingConfig(
            actor_optimizer=optimizer,
            eval_every_n_steps=10**9,
            max_steps=steps,
            pbar_description=None,
            metrics_logging_options=None,
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=w.NEW_TOKENS,
            max_prompt_length=prompt_len,
            kv_cache_size=prompt_len + w.NEW_TOKENS,
            temperature=w.TEMPERATURE,
            top_p=1.0,
            top_k=None,
            # seed None: Tunix's default, PRNGKey(0) per call (a key array given here is donated by
            # the first call and fails the second).
            eos_tokens=[-1],
            seed=None,
        ),
    )
    cluster = rlc.RLCluster(
        actor=build_model(mesh), tokenizer=tokenizer, cluster_config=cluster_config
    )
    rewards: list[float] = []

    def peer_reward(prompts, completions, **kw):
        r = w.peer_reward(prompts, completions, **kw)
        rewards.extend(float(x) for x in r)
        return r

    algo = grpo_learner.GRPOConfig(
        num_generations=w.GENERATIONS, num_iterations=1, beta=0.0, loss_agg_mode="token-mean"
    )
    learner = TimedGRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=[peer_reward])
    before = [
        np.array(x) for x in jax.tree.leaves(nnx.state(cluster.actor_trainer.model, nnx.Param))
    ]
    learner.train(batches(steps))
    params = nnx.state(cluster.actor_trainer.model, nnx.Param)
    change = max(
        float(np.abs(np.asarray(x) - b).max()) for x, b in zip(jax.tree.leaves(params), before)
    )
    return w.summary(
        learner.ends,
        learner.gen_s,
        a.warmup,
        completion_tokens=learner.completion_tokens,
        rewards=rewards,
        params=sum(x.size for x in jax.tree.leaves(params)),
        side="tunix",
        prompt_tokens=sorted(learner.prompt_tokens),
        max_param_change=change,
        tokenizer_digest=w.tokenizer_digest(bpe),
        devices=mesh.devices.size,
        versions=dict(tunix=_version("google-tunix"), jax=jax.__version__),
    )


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--workdir", default="/tmp/tunix_peer")
    p.add_argument(
        "--mesh",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="fsdp,tp (default: every local device on fsdp, tp 1)",
    )
    print(json.dumps(main(p.parse_args())))
