"""Supervised warm start on the domain's demonstration corpus (DESIGN §7; notes/jax-on-cpu.md:
without it the small policy collapses to deterministic output). The corpus is deliberately
imperfect — demonstrations meet only some constraints — so the RL phase has headroom.

Cached in ``<workdir>/warmstart/``: ``corpus.jsonl`` (the demonstrations), ``log.jsonl`` (loss per
step) and ``params/`` (orbax); a restarted run reuses the finished parameters.

Across runs: with ``warmstart.cache_dir`` set, finished parameters are also kept under
``<cache_dir>/<key>/params``, where ``key`` hashes everything the warm start depends on (model,
domain, warm-start settings, completion buckets, ``train.seed``, mesh and device count). A run whose
key is there copies them instead of training: the variants of one seed in a sweep (ARISE and its
ablations differ only after the warm start) share one warm start, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rubric_rl.checkpoint import publish_dir
from rubric_rl.core import sharding
from rubric_rl.models import default_positions, logits_from_hidden
from rubric_rl.models.hf_io import param_keys
from rubric_rl.util.buckets import round_up_to_bucket


def load_or_build_corpus(
    path: str, domain: Any, n: int, seed: int, p_keep: float, copy_fraction: float = 0.0
) -> list[tuple[list, str]]:
    if os.path.exists(path):
        with open(path) as f:
            return [(r["messages"], r["completion"]) for r in map(json.loads, f)]
    if domain.corpus is None:
        raise ValueError(f"config.warmstart.steps > 0 but domain {domain.name!r} has no corpus")
    if copy_fraction and domain.copy_corpus is None:
        logging.info(
            "warm start: domain %r has no copy demonstrations; warmstart.copy_fraction unused",
            domain.name,
        )
    corpus = domain.corpus(n, seed, p_keep, copy_fraction)
    if jax.process_index() != 0:  # multi-host: the corpus is deterministic; process 0 writes it
        return [(m, c) for m, c in corpus]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for messages, completion in corpus:
            f.write(json.dumps({"messages": messages, "completion": completion}) + "\n")
    os.replace(tmp, path)
    return [(m, c) for m, c in corpus]


def _tokenize(corpus, tokenizer, completion_len: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids + eos cut to ``completion_len``) per demonstration."""
    rows = []
    for messages, completion in corpus:
        p = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        c = (tokenizer.encode(completion) + [tokenizer.eos_id])[:completion_len]
        rows.append((p, c))
    return rows


def _pack(rows, pad_id: int, prompt_len: int, completion_len: int):
    """(ids, attention, loss_mask) [N, P + C] in the TrainBatch layout: prompts left-padded to
    ``prompt_len``; loss on completion tokens and the closing eos (prediction layout: position t
    scores token t + 1)."""
    t = prompt_len + completion_len
    ids = np.full((len(rows), t), pad_id, np.int32)
    attn = np.zeros((len(rows), t), np.int32)
    lmask = np.zeros((len(rows), t), np.float32)
    for i, (p, c) in enumerate(rows):
        ids[i, prompt_len - len(p) : prompt_len] = p
        ids[i, prompt_len : prompt_len + len(c)] = c
        attn[i, prompt_len - len(p) : prompt_len + len(c)] = 1
        lmask[i, prompt_len - 1 : prompt_len - 1 + len(c)] = 1.0
    return ids, attn, lmask


def encode_corpus(corpus, tokenizer, prompt_len: int, completion_len: int):
    """(ids, attn, loss_mask, dropped) [N, P + C] in the TrainBatch layout; loss on completion
    tokens and the closing eos (prediction layout: position t scores token t + 1). Prompts longer
    than ``prompt_len`` are dropped, completions cut to ``completion_len``."""
    rows = [r for r in _tokenize(corpus, tokenizer, completion_len) if len(r[0]) <= prompt_len]
    return (
        *_pack(rows, tokenizer.pad_id or 0, prompt_len, completion_len),
        len(corpus) - len(rows),
    )


