"""The GRPO peer workload (shared/notes/peers.md) through the public API; prints one JSON line.
Run: python examples/peer_workload.py --steps=12 --warmup=2 --workdir=/tmp/peer"""

import argparse
import json
import random
import statistics

import jax

from rubric_rl.config.defaults import grpo_config
from rubric_rl.models.tokenizer import train_byte_bpe
from rubric_rl.trainer import StepTimer, Trainer

TOPICS = ["cats", "rain", "music", "trees", "bread", "ships", "snow", "coffee"]
ROWS = [dict(prompt=f"Write {k} words about {t} ending with !", k=k, topic=t)
        for k in range(2, 10) for t in TOPICS]  # fmt: skip


def peer_reward(prompts, completions, k, topic, **_):
    """The fraction of 3 checks met: k words, ends with "!", mentions the topic."""
    return [((len(c.split()) == n) + c.rstrip().endswith("!") + (t in c.lower())) / 3
            for c, n, t in zip(completions, k, topic)]  # fmt: skip


def byte_bpe(path):
    """A byte-level BPE of exactly 512 ids (<pad> 0, <eos> 1, <bos> 2) on a fixed corpus."""
    rng, syl = random.Random(0), "ka lo mi ne ru sa to vi de po la fe gu hi".split()
    words = ["".join(rng.choices(syl, k=rng.randint(1, 3))) for _ in range(3000)]
    texts = [f"{r['prompt']} {' '.join(rng.sample(words, 6))} !" for r in ROWS * 40]
    return train_byte_bpe(path, texts, vocab_size=512)


def main(a):
    # The peer shape (3.3M params), raw prompts of 8 tokens padded to a bucket of 8 (Tunix's side
    # sets max_prompt_length to the longest prompt), 8 x 4 completions of 64 tokens.
    c = grpo_config()
    c.model.update(name="peer-3m", tokenizer=byte_bpe(f"{a.workdir}/bpe"), chat_template="raw",
                   vocab_multiple=1, max_prompt_len=16, prompt_buckets=(8,))  # fmt: skip
    c.rollout.update(tasks_per_step=8, samples_per_task=4, max_new_tokens=64, ignore_eos=True)
    c.loss.update(reward="peer_reward", advantage="grpo", mismatch_every=0)  # no KL, token-mean
    c.optim.update(lr=1e-5, schedule="constant", mini_batches=1)  # one AdamW update per step
    c.warmstart.steps, c.calibration.enabled, c.eval.at_start, c.eval.every = 0, False, False, 0
    c.checkpoint.update(every=0, final=False)
    c.logging.update(progress_bar=False, tensorboard=False, rollouts_per_step=0)
    c.train.steps, timer = a.warmup + a.steps, StepTimer()
    trainer = Trainer(c, f"{a.workdir}/run", reward_fns=[peer_reward], tasks=dict(train=ROWS),
                      callbacks=[timer])  # fmt: skip
    trainer.run()
    print(json.dumps(dict(**timer.summary(a.warmup),
        completion_tokens_mean=statistics.mean(r["rollout/len_mean"] for r in timer.rows),
        reward_mean=statistics.mean(r["reward/peer_reward/mean"] for r in timer.rows),
        reward_fn_failed=max(r.get("reward_fn/peer_reward/failed", 0.0) for r in timer.rows),
        params=sum(x.size for x in jax.tree.leaves(trainer.state.params)),
        devices=jax.device_count())))  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for flag, default in (("--steps", 12), ("--warmup", 2), ("--workdir", "/tmp/rubric_rl_peer")):
        p.add_argument(flag, type=type(default), default=default)
    main(p.parse_args())
