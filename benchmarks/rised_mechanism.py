"""RISED's mechanism on the scripted policy (figures: rubric_rl/methods/rised/rised_check.py) and
the two pure-function figures of its selection. Prints ONE JSON line:

- the scripted figures (``rised_figures``): ``sd_reach`` vs ``success_share``,
  ``failed_with_positive``, the hint precisions against the script's truth, and the trained
  groups' zero-variance share and mean variance against a random choice of as many
  (``selected/*`` vs ``random/*``);
- ``var_target_signal_kept``: of the repro pool (27 all-fail groups, 3 at 1/8, 2 at 2/8,
  k = 16), how many of the 5 groups with a signal the Var-Target baseline keeps
  (``top_var_signal_kept``: Top-Var's, for reference);
- ``zero_profile_over_tagged``: share of random candidate pools (one all-zero profile per
  environment) in which the all-zero profile is picked while a tagged candidate of its
  environment is left.

Usage: python benchmarks/rised_mechanism.py [--steps 20] [--old]
(``--old``: the flags that keep the earlier rules: unconditioned tagging, count-ranked
hints, raw-count profiles summed as they are, untagged groups scored 0, Var-Target at 2× the pool
mean.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from configs import rised as rised_config  # noqa: E402
from rubric_rl.methods.rised import rised_selection as sel  # noqa: E402
from rubric_rl.methods.rised.rised_check import PREVIOUS_FLAGS, rised_figures  # noqa: E402


def var_target_repro(targeting: str) -> dict[str, float]:
    rewards = np.zeros((32, 8))
    rewards[27:30, 0] = 1.0  # 3 groups at 1/8
    rewards[30:32, :2] = 1.0  # 2 groups at 2/8
    envs = ["a"] * 32
    kept = sel.var_target(rewards, envs, None, 16, np.random.default_rng(0), targeting)
    top = sel.top_variance(rewards, envs, None, 16, rng=np.random.default_rng(0))
    return {
        "var_target_signal_kept": float(sum(i >= 27 for i in kept)),
        "top_var_signal_kept": float(sum(i >= 27 for i in top)),
    }


def zero_profile_pools(untagged: str, batch: str, trials: int = 200) -> dict[str, float]:
    rng = np.random.default_rng(0)
    bad = 0
    for _ in range(trials):
        envs = [e for e in ("a", "b", "c") for _ in range(10)]
        # Groups sharing the batch's common behaviours (a rate per rubric, 8 rollouts a group):
        # overlap with the groups picked so far soon outweighs alignment, so tagged groups
        # score below 0, an all-zero profile's score under "score0".
        prof = rng.poisson(rng.gamma(0.3, 0.5, 38) * 8, (30, 38)).astype(float)
        zero = [0, 10, 20]
        prof[zero] = 0.0
        prof[[i for i in range(30) if i not in zero and not prof[i].any()], 0] = 1.0
        order = sel.select_groups(
            prof, envs, sel.env_quotas(envs, 15), batch=batch, untagged=untagged
        )
        for z in zero:
            if z in order:
                left = [
                    i for i in range(30) if envs[i] == envs[z] and i not in order and prof[i].any()
                ]
                bad += bool(left)
    return {"zero_profile_over_tagged": bad / (3 * trials)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--old", action="store_true")
    args = parser.parse_args()
    c = rised_config.get_config()
    if args.old:
        c.unlock()
        c.rised.update(**PREVIOUS_FLAGS)
        c.lock()
    r = c.rised
    out = {"benchmark": "rised_mechanism", "steps": args.steps, "old": args.old}
    with tempfile.TemporaryDirectory() as d:
        out.update(rised_figures(c, args.steps, d))
    out.update(var_target_repro(r.variance_targeting))
    out.update(zero_profile_pools(r.untagged, r.batch_profile))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
