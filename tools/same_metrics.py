"""Compare two runs' ``metrics.jsonl`` on every non-timing key: the "same numbers" check of a
refactor. Usage: ``python tools/same_metrics.py BEFORE_RUN AFTER_RUN [...pairs]`` (run directories
or metrics files). Prints each difference (step, key, before, after) and exits 1 if there is any.

Timing keys (``is_timing``) are left out. Everything else (losses, rewards, pass rates, lengths,
counts, controller figures) must be equal as JSON values (NaN equals NaN), keys present on one
side only included.
"""

from __future__ import annotations

import json
import math
import os
import sys

# What a run logs about wall-clock time or speed, which no two runs share: the ``time/`` and
# ``perf/`` sections (also inside a controller's, ``harness/time/…``) and any rate or
# utilisation figure elsewhere.
TIMING_PREFIXES = ("time/", "perf/")
TIMING_PARTS = ("per_s", "tokens_per", "mfu", "elapsed", "wall_")


def is_timing(key: str) -> bool:
    """Whether ``key`` measures time or speed."""
    k = key.lower()
    return k.startswith(TIMING_PREFIXES) or "/time/" in k or any(p in k for p in TIMING_PARTS)


def same(a: object, b: object) -> bool:
    """Equal as JSON values, NaN equal to NaN (a metric undefined on both sides)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def read(path: str) -> dict[int, dict]:
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    rows: dict[int, dict] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows.setdefault(int(row["step"]), {}).update(row)
    return rows


def differences(before: str, after: str) -> list[tuple]:
    a, b = read(before), read(after)
    out: list[tuple] = []
    for step in sorted(set(a) | set(b)):
        ra, rb = a.get(step, {}), b.get(step, {})
        for key in sorted(set(ra) | set(rb)):
            if is_timing(key):
                continue
            if not same(ra.get(key, "<absent>"), rb.get(key, "<absent>")):
                out.append((step, key, ra.get(key, "<absent>"), rb.get(key, "<absent>")))
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__)
        return 2
    bad = 0
    for before, after in zip(argv[::2], argv[1::2]):
        diff = differences(before, after)
        n_keys = sum(len(r) for r in read(before).values())
        print(f"{before} vs {after}: {len(diff)} differences over {n_keys} values")
        for d in diff[:20]:
            print("  step {} {}: {!r} -> {!r}".format(*d))
        bad += bool(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
