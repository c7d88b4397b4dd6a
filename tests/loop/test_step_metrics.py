"""The step's logged numbers that every method shares (rubric_rl/loop/step_metrics.py)."""

import math

import pytest

from configs import grpo
from rubric_rl.config.builders import build_domain
from rubric_rl.loop.step_metrics import step_metrics
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory, score_matrices
from rubric_rl.rubrics.types import Verdict


def _group(task, rewards, **kw):
    """A group of rollouts of ``task`` with these task-verifier signals (None: no signal), each
    with a (failed) verdict on every criterion of the task's rubric."""
    trajs = []
    for r in rewards:
        t = _traj(r)
        t.verdicts = tuple(Verdict(c.id, False) for c in task.rubric.criteria)
        trajs.append(t)
    return Group(task, trajectories=trajs, **kw)


def _traj(task_reward):
    t = Trajectory((11, 12), (-0.1, -0.2), "stop", 1, "an answer")
    if task_reward is not None:
        t.signals["task_verifier"] = task_reward
    t.reward = 0.5
    return t


def test_task_pass_and_all_failure_groups_over_every_generated_group():
    tasks = build_domain(grpo.get_config("smoke")).train[:4]
    groups = [
        _group(tasks[0], [1.0, 0.0]),  # solved once
        _group(tasks[1], [0.0, 0.0]),  # all failed
        _group(tasks[2], [math.nan, math.nan]),  # the verifier failed: undefined, not a failure
        # not selected for training: still a generated group the policy failed
        _group(tasks[3], [0.0, None], selected=False),
    ]
    rollouts = Rollouts(1, groups)
    rollouts.scores = score_matrices(rollouts)
    m = step_metrics(rollouts, {}, {"step": 1.0, "rollout": 1.0}, measured=False)
    # 1 pass of the 5 defined verdicts; groups with a defined verdict: 0 (solved), 1, 3 (failed)
    assert m["task/pass_rate"] == pytest.approx(1 / 5)
    assert m["task/all_fail_groups"] == pytest.approx(2 / 3)


def test_no_task_verifier_signal_logs_no_task_numbers():
    tasks = build_domain(grpo.get_config("smoke")).train[:1]
    rollouts = Rollouts(1, [_group(tasks[0], [None, None])])
    rollouts.scores = score_matrices(rollouts)
    m = step_metrics(rollouts, {}, {"step": 1.0, "rollout": 1.0}, measured=False)
    assert "task/pass_rate" not in m and "task/all_fail_groups" not in m  # never a fake 0
