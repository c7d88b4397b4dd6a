"""The SGLang server's virtual environment, for the tests that start a real server."""

import pytest

from rubric_rl.rollout.sglang_server import default_server_python


def require_sglang_venv() -> None:
    """Skips the calling test or fixture, naming the install step, without the server's venv."""
    python = default_server_python()
    if not python.exists():
        pytest.skip(
            f"SGLang server venv not found ({python}): run third_party/sglang_cpu/install.sh "
            "(or set SGLANG_VENV)"
        )


# SGLang settings of the tests' servers (their environment; training's server inherits the
# launch's): /health answers without generating a token (each such check sleeps a second), and a
# stop (SIGTERM to the server's process group, which the launcher reads as its scheduler
# crashing) does not sleep 5 s before crash diagnostics (py-spy / CUDA core dumps) a test never
# reads.
SERVER_ENV = {
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0",
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
}

# The tests' tiny Qwen3 (conftest.py's shared server serves it): small enough for a 2-core CI
# machine; vocabulary above 256 so ids are not byte-like, and the smoke model's (576: its
# tokenizer's ids rounded up to 64), so that smoke_config's exports load into that server.
TINY_QWEN3 = dict(
    vocab_size=576,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
)


def smoke_config():
    """``configs/grpo.py:smoke`` with its model in TINY_QWEN3's shape (``model.shape``: the smoke
    preset's layers and vocabulary, and TINY_QWEN3's untied head), so that its exports load into
    the shared server by a weight update (a server keeps its architecture)."""
    from configs import grpo

    c = grpo.get_config("smoke")
    shape = {k: v for k, v in TINY_QWEN3.items() if k not in ("bos_token_id", "eos_token_id")}
    c.model.update(shape=shape)
    return c
