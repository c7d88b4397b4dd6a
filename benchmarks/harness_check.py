"""The scripted-policy controller check of HarnessRL and its ablations (controller_check.py),
before RL.

Prints ONE JSON line: per arm (HarnessRL, w/o critic, w/o critic & memory, AMARIS++ and AMARIS as
approximated here, HarnessRL_g, HarnessRL_c, the switching arms p ← SEC, g ← RuscaRL, c ←
EvoRubric, and the baselines EvoRubric, GRPO + SEC, RuscaRL, SkillRL) the attributor's precision
and recall per failure label against the script's truth (the domain's analysis tags; never-
reachable criteria count as blind), updates proposed / accepted per interface, the reversal rate,
guidance fields per task and the share of unguided tasks at the end, tasks per sampling level, the
effective batch, the all-failure groups that get a rubric signal, and the controller's seconds per
step with the ratio to GRPO's (the same check: scripted generation, real judge; the harness's extra
judge calls, memory and critic are what the ratio measures, not generation). The protocol's budget
(32 tasks × 8 rollouts a step) over ``--steps`` steps, the guidance cap scheduled over them.

``critic_power`` (unless ``--no-power``): the critic's acceptance of scripted candidates whose
true effect is the rollout band's lower bound and 0 (``rubric_rl/checks/harness_critic_check.py``,
the protocol's config, the stand-in's coupling 0.5), for the paired rule (ours, the default) and the
seed's unpaired rule, with the bands and thresholds they were calibrated to.

Usage: python benchmarks/harness_check.py [--steps 40] [--arms grpo,harness_rl] [--no-power]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from configs import grpo, harness_rl  # noqa: E402
from rubric_rl.checks.controller_check import ScriptedPolicy, run_check  # noqa: E402
from rubric_rl.checks.harness_critic_check import critic_power  # noqa: E402

ARMS = {
    "harness_rl": "protocol",
    "no_critic": "protocol,no_critic",
    "no_critic_memory": "protocol,no_critic_memory",
    "amaris_pp": "protocol,amaris_pp",
    "harness_g": "protocol,interfaces=g",
    "harness_c": "protocol,interfaces=c",
    "amaris": "protocol,amaris",
    "evorubric": "protocol,evorubric",
    "switch_p_sec": "protocol,switch=p",
    "switch_g_ruscarl": "protocol,switch=g",
    "switch_c_evorubric": "protocol,switch=c",
}
GRPO_ARMS = {"sec": "protocol,sec", "ruscarl": "protocol,ruscarl", "skillrl": "protocol,skillrl"}
KEYS = ("effective_batch_frac", "all_fail_groups", "all_fail_rubric_signal", "task_pass_rate_last")


def _steps(config, steps: int):
    config = config.copy_and_resolve_references()
    config.unlock()
    config.train.steps = steps
    config.lock()
    return config


def _run(config, steps: int) -> dict:
    t0 = time.perf_counter()
    f = run_check(_steps(config, steps), ScriptedPolicy(), steps).figures
    keep = ("harness/", "sec/", "skillrl/")
    out = {k: round(float(v), 4) for k, v in f.items() if k.startswith(keep) or k in KEYS}
    out["seconds_per_step"] = round((time.perf_counter() - t0) / steps, 3)
    return out


def _power(measurement: str) -> dict:
    config = harness_rl.get_config("protocol").copy_and_resolve_references()
    config.unlock()
    config.harness.measurement = measurement
    config.lock()
    t0 = time.perf_counter()
    r = critic_power(config, coupling=0.5, n_tasks=int(config.harness.max_rollout_measurements))
    return {
        "band": [round(x, 2) for x in r.band],
        "threshold": None if r.threshold is None else round(r.threshold, 2),
        "acceptance_at_lower": round(r.acceptance["lower"], 4),
        "acceptance_at_zero": round(r.acceptance["0.0"], 4),
        "trials": r.trials,
        "power_at_calibration": r.calibrated.get("rollout_power"),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--arms", default="", help="comma-separated arm names (default: all)")
    ap.add_argument("--no-power", action="store_true")
    args = ap.parse_args()
    names = set(filter(None, args.arms.split(",")))
    unknown = names - set(ARMS) - set(GRPO_ARMS) - {"grpo"}
    if unknown:
        raise SystemExit(f"--arms: unknown {sorted(unknown)}; known: grpo, "
                         f"{', '.join([*ARMS, *GRPO_ARMS])}")  # fmt: skip
    out: dict = {"steps": args.steps}
    base = _run(grpo.get_config("protocol"), args.steps)
    out["grpo"] = base
    arms = [(n, harness_rl.get_config(a)) for n, a in ARMS.items()]
    arms += [(n, grpo.get_config(a)) for n, a in GRPO_ARMS.items()]
    arms = [(n, c) for n, c in arms if not names or n in names]
    for name, config in arms:
        out[name] = _run(config, args.steps)
        out[name]["seconds_ratio_to_grpo"] = round(
            out[name]["seconds_per_step"] / base["seconds_per_step"], 3
        )
    if not args.no_power:
        out["critic_power"] = {m: _power(m) for m in ("paired", "unpaired")}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