def warmstart_buckets(ws) -> tuple[int, ...]:
    """The prompt lengths the warm start pads to: ``warmstart.prompt_buckets`` below
    ``warmstart.max_prompt_len``, then ``max_prompt_len`` itself (longer prompts are dropped)."""
    cap = int(ws.max_prompt_len)
    return tuple(sorted({int(b) for b in ws.prompt_buckets if int(b) < cap} | {cap}))


def encode_bucketed(corpus, tokenizer, buckets, completion_len: int):
    """({bucket: (ids, attn, loss_mask)}, dropped): each demonstration padded to the smallest
    bucket that holds its prompt (``encode_corpus``'s layout per bucket), those longer than the
    largest bucket dropped. Short prompts then cost what they are, not the longest one's
    length: most of the embedded corpus is under 32 tokens, a few guided prompts reach 128."""
    by_bucket: dict[int, list] = {}
    rows = _tokenize(corpus, tokenizer, completion_len)
    for p, c in rows:
        b = next((b for b in buckets if len(p) <= b), None)
        if b is not None:
            by_bucket.setdefault(b, []).append((p, c))
    packed = {
        b: _pack(r, tokenizer.pad_id or 0, b, completion_len) for b, r in sorted(by_bucket.items())
    }
    return packed, len(rows) - sum(len(r) for r in by_bucket.values())


