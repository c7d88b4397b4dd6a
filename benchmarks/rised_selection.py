"""RISED's greedy round-robin selection (rubric_rl/methods/rised/rised_selection.py) at the seed's
size: 128 candidate groups, 64 kept over 3 environments, a vocabulary of 100 rubrics (the seed's
82 rounded up), Poisson rubric counts.

Prints ONE JSON line: the median seconds of one selection over ``--repeats`` runs, for
``overlap="max"`` and ``"mean"``, and their ratio to the seed's bound (selection takes < 0.1 s
per step, seed §C.6). Host-side numpy: the figure is the CPU's, and a ratio far below 1 is all
it is meant to show.

Usage: python benchmarks/rised_selection.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rubric_rl.methods.rised.rised_selection import env_quotas, select_groups  # noqa: E402

SEED_BOUND_S = 0.1  # seed §C.6: "selection takes less than 0.1 s per step"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--groups", type=int, default=128)
    parser.add_argument("--rubrics", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    profiles = rng.poisson(0.5, (args.groups, args.rubrics)).astype(float)
    envs = [str(e) for e in rng.choice(["alfworld", "dbbench", "webshop"], size=args.groups)]
    quotas = env_quotas(envs, args.groups // 2, collections.Counter(envs))
    out: dict[str, float | int | str] = {
        "benchmark": "rised_selection",
        "groups": args.groups,
        "kept": args.groups // 2,
        "rubrics": args.rubrics,
    }
    for overlap in ("max", "mean"):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            select_groups(profiles, envs, quotas, beta=1.0, overlap=overlap)
            times.append(time.perf_counter() - t0)
        seconds = float(np.median(times))
        out[f"{overlap}/seconds"] = seconds
        out[f"{overlap}/ratio_to_seed_bound"] = seconds / SEED_BOUND_S
    print(json.dumps(out))


if __name__ == "__main__":
    main()
