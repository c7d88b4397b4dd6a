"""On the CPU SGLang server: which of our model families' exports SGLang serves.

- Qwen2 / Qwen2.5 (q/k/v biases): our export is served, and the server's sampled-token and
  scored log-probs equal `transformers`' and the trainer's on the same safetensors.
- Qwen3.5 (hybrid Gated DeltaNet): SGLang 0.5.23 has the model (`Qwen3_5ForCausalLM`), but on a
  CPU its module does not import: it binds CPU kernels of the real `sgl_kernel` CPU build
  (`fused_sigmoid_mul_cpu`, the fused Gemma-norm / projection ops, the linear-attention kernels)
  that the recipe's stand-in does not have. The start must then fail with a clear error naming
  the architecture, within seconds, leaving no process behind — not hang. When a future recipe
  serves it, this test fails and says so: turn it into a parity test like the Qwen2 one.

Each test starts its own tiny server (the session's Qwen3 server cannot change architecture):
about 15 s each on an idle 2-core machine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rollout.sglang_client import RetryPolicy, SGLangEngine
from rubric_rl.rollout.sglang_server import SGLangServer, SGLangServerError
from tests.rollout.conftest import server_config
from tests.rollout.sglang_env import TINY_QWEN3, require_sglang_venv
from tests.rollout.test_sglang import EOS, LOGPROB_ATOL, REFERENCES, _assert_complete, _prompts

VOCAB = TINY_QWEN3["vocab_size"]


def _export(family: str, path: Path) -> Path:
    """A tiny random model of `family` written by our exporter, weights sharpened as the Qwen3
    fixture's so that log-probs differ clearly from uniform."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rubric_rl.models import (
        QWEN3_5_PRESETS,
        Qwen3_5ForCausalLM,
        Qwen3ForCausalLM,
        save_pretrained,
    )
    from rubric_rl.models.config import PRESETS

    ids = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=EOS)
    if family == "qwen2":
        model = Qwen3ForCausalLM(
            dataclasses.replace(PRESETS["qwen2_tiny"], **ids), rngs=nnx.Rngs(0)
        )
    else:
        cfg = dataclasses.replace(QWEN3_5_PRESETS["qwen3_5_tiny"], **ids)
        model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(100), len(jax.tree.leaves(state))))
    state = jax.tree.map(
        lambda p: (
            p + 0.15 * jax.random.normal(next(keys), p.shape, jnp.float32) if p.ndim == 2 else p
        ),
        state,
    )
    nnx.update(model, state)
    save_pretrained(model, str(path))
    return path


@pytest.mark.sglang
def test_qwen2_export_is_served_with_trainer_exact_logprobs(tmp_path):
    require_sglang_venv()
    model_dir = _export("qwen2", tmp_path / "qwen2")
    assert '"model_type": "qwen2"' in (model_dir / "config.json").read_text()
    server = SGLangServer(server_config(model_dir, tmp_path / "server.log"))
    server.start()
    try:
        retry = RetryPolicy(max_attempts=3, base_s=0.2, max_s=2.0)
        with SGLangEngine([server], max_concurrency=8, retry=retry, vocab_size=VOCAB) as engine:
            prompts = _prompts(4, seed=0)
            reqs = [
                GenerationRequest(p, f"q{i}", step=1, task_index=i) for i, p in enumerate(prompts)
            ]
            out = engine.generate(reqs, SamplingParams(max_new_tokens=8, temperature=0.8, n=2))
            pairs = [(r.prompt_ids, g.token_ids) for r, group in zip(reqs, out) for g in group]
            got = [g.logprobs for group in out for g in group]
            for g in (g for group in out for g in group):
                _assert_complete(g, 8)
            scored = list(zip(_prompts(3, seed=2), _prompts(3, seed=3, lo=3, hi=9)))
            scores = engine.score(scored, temperature=1.0)
            for name, reference in REFERENCES.items():
                for lp, ref in zip(got, reference(model_dir, pairs, 0.8), strict=True):
                    np.testing.assert_allclose(lp, ref, atol=LOGPROB_ATOL, rtol=0, err_msg=name)
                for lp, ref in zip(scores, reference(model_dir, scored, 1.0), strict=True):
                    np.testing.assert_allclose(lp, ref, atol=LOGPROB_ATOL, rtol=0, err_msg=name)
    finally:
        server.stop()
    assert not server.alive()


@pytest.mark.sglang
def test_qwen3_5_export_is_refused_on_cpu_with_a_clear_error(tmp_path):
    require_sglang_venv()
    model_dir = _export("qwen3_5", tmp_path / "qwen3_5")
    server = SGLangServer(server_config(model_dir, tmp_path / "server.log"))
    try:
        with pytest.raises(SGLangServerError) as err:
            server.start()
    finally:
        server.stop()
    message = str(err.value)
    # The architecture is named, and why: its module did not import on CPU (a missing kernel).
    assert "Qwen3_5ForCausalLM" in message, message[-2000:]
    log = (tmp_path / "server.log").read_text()
    assert "Ignore import error when loading sglang.srt.models.qwen3_5_text" in log
    assert "fused_sigmoid_mul_cpu" in log
    assert not server.alive()