class BucketedBatches:
    """Batches of ``batch`` demonstrations, all of one bucket: each step picks a bucket with
    probability proportional to its size (every demonstration is as likely to be drawn as in one
    shuffled pool), then the next rows of that bucket's own shuffled order; a bucket whose order
    runs out mid-batch is reshuffled and the batch continues from the new order, so a batch that
    straddles the wrap may hold a row twice (kept: the protocol's warm starts were made so).
    Deterministic in ``rng``."""

    def __init__(self, packed, batch: int, rng: np.random.Generator):
        self.packed = {b: a for b, a in packed.items() if len(a[0])}
        self.buckets = sorted(self.packed)
        sizes = np.array([len(self.packed[b][0]) for b in self.buckets], np.float64)
        self.p = sizes / sizes.sum()
        self.batch, self.rng = int(batch), rng
        self.order = {b: rng.permutation(len(self.packed[b][0])) for b in self.buckets}
        self.pos = dict.fromkeys(self.buckets, 0)

    def next(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        b = self.buckets[int(self.rng.choice(len(self.buckets), p=self.p))]
        n = len(self.packed[b][0])
        idx = []
        while len(idx) < self.batch:  # a bucket smaller than the batch wraps around
            if self.pos[b] >= n:
                self.order[b], self.pos[b] = self.rng.permutation(n), 0
            take = self.order[b][self.pos[b] : self.pos[b] + self.batch - len(idx)]
            self.pos[b] += len(take)
            idx.extend(take.tolist())
        return tuple(a[np.asarray(idx)] for a in self.packed[b])


# --- case-tied embeddings (warmstart.tie_case) ------------------------------------------------
#
# A pretrained LLM knows that CAIRO, Cairo and cairo are one city. A word-level policy trained from
# scratch learns each cased form as its own rare token: in the embedded default's warm start a
# cased form is ~1/10 as frequent as its lowercase one, and a fully cased sampled answer was a
# random mix of categories (its category criterion passed in 13 % of samples against 45 % for
# lowercase answers to the same tasks). RL then un-learns case altogether, since casing goes with
# worse answers: from a warm start that cased 68 % of its greedy answers, to 32 % in 25 steps.
# With ``tie_case`` the warm start trains each cased token's embedding row as its lowercase row
# plus one shared vector per case (UPPER, Capitalized), so what the policy knows about a word holds
# in every case, and the case of an answer is one direction in the hidden state. The tie lasts
# only for the warm start: the rows are then written into the plain (Hugging Face-compatible)
# embedding matrix, and RL trains every row freely (measured on the embedded default, seed
# 0: the held-out case criterion went 0.55 -> 0.97 over 150 RL steps, against 0.26 -> 0.29 untied).

CASE_KINDS = ("upper", "capitalized")


class CasePairs(NamedTuple):
    """Token ids of every cased word that has a lowercase twin in the vocabulary."""

    lower: np.ndarray  # [K] int32: the lowercase form's id
    cased: np.ndarray  # [K] int32: the cased form's id
    kind: np.ndarray  # [K] int32: index into CASE_KINDS


def case_pairs(vocab: Mapping[str, int]) -> CasePairs:
    """Pairs (lowercase id, cased id, case) for each all-letter token in UPPER case (two letters or
    more) or Capitalized form whose lowercase form is also a token; others are left alone."""
    out: list[tuple[int, int, int]] = []
    for word, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        low = word.lower()
        if not word.isalpha() or word == low or low not in vocab:
            continue
        if len(word) > 1 and word == word.upper():
            kind = 0
        elif word == word[:1].upper() + word[1:].lower():
            kind = 1
        else:
            continue  # mixed case ("McX"): no shared direction to tie it to
        out.append((int(vocab[low]), int(i), kind))
    cols = np.asarray(out, np.int32).reshape(-1, 3)
    return CasePairs(cols[:, 0], cols[:, 1], cols[:, 2])


def _is_embedding(path) -> bool:
    return param_keys(path)[:2] == ("embed", "embedding")


def tie_case(params, case_vectors: jax.Array, pairs: CasePairs):
    """``params`` with each cased token's embedding row = its lowercase row + the case's vector
    (``case_vectors`` [len(CASE_KINDS), D]); every other leaf and row unchanged."""

    def tie(path, x):
        if not _is_embedding(path):
            return x
        return x.at[pairs.cased].set(x[pairs.lower] + case_vectors[pairs.kind].astype(x.dtype))

    return jax.tree_util.tree_map_with_path(tie, params)


def make_sft_step(graphdef, tx, pairs: CasePairs | None = None):
    """The jitted SFT step. With ``pairs`` the trainable state is (params, case_vectors) and the
    loss sees ``tie_case(params, case_vectors, pairs)``: the raw cased rows get no gradient."""

    def loss_fn(trainable, rest, ids, attn, lmask):
        params = trainable if pairs is None else tie_case(*trainable, pairs)
        model = nnx.merge(graphdef, params, rest)
        pos = default_positions(ids, attn)
        hidden = model.hidden_states(ids, pos, attn)
        logits = logits_from_hidden(hidden[:, :-1], model.unembed())
        lp = jax.nn.log_softmax(logits, axis=-1)
        tok = jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1)[..., 0]
        m = lmask[:, :-1]
        return -jnp.sum(tok * m) / jnp.maximum(jnp.sum(m), 1.0)

    @jax.jit
    def step(trainable, opt_state, rest, ids, attn, lmask):
        loss, grads = jax.value_and_grad(loss_fn)(trainable, rest, ids, attn, lmask)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    return step


def schedule(ws) -> optax.Schedule:
    """``warmstart.schedule``: "constant" at ``lr``, or "cosine": linear warm-up over
    ``warmup_steps`` to ``lr``, then cosine decay to 0 at ``steps``."""
    if ws.schedule == "constant":
        return optax.constant_schedule(float(ws.lr))
    if ws.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, float(ws.lr), int(ws.warmup_steps), max(int(ws.steps), int(ws.warmup_steps) + 1)
        )
    raise ValueError(f"config.warmstart.schedule: {ws.schedule!r} not in ('constant', 'cosine')")


def _embedding(params) -> jax.Array:
    found = [x for p, x in jax.tree_util.tree_leaves_with_path(params) if _is_embedding(p)]
    if len(found) != 1:
        raise ValueError(f"warm start: expected one embed.embedding leaf, found {len(found)}")
    return found[0]


