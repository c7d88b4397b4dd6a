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
