"""RISED's greedy round-robin selection (rubric_rl/methods/rised/rised_selection.py) at the seed's
size: 128 candidate groups, 64 kept over 3 environments, a vocabulary of 100 rubrics (the seed's
82 rounded up), Poisson rubric counts.

Prints ONE JSON line: the median seconds of one selection over ``--repeats`` runs, for
``overlap="max"`` and ``"mean"``, and their ratio to the seed's bound (selection takes < 0.1 s
per step, seed §C.6). Host-side numpy: the figure is the CPU's, and a ratio far below 1 is all
it is meant to show.

With ``--scripted-steps N`` (default 20; 0 skips it) it also runs RISED's default config for N
steps on the scripted policy (``rubric_rl/methods/rised/rised_check.py``) under the current rules
(``scripted/now/*``) and under every previous-behaviour flag (``scripted/previous/*``, the same
as the code before outcome-conditioned tags, presence profiles and the new Var-Target): the
trained groups' zero-variance share and mean within-group variance against a uniformly random
choice of as many of the same candidates (``selected/*`` vs ``random/*``).

Usage: python benchmarks/rised_selection.py [--repeats 20] [--scripted-steps 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
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
    parser.add_argument("--scripted-steps", type=int, default=20)
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
    if args.scripted_steps > 0:
        out.update(scripted(args.scripted_steps))
    print(json.dumps(out))


def scripted(steps: int) -> dict[str, float]:
    from configs import rised as rised_config
    from rubric_rl.methods.rised.rised_check import PREVIOUS_FLAGS, rised_figures

    out = {}
    for name, flags in (("now", {}), ("previous", PREVIOUS_FLAGS)):
        c = rised_config.get_config()
        c.unlock()
        c.rised.update(**flags)
        c.lock()
        with tempfile.TemporaryDirectory() as d:
            fig = rised_figures(c, steps, d)
        for key in sorted(fig):
            if key.startswith(("selected/", "random/")):
                out[f"scripted/{name}/{key}"] = fig[key]
    return out


if __name__ == "__main__":
    main()