def _case_pairs_for(config, tokenizer, params) -> CasePairs | None:
    """``warmstart.tie_case``'s pairs; None when off or when no token has a cased twin."""
    if not config.warmstart.tie_case:
        return None
    pairs = case_pairs(tokenizer.vocab())
    if not len(pairs.cased):
        logging.info("warm start: tie_case is on but the vocabulary has no cased twins")
        return None
    leaves = jax.tree_util.tree_leaves_with_path(params)
    if any(param_keys(p)[:1] == ("lm_head",) for p, _ in leaves):
        raise ValueError(
            "config.warmstart.tie_case: the model has an untied lm_head; the tie covers tied "
            "word embeddings only (set it False)"
        )
    emb = _embedding(params)
    if emb.shape[0] <= int(pairs.cased.max()):
        raise ValueError(
            f"config.warmstart.tie_case: token id {int(pairs.cased.max())} is outside the "
            f"embedding's {emb.shape[0]} rows"
        )
    return pairs


# Model options added after warm starts were first cached: left out of the key at these defaults
# (the behaviour before they existed; model.shape: when empty), so a cache keeps serving the runs
# it served.
_MODEL_KEY_DEFAULTS = {"vocab_multiple": 64, "chat_template": "auto", "scan_layers": False}
# Domain options likewise (hard_min_constraints: RISED's hard environment relabels tasks' env_name;
# the warm-start corpus does not read it, but a non-default value keys its own cache).
_DOMAIN_KEY_DEFAULTS = {
    "hard_min_constraints": 0,
    "generator_demos": 0.0,
    "generator_negatives": 10,
}


def completion_len(config) -> int:
    """Demonstration completions' cap: ``warmstart.completion_len``, else the rollout's. A run's
    saved config from before the option existed lacks the key: the rollout's cap, as then."""
    n = config.warmstart.to_dict().get("completion_len", 0)
    return int(n) or int(config.rollout.max_new_tokens)


