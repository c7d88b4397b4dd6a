"""Environment for tests that run ``python -m rubric_rl.launch`` in subprocesses."""

import os


def launch_env(cache_dir) -> dict[str, str]:
    """One CPU device (fastest on the 2-core machine) and a shared persistent compilation cache:
    the processes of one test (uninterrupted, killed, resumed) run the same executables, so they
    compute the same numbers, and a resumed run does not recompile."""
    env = dict(os.environ)
    env.update(
        XLA_FLAGS="",
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache_dir),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return env
