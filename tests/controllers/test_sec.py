"""SEC's difficulty bandit (rubric_rl/methods/harness_rl/sec.py) against plain-numpy references, its
per-arm queues, exact resume, and the sampler on the scripted stand-in policy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import grpo
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.methods.harness_rl.sec import (
    UNMEASURED,
    SECBandit,
    SECConfig,
    SECSampler,
    arm_of,
    measure_pass_rates,
    pass_rate_bins,
)
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


def test_pass_rate_bins_are_quantiles_with_ties_sharing_a_bin_and_unmeasured_apart():
    # Distinct rates: quintiles of ten tasks, two per bin, lowest rates in bin 0.
    rates = [0.9, 0.1, 0.5, 0.3, 0.7, 0.0, 0.8, 0.2, 0.6, 0.4]
    got = pass_rate_bins(rates, 5)
    want = {0.0: 0, 0.1: 0, 0.2: 1, 0.3: 1, 0.4: 2, 0.5: 2, 0.6: 3, 0.7: 3, 0.8: 4, 0.9: 4}
    assert got == [f"pass_rate/{want[r]}" for r in rates]
    # Ties share the bin of their group's centre (4 of 5 tasks at 1.0: centre 0.6 -> bin 1 of
    # 2), whichever end they sit at; None and NaN are their own arm.
    assert (
        pass_rate_bins([1.0, 1.0, 0.0, 1.0, 1.0], 2)
        == ["pass_rate/1"] * 2 + ["pass_rate/0"] + ["pass_rate/1"] * 2
    )
    assert pass_rate_bins([0.0, 0.0, 0.0, 0.0, 1.0], 2) == ["pass_rate/0"] * 4 + ["pass_rate/1"]
    assert pass_rate_bins([0.5, None, float("nan"), 0.2], 3) == [
        "pass_rate/2", UNMEASURED, UNMEASURED, "pass_rate/0",
    ]  # fmt: skip
    assert pass_rate_bins([0.3] * 4, 5) == ["pass_rate/2"] * 4  # one tie group, one arm
    assert pass_rate_bins(list(np.linspace(0, 1, 12)), 12)[-1] == "pass_rate/11"
    with pytest.raises(ValueError, match="no task has a measured pass rate"):
        pass_rate_bins([None, None], 3)
    with pytest.raises(ValueError, match="sec.bins"):
        SECConfig(bins="level")
    with pytest.raises(ValueError, match="type_count"):
        SECSampler([_task(0, "list", 2)], 1, config=SECConfig(bins="pass_rate"))


class _Tiered(ScriptedPolicy):
    """Scripted per-task pass rates: ``easy`` tasks meet every requirement, ``hard`` ones none
    (some rubric points stay reachable without trying), the rest follow the default script."""

    def __init__(self, easy, hard):
        super().__init__(seed=0)
        self.easy, self.hard = set(easy), set(hard)

    def respond(self, task, messages, step, j, salt=0):
        from rubric_rl.envs.constraint_domain import render_response, task_requirements

        if task.id not in self.easy | self.hard:
            return super().respond(task, messages, step, j, salt)
        rng = np.random.default_rng([step, j, salt, len(task.id)])
        kinds = {c.kind for c in task_requirements(task)} if task.id in self.easy else set()
        return render_response(task, kinds, rng)


def test_harness_sec_pass_rate_bins_follow_the_scripted_pass_rates_and_resume_exactly(tmp_path):
    """HarnessRL's p_t <- SEC with ``sec.bins="pass_rate"`` on the scripted policy: the warm
    start's measured pass rates put the tasks scripted to fail everything in the low bin and
    those scripted to pass everything in the high one; a subset measurement leaves the rest
    unmeasured; the arms come back from the checkpoint without measuring."""
    from configs import harness_rl

    c = harness_rl.get_config("smoke,switch=p")
    c.unlock()
    c.rollout.update(tasks_per_step=6, samples_per_task=4)
    c.domain.n_train = 24
    c.harness.sec.update(bins="pass_rate", n_bins=2, pass_rate_samples=3)
    c.lock()
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path / "probe"))
    ids = [t.id for t in run.domain.train]
    easy, hard = ids[::2], ids[1::2]
    policy = _Tiered(easy, hard)
    run = scripted_run(c, policy, str(tmp_path / "run"))
    ctl = run.controllers.sampler
    assert ctl.sec is None  # measured at the first draw
    for step in (1, 2):
        r, ctx = run.step(step)
        assert all(g.weight == 1.0 for g in r.groups)
    rates = ctl.sec_rates
    assert set(rates) == set(ids) and all(rates[t] is not None for t in ids)
    assert min(rates[t] for t in easy) > max(rates[t] for t in hard)
    arm = {t: ctl.sec.names[ctl.sec.arm_index[i]] for i, t in enumerate(ids)}
    assert {arm[t] for t in hard} == {"pass_rate/0"}
    assert {arm[t] for t in easy} == {"pass_rate/1"}
    assert "harness/sec/p/pass_rate/0" in ctx.metrics
    part = measure_pass_rates(ctl.services, run.domain.train, samples=1, n_tasks=5, seed=1)
    assert sum(v is not None for v in part.values()) == 5 and len(part) == len(ids)
    # Resume: a fresh controller rebuilds the same arms from the checkpoint, no measurement.
    state = json.loads(json.dumps(ctl.state_dict()))
    again = scripted_run(c, policy, str(tmp_path / "resume")).controllers.sampler
    again.load_state_dict(state)
    assert again.sec_rates == rates and again.sec.names == ctl.sec.names
    np.testing.assert_array_equal(again.sec.arm_index, ctl.sec.arm_index)
    assert again.state_dict()["sec"] == ctl.state_dict()["sec"]
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    np.testing.assert_array_equal(again.sec.draw(9, a), ctl.sec.draw(9, b))
    state["sec"].pop("pass_rates")
    with pytest.raises(ValueError, match="no pass rates"):
        scripted_run(c, policy, str(tmp_path / "bad")).controllers.sampler.load_state_dict(state)
