"""Static-shape buckets: round a length or a row count up so a run compiles a few shapes once.

Pure Python (no JAX): the engine, the trainer's batch assembly and the warm start all share it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["round_up_to_bucket"]


def round_up_to_bucket(n: int, buckets: Sequence[int], multiple: int = 1) -> int:
    """The smallest bucket >= n (past the largest: the next multiple of the largest), then
    rounded up to a multiple of ``multiple`` (the mesh's batch-axis size)."""
    b = next((x for x in buckets if x >= n), None)
    if b is None:
        b = buckets[-1] * math.ceil(n / buckets[-1])
    return multiple * math.ceil(b / multiple)
