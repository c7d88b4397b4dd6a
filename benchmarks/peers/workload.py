"""The peer workload's data, reward, tokenizer and model shape (shared/notes/peers.md), shared by
every side of ``benchmarks/peer_step.py``, plus the one summary every side prints.

``ROWS``, ``peer_reward`` and ``byte_bpe`` are copies of ``examples/peer_workload.py``'s (the
example imports nothing from ``benchmarks``, so a user can copy it alone);
``tests/test_peer_step.py`` checks that the two agree: the same rows, the same rewards, the same
token ids. Needs only ``tokenizers`` and ``transformers``, which every side's environment has.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
from collections.abc import Sequence

TOPICS = ["cats", "rain", "music", "trees", "bread", "ships", "snow", "coffee"]
ROWS = [dict(prompt=f"Write {k} words about {t} ending with !", k=k, topic=t)
        for k in range(2, 10) for t in TOPICS]  # fmt: skip

# Qwen3, random init, float32: 3,279,616 parameters (tied embeddings).
SHAPE = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64)  # fmt: skip
ROPE_THETA, RMS_NORM_EPS, PARAMS = 1e6, 1e-6, 3_279_616
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
# Each step: PROMPTS_PER_STEP prompts x GENERATIONS completions of exactly NEW_TOKENS tokens.
PROMPTS_PER_STEP, GENERATIONS, NEW_TOKENS = 8, 4, 64
TEMPERATURE, LR, BETAS, ADAM_EPS, MAX_GRAD_NORM = 1.0, 1e-5, (0.9, 0.999), 1e-8, 1.0
# Every prompt under byte_bpe's tokenizer (checked by the test; shared/notes/peers.md says 9,
# which this tokenizer does not give: every side reports 8).
PROMPT_TOKENS = 8


def step_flops() -> dict[str, int]:
    """Model FLOPs (2 per multiply-add) of one step: the least work any side must do, per
    completion (no side shares a prompt's work across its group).

    A completion row holds T = PROMPT_TOKENS + NEW_TOKENS − 1 positions that matter (the last
    sampled token feeds nothing), the LM head runs at the NEW_TOKENS positions that predict a
    completion token. Matmul weights: per layer q, k, v, o and the gated MLP; the head d·V (tied).
    Causal attention per layer and row: QK^T and PV, 2·H·hd·T(T+1) FLOPs.
      generation = one forward of every row (prefill + decode, through the KV cache),
      train      = forward + backward (input and weight gradients: 3× the forward; β = 0: no
                   reference pass; one optimizer step per batch: no old-log-prob pass).
    Elementwise work (norms, RoPE, softmax, sampling, AdamW) is not counted."""
    s = SHAPE
    d, hd = s["hidden_size"], s["head_dim"]
    h, kv = s["num_attention_heads"], s["num_key_value_heads"]
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * s["intermediate_size"]
    layers, head = s["num_hidden_layers"] * per_layer, d * s["vocab_size"]
    rows, t = PROMPTS_PER_STEP * GENERATIONS, PROMPT_TOKENS + NEW_TOKENS - 1
    attention = s["num_hidden_layers"] * 2 * h * hd * t * (t + 1)
    forward = rows * (2 * layers * t + 2 * head * NEW_TOKENS + attention)
    return dict(generation=forward, train=3 * forward, step=4 * forward)


def peer_reward(prompts, completions, k, topic, **_):
    """The fraction of 3 checks met: k words, ends with "!", mentions the topic."""
    return [((len(c.split()) == n) + c.rstrip().endswith("!") + (t in c.lower())) / 3
            for c, n, t in zip(completions, k, topic)]  # fmt: skip


def byte_bpe(path):
    """A byte-level BPE of exactly 512 ids (<pad> 0, <eos> 1, <bos> 2) on a fixed corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = (
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        decoders.ByteLevel(),
    )
    rng, syl = random.Random(0), "ka lo mi ne ru sa to vi de po la fe gu hi".split()
    words = ["".join(rng.choices(syl, k=rng.randint(1, 3))) for _ in range(3000)]
    corpus = [r["prompt"] + " " + " ".join(rng.sample(words, 6)) + " !" for r in ROWS * 40]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<pad>", "<eos>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1))  # fmt: skip
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                            bos_token="<bos>").save_pretrained(path)  # fmt: skip
    return path


def prompt_ids(path) -> list[list[int]]:
    """The token ids of every prompt under the tokenizer saved at ``path`` (no BOS, as used)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    return [tok.encode(r["prompt"], add_special_tokens=False).ids for r in ROWS]


def tokenizer_digest(path) -> str:
    """A fingerprint of the tokenizer at ``path`` for the workload: its vocabulary (token -> id)
    and the prompts' ids. Every side reports it, so a side whose ``tokenizers`` trains another
    BPE from the same corpus is caught."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(os.path.join(path, "tokenizer.json")).get_vocab()
    text = json.dumps([sorted(vocab.items()), prompt_ids(path)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def summary(
    ends: Sequence[float],
    gen_s: Sequence[float],
    warmup: int,
    *,
    completion_tokens: Sequence[float],
    rewards: Sequence[float],
    params: int,
    **extra,
) -> dict:
    """The JSON line every side prints, computed as the example computes it: ``ends`` are the
    wall-clock times at which each step's parameters were ready, ``gen_s`` each step's generation
    seconds; a timed step runs from the previous step's end to its own (warmup >= 1), its train
    part is that minus its generation. ``completion_tokens`` and ``rewards`` are per completion,
    over all steps (the checks that every side did the same work)."""
    if warmup < 1 or len(ends) <= warmup or len(gen_s) != len(ends):
        raise ValueError(
            f"summary: need warmup >= 1 and more step ends ({len(ends)}) than warm-up "
            f"steps ({warmup}), one generation time per step ({len(gen_s)})"
        )
    step_s = [b - a for a, b in zip(ends[warmup - 1 :], ends[warmup:])]
    gen = list(gen_s[warmup:])
    return dict(
        steps=len(ends),
        completions_per_step=PROMPTS_PER_STEP * GENERATIONS,
        new_tokens=NEW_TOKENS,
        completion_tokens_mean=statistics.mean(completion_tokens),
        completion_tokens_min=min(completion_tokens),
        completion_tokens_max=max(completion_tokens),
        reward_mean=statistics.mean(rewards),
        reward_min=min(rewards),
        reward_max=max(rewards),
        step_s_median=statistics.median(step_s),
        gen_s_median=statistics.median(gen),
        train_s_median=statistics.median(s - g for s, g in zip(step_s, gen)),
        params=params,
        **extra,
    )
