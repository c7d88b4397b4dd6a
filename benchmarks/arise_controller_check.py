"""The scripted-policy controller check of ARISE (rubric_rl/checks/controller_check.py), before RL.

Prints ONE JSON line: for ARISE's current defaults (``current``), its earlier defaults
(``previous``: ``arise_config.EARLIER_DEFAULTS``, i.e. importance weights u = 1/(N p) on the
capability sampler's draws, the separation ranking, no exit for a pair still failing after its
refinements, candidates from the seed rubric only, a pool of 8 filled at 2 pairs a step), the
current defaults with each of the candidate bank and the ranking set back alone, and
static-rubric GRPO: pool fill and turnover, stuck slots, the share of all-failure groups that get
a rubric signal, the effective batch (Σu)²/Σu² as a fraction of the groups, the environment mix
against the held-out mix (total variation), all on the comparison's budget (the ``protocol``
variant: 32 tasks × 8 rollouts a step; ``--steps`` steps; the default stand-in script).
Ratios ``current / previous`` for the effective batch and the all-failure signal.
Deterministic; a few minutes on 2 cores.

Usage: python benchmarks/arise_controller_check.py [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from configs import arise, grpo  # noqa: E402
from rubric_rl.checks.controller_check import ScriptedPolicy, run_check  # noqa: E402
from rubric_rl.methods.arise.arise_config import EARLIER_DEFAULTS, with_arise_settings  # noqa: E402

KEYS = (
    "effective_batch_frac",
    "u_max",
    "all_fail_groups",
    "all_fail_rubric_signal",
    "pool/added",
    "pool/retired",
    "pool/retired_unlearnable",
    "pool/refined",
    "pool/live",
    "pool/live_mean",
    "pool/stuck",
    "pool/stuck_mean",
    "pool/full_frac",
    "env_mix_tv",
    "prompt_tokens_max",
    "task_pass_rate_last",
)
ARMS = {
    "previous": EARLIER_DEFAULTS,
    "current": {},
    "current+bank=seed_rubric": {"bank": "seed_rubric"},
    "current+rank=progress": {"programmatic.rank": "progress"},
}


def _figures(config, steps):
    f = run_check(config, ScriptedPolicy(), steps).figures
    out = {k: round(float(f[k]), 4) for k in KEYS if k in f}
    out.update({k: round(float(v), 4) for k, v in f.items() if "mix/" in k})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    out: dict = {"steps": args.steps}
    for name, settings in ARMS.items():
        config = with_arise_settings(arise.get_config("protocol"), settings)
        out[name] = _figures(config, args.steps)
    out["grpo"] = _figures(grpo.get_config("protocol"), args.steps)
    cur, prev = out["current"], out["previous"]
    out["effective_batch_ratio"] = round(
        cur["effective_batch_frac"] / prev["effective_batch_frac"], 4
    )
    out["all_fail_signal_ratio"] = round(
        cur["all_fail_rubric_signal"] / prev["all_fail_rubric_signal"], 4
    )
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
