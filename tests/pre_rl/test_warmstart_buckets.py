"""The warm start's prompt buckets (``warmstart.prompt_buckets``): each demonstration padded to the
smallest bucket that holds it, batches drawn one bucket at a time, and the same loss as padding
everything to the longest prompt."""

import collections

import numpy as np
import optax
import pytest
from flax import nnx

from configs import grpo
from rubric_rl.config import builders
from rubric_rl.envs import constraints
from rubric_rl.pre_rl import warmstart
from tests.trainer_spy import one_device


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok") / "tokenizer"
    return builders.build_word_tokenizer(constraints.domain_vocabulary(), str(d))


@pytest.fixture(scope="module")
def corpus():
    return constraints.warmstart_corpus(256, seed=0)


def test_buckets_from_config():
    c = grpo.get_config()
    assert warmstart.warmstart_buckets(c.warmstart) == (32, 64, 128)
    c.unlock()
    c.warmstart.update(max_prompt_len=48, prompt_buckets=(64, 32, 16))
    assert warmstart.warmstart_buckets(c.warmstart) == (16, 32, 48)  # capped, sorted
    c.warmstart.prompt_buckets = ()
    assert warmstart.warmstart_buckets(c.warmstart) == (48,)  # one bucket: the old behaviour


def test_each_row_sits_in_its_smallest_bucket_in_the_usual_layout(tok, corpus):
    buckets, c_len = (16, 32, 48), 24
    packed, dropped = warmstart.encode_bucketed(corpus, tok, buckets, c_len)
    lengths = [len(tok.apply_chat_template(m, add_generation_prompt=True)) for m, _ in corpus]
    want = collections.Counter(next((b for b in buckets if n <= b), None) for n in lengths)
    assert dropped == want.pop(None, 0) and dropped > 0
    assert {b: len(a[0]) for b, a in packed.items()} == dict(want)
    for b, (ids, attn, lmask) in packed.items():
        rows = [r for r, n in zip(corpus, lengths) if b == next((x for x in buckets if n <= x), 0)]
        ref = warmstart.encode_corpus(rows, tok, b, c_len)
        for got, exp in zip((ids, attn, lmask), ref[:3]):
            np.testing.assert_array_equal(got, exp)
        assert ids.shape[1] == b + c_len


def test_batches_come_from_one_bucket_in_proportion_and_deterministically():
    def rows(first, n, width):
        ids = (first + np.arange(n))[:, None] * np.ones((1, width), int)
        return ids, np.ones((n, width)), np.ones((n, width))

    packed = {8: rows(0, 30, 12), 16: rows(1000, 5, 20)}
    a = warmstart.BucketedBatches(packed, 4, np.random.default_rng(3))
    b = warmstart.BucketedBatches(packed, 4, np.random.default_rng(3))
    seen = collections.Counter()
    draws = collections.Counter()
    for _ in range(700):
        ids, _, _ = a.next()
        np.testing.assert_array_equal(ids, b.next()[0])
        assert ids.shape[0] == 4
        # one bucket: the rows of the 12-wide bucket are 0..29, those of the 20-wide 1000..1004
        assert (ids[:, 0] < 1000).all() if ids.shape[1] == 12 else (ids[:, 0] >= 1000).all()
        draws[ids.shape[1]] += 1
        seen.update(ids[:, 0].tolist())
    # Buckets in proportion to their size (30 : 5) and every row about equally often; the 5-row
    # bucket (smaller than two batches) wraps around, reshuffled (a batch that straddles the
    # wrap may hold a row twice: BucketedBatches' docstring).
    assert draws[12] / 700 == pytest.approx(30 / 35, abs=0.04)
    counts = np.array(list(seen.values()))
    assert len(seen) == 35 and counts.min() > 0.75 * counts.mean()


def test_padding_a_batch_to_a_wider_bucket_leaves_its_loss_unchanged(tok, corpus):
    c = grpo.get_config("smoke")
    model = builders.build_model(c, tok, builders.build_mesh(c, one_device()))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.sgd(0.0)
    step = warmstart.make_sft_step(graphdef, tx)
    opt = tx.init(params)
    rows = corpus[:16]
    short = warmstart.encode_corpus(rows, tok, 48, 16)
    long = warmstart.encode_corpus(rows, tok, 128, 16)
    assert short[3] == long[3] == 0
    _, _, loss_short = step(params, opt, rest, *short[:3])
    _, _, loss_long = step(params, opt, rest, *long[:3])
    assert float(loss_short) == pytest.approx(float(loss_long), rel=1e-5)


def test_copy_demonstrations_answer_with_the_prompts_words():
    from rubric_rl.envs.constraint_lexicon import apply_case, units

    rows = constraints.copy_corpus(300, seed=0)
    assert rows == constraints.copy_corpus(300, seed=0)
    clauses = collections.Counter()
    for messages, completion in rows:
        (msg,) = messages
        text = msg["content"]
        assert text.startswith("rewrite : ") and msg["role"] == "user"
        words = text.removeprefix("rewrite : ").split(" . ")[0].split()
        assert 2 <= len(words) <= 6
        case = next((m for m in ("lower", "upper") if f"use {m}case" in text), None)
        case = "capitalized" if "capitalize each word" in text else case
        end = text.split("end with ")[1][0] if "end with" in text else "."
        assert units(completion) == [apply_case(w, case or "lower") for w in words] + [end]
        clauses.update({"case": case is not None, "end": "end with" in text})
    assert 40 < clauses["case"] < 140 and 40 < clauses["end"] < 140  # ~30 % each


def test_the_first_copy_steps_train_on_copy_demonstrations_only(tmp_path, monkeypatch):
    from rubric_rl.trainer import Trainer

    seen = []
    make = warmstart.make_sft_step

    def spy(*args, **kw):
        step = make(*args, **kw)

        def wrapped(trainable, opt_state, rest, ids, attn, lmask):
            seen.append(np.asarray(ids))
            return step(trainable, opt_state, rest, ids, attn, lmask)

        return wrapped

    monkeypatch.setattr(warmstart, "make_sft_step", spy)
    c = grpo.get_config("smoke")
    c.warmstart.update(steps=5, copy_steps=3)
    t = Trainer(c, str(tmp_path), devices=one_device())
    try:
        t._restore_or_warmstart(resume=False)
        tok = t.tokenizer
    finally:
        t.close()
    assert len(seen) == 5
    prompts = [[tok.decode([i for i in row if i != tok.pad_id]) for row in b] for b in seen]
    demos = constraints.copy_corpus(3 * c.warmstart.batch, c.domain.seed)
    copy_rows = {
        tok.decode(tok.apply_chat_template(m, add_generation_prompt=True)) for m, _ in demos
    }
    for batch in prompts[:3]:
        assert all(any(p.startswith(r) for r in copy_rows) for p in batch)
    for batch in prompts[3:]:
        assert not any(any(p.startswith(r) for r in copy_rows) for p in batch)
