"""Calibration before RL: what the policy RL starts from can do, written into the run directory.

``CalibrationController`` (``config.calibration.enabled``) runs once, in the first step of a fresh
run, before its update: the policy the engine serves is then the warm-start (or initial)
policy. On a fixed probe set (``calibration.tasks`` training tasks, a permutation seeded by
``calibration.seed`` alone, so every arm and seed of a comparison sees the same tasks) it samples
``rollout.samples_per_task`` rollouts per task through ``Services.generate`` on its own seed
stream, twice: unguided, and with the domain's guidance (``Domain.guidance``: for the embedded
domain, the skill texts of the task's capabilities, as ARISE injects them; a tool domain runs
agent episodes and has no guided arm). Nothing of it is trained, and the trained rollouts are
unchanged (their seeds do not depend on other streams). It judges them on the tasks' seed
rubrics and writes ``controllers/calibration/step_000001/calibration.json``:

- per criterion id (pooled over the probe tasks that have it): the sampled pass rate unguided and
  guided ("satisfied": met, or a pitfall absent), its weight and how many verdicts;
- the task pass rate (verifier), the share of all-failure groups (no rollout passes) and the mean
  rubric reward, unguided and guided: the seed's "skill guidance reduces all-failure rollout
  groups on a fixed task set", measured on the checkpoint RL starts from;
- ``never_met``: criteria of weight ≥ 1 or < 0 (the stated requirements and pitfalls; the small
  positive weights are superficial cues) that no unguided rollout satisfied: what RL cannot learn
  from sampling alone;
- every probe rollout's response and verdicts, so all of the above can be recomputed.

Its figures are also logged at step 1 under ``calibration/*``. Ours: the seeds ask for no such
measurement; we take it so that a comparison starts from a policy known to reach every
criterion (the warm start's acceptance).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from absl import logging

from rubric_rl.controllers.base import Controller
from rubric_rl.envs.base import DomainContract
from rubric_rl.methods.arise.reflection_base import satisfied
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.types import Criterion, Task
from rubric_rl.runs.run_files import step_path

STREAM = "calibration"


def genuine(weight: float) -> bool:
    """A stated requirement (weight ≥ 1) or pitfall (< 0), not a small superficial cue."""
    return weight >= 1.0 or weight < 0.0


class CalibrationController(Controller):
    name = "calibration"

    def __init__(
        self,
        tasks: Sequence[Task],
        n_tasks: int,
        seed: int = 0,
        criteria_library: Callable[[Task], Sequence[Criterion]] | None = None,
    ):
        if n_tasks < 1:
            raise ValueError(f"config.calibration.tasks must be >= 1, got {n_tasks}")
        order = np.random.default_rng(int(seed)).permutation(len(tasks))
        self.tasks = [tasks[i] for i in order[: min(int(n_tasks), len(tasks))]]
        # Judged: the seed rubric plus the library's criteria it lacks (the embedded domain's
        # implicit requirements, which the verifier checks): every requirement gets a pass rate.
        self.judged = [_with_library(t, criteria_library) for t in self.tasks]
        self.done = False
        self.figures: dict[str, Any] = {}

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        if self.done or rollouts.step != 1:
            return {}
        self.done = True
        self.figures = self.measure()
        path = step_path(self.run_dir, rollouts.step, "calibration.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.figures, f, sort_keys=True)
        return _logged(self.figures)

    def measure(self) -> dict[str, Any]:
        svc = self.services
        cfg = svc.config
        n = int(cfg.rollout.samples_per_task)
        chunk = int(cfg.rollout.tasks_per_step)  # the trained batch's shape: no new compile
        # Tool environments' tasks: episodes, and no guidance (a mixed domain's guided arm gives
        # them their own prompt); a domain of tool tasks only has no guided arm.
        episode = [svc.is_episode(t) for t in self.tasks]
        guidance = None if all(episode) else getattr(svc.domain, "guidance", None)
        arms = {"unguided": [t.messages for t in self.tasks]}
        if guidance is not None:
            arms["guided"] = [
                t.messages if e else guidance(t) for t, e in zip(self.tasks, episode, strict=True)
            ]
        out: dict[str, Any] = {"tasks": [t.id for t in self.tasks], "rollouts_per_task": n}
        for arm, prompts in arms.items():
            responses: list[list[str]] = []
            for lo in range(0, len(prompts), chunk):
                tasks = self.tasks[lo : lo + chunk]
                _, trajs = svc.rollouts(tasks, n, stream=STREAM, prompts=prompts[lo : lo + chunk])
                responses += [[x.response for x in ts] for ts in trajs]
            verdicts = svc.judge(self.judged, responses)
            out[arm] = summarise(self.judged, responses, verdicts, svc.task_verifier, self.tasks)
        unguided = out["unguided"]["criteria"]
        out["never_met"] = sorted(
            cid for cid, c in unguided.items() if genuine(c["weight"]) and c["pass_rate"] == 0.0
        )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state) -> None:
        self.done = bool(state["done"])


def _with_library(task: Task, library: Callable[[Task], Sequence[Criterion]] | None) -> Task:
    if library is None:
        return task
    own = {c.title or c.id for c in task.rubric.criteria}  # the constraint kinds it checks
    extra = tuple(c for c in library(task) if (c.title or c.id) not in own)
    if not extra:
        return task
    rubric = dataclasses.replace(task.rubric, criteria=task.rubric.criteria + extra)
    return dataclasses.replace(task, rubric=rubric)


def summarise(tasks, responses, verdicts, verifier, reward_tasks=None) -> dict[str, Any]:
    """Pass rates per criterion, task pass rate, all-failure groups, rubric reward (weighted
    mean of satisfied criteria per rollout, on ``reward_tasks``' rubrics when given: the seed
    rubric without the library's extra criteria), and the rollouts themselves."""
    from rubric_rl.rubrics.rewards import batch_rewards

    crit: dict[str, list[float]] = {}
    weight: dict[str, float] = {}
    passed, all_fail, rows = [], [], []
    for task, rs, vs in zip(tasks, responses, verdicts, strict=True):
        weights = {c.id: c.weight for c in task.rubric.criteria}
        defined = [x for x in (verifier(task, r) for r in rs) if not np.isnan(x)]
        passed += defined
        if defined:
            all_fail.append(float(not any(defined)))
        for r, row in zip(rs, vs, strict=True):
            met = {v.criterion_id: v.met for v in row}
            rows.append({"task": task.id, "response": r, "verdicts": met})
            for v in row:
                if v.met is None:
                    continue
                w = weights[v.criterion_id]
                acc = crit.setdefault(v.criterion_id, [0.0, 0.0])
                acc[0] += float(satisfied(v.met, w))
                acc[1] += 1.0
                weight[v.criterion_id] = w
    if reward_tasks is not None:
        keep = [{c.id for c in t.rubric.criteria} for t in reward_tasks]
        verdicts = [
            [[v for v in row if v.criterion_id in ids] for row in vs]
            for vs, ids in zip(verdicts, keep, strict=True)
        ]
        tasks = reward_tasks
    scores = Rollouts.from_responses(0, list(tasks), responses, verdicts).scores
    reward = batch_rewards("weighted", scores).values.astype(np.float64)
    return {
        "criteria": {
            cid: {"pass_rate": s / n, "verdicts": int(n), "weight": weight[cid]}
            for cid, (s, n) in sorted(crit.items())
        },
        "task_pass_rate": float(np.mean(passed)) if passed else float("nan"),
        "all_fail_groups": float(np.mean(all_fail)) if all_fail else float("nan"),
        "rubric_reward": float(np.nanmean(reward)),
        "rollouts": rows,
    }


def _logged(fig: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {"never_met": float(len(fig["never_met"]))}
    for arm in ("unguided", "guided"):
        if arm not in fig:
            continue
        a = fig[arm]
        for k in ("task_pass_rate", "all_fail_groups", "rubric_reward"):
            out[f"{arm}/{k}"] = a[k]
        for cid, c in a["criteria"].items():
            out[f"{arm}/criteria/{cid}/pass_rate"] = c["pass_rate"]
    return out


def build_calibration(config: Any, domain: DomainContract) -> list[Controller]:
    """``[CalibrationController]`` when ``config.calibration.enabled``, else ``[]``; also ``[]``
    (logged) when no training task has criteria (the ``plain`` format's): there is nothing to
    calibrate."""
    cal = config.get("calibration")
    if cal is None or not bool(cal.enabled):
        return []
    if not any(len(t.rubric.evaluated()) for t in domain.train):
        logging.info("calibration skipped: no training task has criteria")
        return []
    library = getattr(domain, "criteria_library", None)
    return [CalibrationController(domain.train, int(cal.tasks), int(cal.seed), library)]


def read(run_dir: str) -> dict[str, Any]:
    """The calibration a run wrote (``controllers/calibration/step_000001/calibration.json``)."""
    path = os.path.join(run_dir, "controllers", "calibration", "step_000001", "calibration.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


__all__ = ["STREAM", "CalibrationController", "build_calibration", "genuine", "read", "summarise"]
