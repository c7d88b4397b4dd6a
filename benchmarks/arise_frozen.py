"""ARISE's frozen-rubrics arm on the scripted policy (rubric_rl/checks/controller_check.py): a
source ARISE run (train seed 1) fills and evolves its pool; the frozen arm (train seed 0) installs
that pool and runs its first steps. Prints ONE JSON line about the frozen arm's FIRST step:

- ``source/entries``: pairs the source run ever added; ``source/refined``: those with a rewritten
  skill;
- ``first_step/active``: pairs whose skill is shown at step 1; ``first_step/refined``: of
  those, pairs with a refined skill; ``first_step/skills_per_prompt``: skills in a step-1
  prompt, on average; ``first_step/base_text_share``: of every installed pair, the share whose
  skill is its capability's base text (the embedded domain's ``SKILL_TEXTS``);
- ``after/active``, ``after/hidden``, ``after/refined``, ``after/live``: the frozen arm's pool
  after ``--steps`` steps (its skills keep their lifecycle only where the arm lets them; its
  rubric set, ``after/live``, stays the source's).

Usage: python benchmarks/arise_frozen.py [--source-steps 60] [--steps 10] [--mode M]
(``--mode``: ``config.arise.frozen_mode``: ``rubrics`` (default) or ``frozen_pool_and_skills``.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from configs import arise  # noqa: E402
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run  # noqa: E402
from rubric_rl.config import builders  # noqa: E402
from rubric_rl.envs.constraint_lexicon import SKILL_TEXTS  # noqa: E402
from rubric_rl.methods.arise.arise import ACTIVE, HIDDEN, AriseController  # noqa: E402


def _config(seed: int, frozen_mode: str | None):
    c = arise.get_config()
    c.unlock()
    c.rollout.tasks_per_step = 16
    c.domain.n_train = 512
    c.train.seed = seed
    if frozen_mode is not None:
        c.arise.update(**arise.frozen_arm_settings(frozen_mode))
    c.lock()
    return c


def _arise(run) -> AriseController:
    return next(x for x in run.controllers.controllers if isinstance(x, AriseController))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-steps", type=int, default=60)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mode", default="rubrics")
    args = parser.parse_args()
    out: dict[str, float | str | int] = {"benchmark": "arise_frozen", "mode": str(args.mode)}
    base = set(SKILL_TEXTS.values())
    with tempfile.TemporaryDirectory() as d:
        src = scripted_run(_config(1, None), ScriptedPolicy(seed=1), os.path.join(d, "s"))
        for step in range(1, args.source_steps + 1):
            src.step(step)
        state = _arise(src).pool.state_dict()
        out["source/entries"] = len(state["entries"])
        out["source/refined"] = sum(e["skill_version"] > 1 for e in state["entries"])
        c = _config(0, args.mode)
        domain = builders.build_domain(c)
        controllers = builders.build_controllers(c, domain)
        ctl = next(x for x in controllers.controllers if isinstance(x, AriseController))
        ctl.load_pool(state, c.arise.frozen_pool_entries, mode=args.mode)
        run = scripted_run(c, ScriptedPolicy(seed=0), os.path.join(d, "f"), controllers)
        entries = list(ctl.pool.entries.values())
        out["first_step/active"] = sum(e.state == ACTIVE for e in entries)
        out["first_step/refined"] = sum(e.state == ACTIVE and e.skill_version > 1 for e in entries)
        out["first_step/base_text_share"] = sum(e.skill in base for e in entries) / len(entries)
        r, _ = run.step(1)
        shown = [ctl.pool.skills_for(g.task) for g in r.groups]
        out["first_step/skills_per_prompt"] = float(np.mean([len(row) for row in shown]))
        for step in range(2, args.steps + 1):
            run.step(step)
        entries = list(ctl.pool.entries.values())
        out["after/live"] = sum(e.live for e in entries)
        out["after/active"] = sum(e.state == ACTIVE for e in entries)
        out["after/hidden"] = sum(e.state == HIDDEN for e in entries)
        out["after/refined"] = int(ctl.pool.totals["refined"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
