"""Fixtures for the SGLang tests: ONE real server, on tiny random Qwen3 weights, for the module that
uses it (tests/rollout/test_sglang.py, the only one: the same one server per session), stopped
when that module ends rather than idling (a few percent of a core) until the session does.

The server needs the venv built by third_party/sglang_cpu/install.sh (default <repo>/.venv-sglang,
or $SGLANG_VENV); without it the `sglang_*` fixtures skip with that instruction.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rubric_rl.rollout.sglang_server import SGLangServer, SGLangServerConfig
from tests.rollout.sglang_env import SERVER_ENV, TINY_QWEN3, require_sglang_venv


def server_config(model_path: Path, log: Path) -> SGLangServerConfig:
    """A test's server of `model_path` (float32, the recipe's 8192-token KV pool) with the
    tests' SGLang settings (sglang_env.SERVER_ENV), skipping SGLang's start-up warm-up request
    (a second of sleeping; every test sends its own requests at once)."""
    return SGLangServerConfig(
        model_path=str(model_path),
        dtype="float32",
        max_total_tokens=8192,
        startup_timeout_s=300,
        log_path=str(log),
        extra_flags=("--skip-server-warmup",),
        extra_env=tuple(SERVER_ENV.items()),
    )


def _export_ours(path: Path, seed: int) -> Path:
    """Checkpoint A: our JAX Qwen3 written by weight sync's exporter (what training ships)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rubric_rl.models import Qwen3Config, Qwen3ForCausalLM
    from rubric_rl.rollout.weight_sync import export_checkpoint

    cfg = Qwen3Config(**{k: v for k, v in TINY_QWEN3.items() if k != "max_position_embeddings"})
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(seed))
    # Sharpen the random init (normal 0.02 gives near-uniform logits) so distributions, greedy
    # paths and log-probs differ clearly between checkpoints.
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed + 100), len(jax.tree.leaves(state))))
    state = jax.tree.map(
        lambda p: (
            p + 0.15 * jax.random.normal(next(keys), p.shape, jnp.float32) if p.ndim == 2 else p
        ),
        state,
    )
    nnx.update(model, state)
    return export_checkpoint(model, path)  # weight sync's path: rubric_rl.models.save_pretrained


def _export_transformers(path: Path, seed: int, like: Path) -> Path:
    """Checkpoint B: `transformers`' own Qwen3 writer (independent of our exporter), same
    architecture as `like` — a weight update swaps weights only, never the config (rope theta,
    norms), exactly as between training steps."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config.from_pretrained(str(like))
    cfg.initializer_range = 0.15
    transformers.Qwen3ForCausalLM(cfg).to(torch.float32).save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sglang_ckpts")
    ours = _export_ours(root / "ours_seed0", 0)
    return ours, _export_transformers(root / "hf_seed1", 1, like=ours)


@pytest.fixture(scope="module")
def sglang_server(request, tmp_path_factory):
    require_sglang_venv()
    tiny_checkpoints = request.getfixturevalue("tiny_checkpoints")
    log = tmp_path_factory.mktemp("sglang_log") / "server.log"
    server = SGLangServer(server_config(tiny_checkpoints[0], log))
    t0 = time.monotonic()
    server.start()
    print(f"\n[sglang] server up at {server.url} in {time.monotonic() - t0:.1f} s (log {log})")
    standin = [line for line in server.log_tail(400).splitlines() if "stand-in] in use" in line]
    print(f"[sglang] {standin[0] if standin else 'real sgl_kernel (no stand-in line in the log)'}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sglang_engine(sglang_server):
    from rubric_rl.rollout.sglang_client import RetryPolicy, SGLangEngine

    engine = SGLangEngine(
        [sglang_server],
        max_concurrency=16,
        retry=RetryPolicy(max_attempts=6, base_s=0.2, max_s=2.0),
        vocab_size=TINY_QWEN3["vocab_size"],
    )
    yield engine
    engine.close()
