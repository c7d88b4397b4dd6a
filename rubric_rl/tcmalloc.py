"""tcmalloc for XLA:CPU (stdlib only, so entry points can call it before importing jax).

XLA:CPU allocates and frees many small buffers every step; glibc's malloc makes the embedded
default ≈ 1.5× slower (measured 2026-11-30 on the 2-core CPU: 0.75 -> 0.51 s per RL step;
notes/jax-on-cpu.md measured ≈ 1.6× on the train step). ``python -m rubric_rl.launch`` and the
benchmarks re-execute themselves with the library preloaded when it is installed
(Debian/Ubuntu: ``libtcmalloc-minimal4``); ``RUBRIC_RL_TCMALLOC=0`` turns that off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def preload_env(
    environ: Mapping[str, str], exists: Callable[[str], bool] = os.path.exists
) -> dict[str, str] | None:
    """The environment to re-execute with tcmalloc preloaded, or None: when the library is not
    installed, is already preloaded (so a re-executed process runs), or ``RUBRIC_RL_TCMALLOC`` is
    "0". An existing ``LD_PRELOAD`` is kept after it."""
    if environ.get("RUBRIC_RL_TCMALLOC", "1") == "0" or not exists(TCMALLOC):
        return None
    preload = environ.get("LD_PRELOAD", "")
    if "tcmalloc" in preload:
        return None
    return dict(environ, LD_PRELOAD=f"{TCMALLOC}:{preload}" if preload else TCMALLOC)
