"""JaxEngine group prefill: rows with identical prompts prefill once and copy the KV cache; the
samples equal those of a prefill of every row (tokens exactly, log-probs to float32 rounding)."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from rubric_rl.core.sharding import make_mesh, shard_model
from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

N_NEW = 10
# Nine rows (three requests x n = 3) -> the 16-row bucket; two distinct prompts -> 2 (or the
# mesh's 8): group prefill applies.
CFG = JaxEngineConfig(prompt_buckets=(32,), batch_buckets=(2, 4, 8, 16), pad_id=0)


def _model() -> Qwen3ForCausalLM:
    return Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(0))


def _requests() -> list[GenerationRequest]:
    rs = np.random.RandomState(3)
    a = tuple(int(t) for t in rs.randint(1, 128, 5))
    b = tuple(int(t) for t in rs.randint(1, 128, 17))
    # Requests 0 and 2 carry the same prompt tokens (two requests, one group of prompts).
    return [GenerationRequest(p, f"r{i}", step=1, task_index=i) for i, p in enumerate((a, b, a))]


def _flat(gens):
    return [g for gs in gens for g in gs]


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture(scope="module")
def per_row(model):
    """Samples with every row prefilled (the reference), T = 1, n = 3."""
    eng = JaxEngine(model, dataclasses.replace(CFG, group_prefill=False))
    out = eng.generate(_requests(), SamplingParams(n=3, max_new_tokens=N_NEW, temperature=1.0))
    assert eng.stats == {"rows": 9, "prefill_rows": 9}
    return out


def _assert_same(got, want):
    got, want = _flat(got), _flat(want)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    assert [(g.request_id, g.sample_index, g.seed) for g in got] == [
        (w.request_id, w.sample_index, w.seed) for w in want
    ]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def grouped(model):
    """The default engine (group prefill on)."""
    return JaxEngine(model, CFG)


def test_group_prefill_equals_a_prefill_of_every_row(grouped, per_row):
    eng = grouped
    assert eng.config.group_prefill  # the default
    eng.stats.update(rows=0, prefill_rows=0)
    got = eng.generate(_requests(), SamplingParams(n=3, max_new_tokens=N_NEW, temperature=1.0))
    assert eng.stats == {"rows": 9, "prefill_rows": 2}  # two distinct prompts, nine rows
    _assert_same(got, per_row)
    # The copies are a cache, not a result: a group's members still draw their own samples.
    assert len({g.token_ids for g in got[0]}) == 3
    # Rows of requests 0 and 2 share a prompt but not seeds: different samples.
    assert got[0][0].token_ids != got[2][0].token_ids


def test_distinct_prompts_prefill_every_row(grouped):
    """All prompts distinct: the distinct rows fill the same bucket as the rows, so the plain
    path runs (nothing to share). Nine rows: the 16-row bucket of `per_row` (its program)."""
    eng = grouped
    eng.stats.update(rows=0, prefill_rows=0)
    b = _requests()[1].prompt_ids
    reqs = [GenerationRequest(b[: 9 + k], f"d{k}", step=1, task_index=k) for k in range(9)]
    eng.generate(reqs, SamplingParams(max_new_tokens=N_NEW))
    assert eng.stats == {"rows": 9, "prefill_rows": 9}


def test_group_prefill_on_a_mesh(per_row):
    """Rows and the prefilled prompts split over ("data", "fsdp") of 8 devices (the distinct
    prompts padded to the mesh's 8 rows): the gather crosses shards, the samples are the same."""
    mesh = make_mesh(data=2, fsdp=4, tensor=1)
    eng = JaxEngine(shard_model(_model(), mesh), CFG, mesh=mesh)
    got = eng.generate(_requests(), SamplingParams(n=3, max_new_tokens=N_NEW, temperature=1.0))
    assert eng.stats == {"rows": 9, "prefill_rows": 2}
    _assert_same(got, per_row)


def test_rollout_group_prefill_flag_reaches_the_engine(model):
    from rubric_rl.config import builders
    from rubric_rl.config.config_validation import validate_config
    from rubric_rl.config.defaults import get_base_config

    config = get_base_config()
    tok = type("Tok", (), {"vocab_size": 100, "eos_id": 2, "pad_id": 0})()
    assert builders.build_engine(config, model, tok, None).config.group_prefill is True
    config.rollout.group_prefill = False
    assert builders.build_engine(config, model, tok, None).config.group_prefill is False
    validate_config(config)
    with config.unlocked():
        del config.rollout["group_prefill"]
        config.rollout.group_prefill = "yes"
    with pytest.raises(ValueError, match="rollout.group_prefill.*True or False"):
        validate_config(config)


def _other_model(kind: str):
    if kind == "hybrid":
        from tests.rollout.test_qwen3_5_engine import _sharpened_model

        return _sharpened_model(0)  # peaked logits: a wrong row's cache would change samples
    return Qwen3ForCausalLM(
        dataclasses.replace(PRESETS["tiny"], scan_layers=True), rngs=nnx.Rngs(0)
    )


@pytest.mark.parametrize("kind", ["hybrid", "scanned"])
def test_group_prefill_on_other_cache_layouts(kind):
    """Qwen3.5's cache also holds each linear-attention layer's conv and recurrent state; a
    scanned Qwen3 stacks every layer's K/V on axis 1. Both are batch first, so the copy is the
    same gather: the samples equal a prefill of every row."""
    model = _other_model(kind)
    params = SamplingParams(n=3, max_new_tokens=N_NEW, temperature=1.0)
    want = JaxEngine(model, dataclasses.replace(CFG, group_prefill=False))
    want = want.generate(_requests(), params)
    eng = JaxEngine(model, CFG)
    got = eng.generate(_requests(), params)
    assert eng.stats == {"rows": 9, "prefill_rows": 2}
    _assert_same(got, want)
