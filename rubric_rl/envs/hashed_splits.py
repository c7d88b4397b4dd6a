"""Seeded task generation with splits fixed by the hash of each task's parameters.

Shared by the generated single-turn domains (the embedded constraint domain and the English
instruction-following one): a task's in-distribution split (train / validation / heldout) is
decided by the hash of its parameters, whatever the seed or the order it was drawn in, so the
splits are disjoint for every seed, and ``generate(..., n)`` is a prefix of
``generate(..., n + 1)``.
The ``ood`` split has its own sampler (types or combinations never trained) and takes every task
it draws.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from rubric_rl.rubrics.types import Task

SPLITS = ("train", "validation", "heldout", "ood")
SPLIT_IDS = {"train": 0, "heldout": 1, "ood": 2, "validation": 3}


def params_key(params: Any) -> str:
    """The hex digest a task's parameters are keyed on (its id and its split come from it)."""
    return hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()


def hash_split(key: str, heldout_percent: int, validation_percent: int) -> str:
    """The in-distribution split of a task, from the hash of its parameters."""
    bucket = int(key[:8], 16) % 100
    if bucket < heldout_percent:
        return "heldout"
    return "validation" if bucket < heldout_percent + validation_percent else "train"


def generate(
    kind: str,
    seed: int,
    split: str,
    n: int,
    sample: Callable[[str, np.random.Generator], dict[str, Any]],
    make: Callable[[str, dict[str, Any], str], Task],
    *,
    heldout_percent: int,
    validation_percent: int,
) -> list[Task]:
    """The first ``n`` distinct tasks of ``split``: parameters drawn by ``sample(split, rng)``
    from the stream of (seed, split), kept when their hash puts them in ``split`` (any draw for
    ``ood``), each made by ``make(split, params, key)``. ``kind`` names the generator in errors."""
    if split not in SPLITS:
        raise ValueError(f"{kind}.tasks: split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"{kind}.tasks: n must be >= 0, got {n}")
    rng = np.random.default_rng([int(seed), SPLIT_IDS[split]])
    out: list[Task] = []
    seen: set[str] = set()
    budget = 200 * n + 1000
    while len(out) < n:
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"{kind}: cannot find {n} distinct {split} tasks")
        params = sample(split, rng)
        # Keyed on the parameters, so one task (whatever its clause order) has one split.
        key = params_key(params)
        if split != "ood" and hash_split(key, heldout_percent, validation_percent) != split:
            continue
        if key in seen:
            continue
        seen.add(key)
        out.append(make(split, params, key))
    return out


# generate_kept's lists, by (kind, seed, split, heldout_percent, validation_percent): the longest.
_KEPT: dict[tuple[str, int, str, int, int], list[Task]] = {}


def generate_kept(
    kind: str,
    seed: int,
    split: str,
    n: int,
    sample: Callable[[str, np.random.Generator], dict[str, Any]],
    make: Callable[[str, dict[str, Any], str], Task],
    *,
    heldout_percent: int,
    validation_percent: int,
) -> list[Task]:
    """`generate`, drawn once per (kind, seed, split) in a process, for a generator whose
    ``sample`` and ``make`` depend on nothing but ``kind`` and ``seed``: every domain build asks
    for its splits again (each trainer, scripted run and evaluation). The longest list drawn is
    kept, and a shorter request is its prefix (``generate`` is prefix-stable). Tasks are frozen;
    each call returns a new list."""
    key = (kind, int(seed), split, int(heldout_percent), int(validation_percent))
    kept = _KEPT.get(key)
    if kept is not None and 0 <= n <= len(kept):
        return kept[:n]
    out = generate(
        kind, seed, split, n, sample, make,
        heldout_percent=heldout_percent, validation_percent=validation_percent,
    )  # fmt: skip
    if len(_KEPT) >= 64 and key not in _KEPT:  # bounded: a few seeds' splits
        _KEPT.clear()
    _KEPT[key] = out[:]
    return out