def cache_key(config) -> str:
    """Hash of every config field the warm-started parameters depend on."""
    ws = {k: v for k, v in config.warmstart.to_dict().items() if k != "cache_dir"}
    if not ws.get("completion_len"):  # added later: at its default, the key is as before
        ws.pop("completion_len", None)
    model = config.model.to_dict()
    left_out = {"max_teacher_prompt_len"}
    left_out |= {k for k, v in _MODEL_KEY_DEFAULTS.items() if model.get(k, v) == v}
    left_out |= set() if model.get("shape") else {"shape"}
    model = {k: v for k, v in model.items() if k not in left_out}
    relevant = {
        "model": model,
        "domain": {
            k: v
            for k, v in config.domain.to_dict().items()
            if not (k in _DOMAIN_KEY_DEFAULTS and v == _DOMAIN_KEY_DEFAULTS[k])
        },
        "warmstart": ws,
        "completion": [int(config.rollout.max_new_tokens), list(config.rollout.buckets)],
        "train_seed": int(config.train.seed),
        "mesh": config.mesh.to_dict(),
        "devices": jax.device_count(),
    }
    blob = json.dumps(relevant, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def _copy_atomic(src: str, dst: str) -> None:
    """Copy a directory so that ``dst`` appears complete or not at all (another run may have
    put it there first: then it is kept)."""
    if os.path.isdir(dst):
        return
    tmp = f"{dst}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    publish_dir(tmp, dst)


def _copy_batches(config, domain, tokenizer, c_len: int) -> BucketedBatches | None:
    """Batches of copy demonstrations for the first ``warmstart.copy_steps`` steps (None when 0).

    Why a phase of its own: mixed into the corpus (``copy_fraction``) a fifth of the signal did
    not teach the 1M word-level policy to copy within 800 steps, while copy demonstrations alone
    teach it in about 200 (measured); a pretrained model arrives able to copy."""
    ws = config.warmstart
    n = int(ws.copy_steps)
    if n <= 0:
        return None
    if domain.copy_corpus is None:
        logging.info(
            "warm start: domain %r has no copy demonstrations; warmstart.copy_steps=%d unused",
            domain.name,
            n,
        )
        return None
    rows = domain.copy_corpus(n * int(ws.batch), int(config.domain.seed))
    packed, _ = encode_bucketed(rows, tokenizer, warmstart_buckets(ws), c_len)
    return BucketedBatches(
        packed, int(ws.batch), np.random.default_rng([int(config.train.seed), 1])
    )


def run_or_load(config, workdir, domain, tokenizer, graphdef, state, mesh) -> Any:
    """The warm-started parameters (a pytree like ``state.params``)."""
    ws = config.warmstart
    d = os.path.join(workdir, "warmstart")
    os.makedirs(d, exist_ok=True)
    params_dir = os.path.join(d, "params")
    ckptr = ocp.StandardCheckpointer()
    cached = ""
    if ws.get("cache_dir"):
        cached = os.path.join(os.path.abspath(ws.cache_dir), cache_key(config), "params")
        if os.path.isdir(cached) and not os.path.isdir(params_dir):
            logging.info("warm start: copying cached parameters from %s", cached)
            _copy_atomic(cached, params_dir)
    if os.path.isdir(params_dir):  # orbax renames into place only when complete
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state.params
        )
        logging.info("warm start: reusing %s", params_dir)
        return ckptr.restore(params_dir, target)
    corpus = load_or_build_corpus(
        os.path.join(d, "corpus.jsonl"),
        domain,
        int(ws.corpus_size),
        int(config.domain.seed),
        float(ws.p_keep),
        float(ws.copy_fraction),
    )
    # The same completion bucket as the rollouts: the warm start trains the shapes RL samples.
    c_len = round_up_to_bucket(completion_len(config), tuple(config.rollout.buckets))
    packed, dropped = encode_bucketed(corpus, tokenizer, warmstart_buckets(ws), c_len)
    kept = sum(len(a[0]) for a in packed.values())
    if kept < int(ws.batch):
        raise ValueError(
            f"config.warmstart: only {kept} demonstrations fit warmstart.max_prompt_len="
            f"{ws.max_prompt_len} ({dropped} dropped), fewer than batch {ws.batch}"
        )
    if dropped:
        logging.info(
            "warm start: %d demonstrations longer than %s dropped", dropped, ws.max_prompt_len
        )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule(ws), weight_decay=0.0))
    params = jax.tree.map(lambda x: x.copy(), state.params)
    pairs = _case_pairs_for(config, tokenizer, params)
    if pairs is not None:
        # Small random start (the embedding initializer's scale), seeded like the model.
        key = jax.random.fold_in(jax.random.PRNGKey(int(config.model.init_seed)), 1)
        dim = _embedding(params).shape[-1]
        vectors = 0.02 * jax.random.normal(key, (len(CASE_KINDS), dim), jnp.float32)
        # Replicated on the mesh like any other small parameter (several hosts: a global array).
        params = (params, jax.device_put(vectors, NamedSharding(mesh, PartitionSpec())))
        logging.info("warm start: %d cased tokens tied to their lowercase rows", len(pairs.cased))
    opt_state = jax.jit(tx.init)(params)
    step = make_sft_step(graphdef, tx, pairs)
    sh = sharding.batch_sharding(mesh)
    batches = BucketedBatches(packed, int(ws.batch), np.random.default_rng(int(config.train.seed)))
    copies = _copy_batches(config, domain, tokenizer, c_len)
    log_path = os.path.join(d, "log.jsonl") if jax.process_index() == 0 else os.devnull
    with open(log_path, "w") as log:
        for s in range(int(ws.steps)):
            source = copies if copies is not None and s < int(ws.copy_steps) else batches
            batch = [jax.device_put(a, sh) for a in source.next()]
            params, opt_state, loss = step(params, opt_state, state.rest, *batch)
            if s % 25 == 0 or s == int(ws.steps) - 1:
                log.write(json.dumps({"step": s, "loss": float(loss)}) + "\n")
                logging.info("warm start step %d: loss %.4f", s, float(loss))
    if pairs is not None:  # the plain embedding matrix, rows written out; the tie ends here
        params = jax.jit(lambda t: tie_case(*t, pairs))(params)
    ckptr.save(params_dir, params)
    ckptr.wait_until_finished()
    if cached and jax.process_index() == 0:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        _copy_atomic(params_dir, cached)
    return params
