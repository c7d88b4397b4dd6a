"""SEC's difficulty bandit (rubric_rl/methods/harness_rl/sec.py) against plain-numpy references, its
per-arm queues, exact resume, and the sampler on the scripted stand-in policy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import grpo
from rubric_rl.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.methods.harness_rl.sec import SECBandit, SECConfig, SECSampler, arm_of
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verifier

ARMS = ["a", "b", "a", "c", "b", "a"]  # task -> arm


def test_boltzmann_probabilities_and_td0_update_match_numpy():
    b = SECBandit(ARMS, SECConfig(lr=0.5, temperature=0.4), seed=0)
    assert b.names == ["a", "b", "c"]
    np.testing.assert_allclose(b.probabilities(), [1 / 3] * 3)
    # Batch: tasks 0 (a), 1 (b), 2 (a); task 1's group has NaN advantages only partly.
    adv = np.array([[1.0, -1.0], [0.5, np.nan], [-2.0, 0.0]])
    r = b.rewards([0, 1, 2], adv)
    assert r == pytest.approx({0: np.mean([1, 1, 2, 0]), 1: 0.5})  # arm c absent
    b.update(r)
    q = 0.5 * np.array([1.0, 0.5, 0.0])
    np.testing.assert_allclose(b.q, q)
    z = np.exp(q / 0.4)
    np.testing.assert_allclose(b.probabilities(), z / z.sum())
    # Absent arms decay toward 0 (the released code updates every arm).
    b.update({})
    np.testing.assert_allclose(b.q, 0.5 * q)
    with pytest.raises(ValueError, match="α"):
        SECConfig(lr=0.0)
    with pytest.raises(ValueError, match="τ"):
        SECConfig(temperature=0.0)


def test_each_arm_is_a_queue_without_replacement_and_resume_is_exact():
    b = SECBandit(ARMS, seed=3)
    a = b.names.index("a")
    first_pass = [b.next_task(a) for _ in range(3)]
    assert sorted(first_pass) == [0, 2, 5]  # each of arm a's tasks once per pass
    second = [b.next_task(a) for _ in range(3)]
    assert sorted(second) == [0, 2, 5]
    rng = np.random.default_rng(0)
    b.update({0: 0.9, 1: 0.1})
    b.draw(7, rng)
    state = json.loads(json.dumps(b.state_dict()))
    rng_state = rng.bit_generator.state
    want = b.draw(11, rng)
    c = SECBandit(ARMS, seed=3)
    c.load_state_dict(state)
    rng2 = np.random.default_rng(0)
    rng2.bit_generator.state = rng_state
    np.testing.assert_array_equal(c.draw(11, rng2), want)
    with pytest.raises(ValueError, match="arms"):
        SECBandit(["x", "y"]).load_state_dict(state)


def _task(i: int, kind: str, n_pos: int) -> Task:
    crits = [
        Criterion(id=f"c{k}", text=f"t{k}", weight=1.0, verifier=Verifier.rule("cf_non_empty"))
        for k in range(n_pos)
    ] + [Criterion(id="bad", text="bad", weight=-1.0, verifier=Verifier.rule("cf_non_empty"))]
    return Task(
        id=f"t{i}", prompt=({"role": "user", "content": "q"},), rubric=Rubric(tuple(crits)),
        task_type=kind,
    )  # fmt: skip


def test_arms_are_task_type_and_capped_number_of_positive_criteria():
    assert arm_of(_task(0, "list", 3)) == "list/3"
    assert arm_of(_task(1, "list", 9)) == "list/5"
    assert arm_of(_task(2, "format", 9), max_level=2) == "format/2"


def test_the_sampler_on_the_scripted_policy_follows_its_td0_replay(tmp_path):
    """GRPO + SEC on the scripted stand-in policy through the real stages: every draw has u = 1,
    and the bandit's Q equals a numpy replay of TD(0) on each step's mean |A| per arm (absent
    arms decaying), so the arms whose groups carried advantage gain probability."""
    c = grpo.get_config("smoke,sec")
    c.unlock()
    c.rollout.update(tasks_per_step=8, samples_per_task=8)
    c.domain.n_train = 48
    c.lock()
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path))
    sampler = run.controllers.sampler
    assert isinstance(sampler, SECSampler)
    names = sampler.bandit.names
    q = np.zeros(len(names))
    for step in range(1, 9):
        r, ctx = run.step(step)
        assert all(g.weight == 1.0 for g in r.groups)
        per_arm: dict[str, list[float]] = {}
        for g, row in zip(r.groups, r.advantages, strict=True):
            per_arm.setdefault(arm_of(g.task), []).extend(np.abs(row[~np.isnan(row)]).tolist())
        reward = np.array([np.mean(per_arm[a]) if per_arm.get(a) else 0.0 for a in names])
        q = 0.5 * q + 0.5 * reward
        np.testing.assert_allclose(sampler.bandit.q, q, rtol=1e-12, atol=1e-12)
        assert ctx.metrics["sec/q/max"] == pytest.approx(q.max())
    assert q.max() > 0  # some groups carried advantage
    z = np.exp(q - q.max())
    np.testing.assert_allclose(sampler.bandit.probabilities(), z / z.sum())
    # Resume: the sampler's state round-trips through JSON.
    state = json.loads(json.dumps(sampler.state_dict()))
    again = SECSampler(run.domain.train, 8, seed=int(c.train.seed))
    again.load_state_dict(state)
    assert again.state_dict() == sampler.state_dict()
