"""RewardVarianceSampler ("reward_variance"): group variance vs numpy, hand-computed selection
probabilities and importance weights, exploration share, exact resume, the task-verifier reward,
and the ARISE ``sampler=variance`` variant at controller level."""

import json

import numpy as np
import pytest

from configs import arise, grpo
from rubric_rl.config import builders
from rubric_rl.controllers.sampling import (
    GROUP_REWARDS,
    SAMPLERS,
    RewardVarianceConfig,
    RewardVarianceSampler,
    group_variance,
    task_verifier_rewards,
)
from rubric_rl.envs import constraints
from rubric_rl.envs.constraint_corpus import warmstart_example
from rubric_rl.methods.grpo import grpo_controllers
from rubric_rl.methods.method import get_method
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.judges import JudgeItem, ProgrammaticJudge
from rubric_rl.rubrics.types import Criterion, Rubric, Task

RUBRIC = Rubric((Criterion("c", "is short"),))
# (task type, capabilities) of t0..t3
KINDS = [("list", ("counting",)), ("list", ("counting", "ordering")), ("format", ()),
         ("format", ("formatting",))]  # fmt: skip


def Evidence(step, tasks, prompts, responses, verdicts, scores, rewards, advantages):  # noqa: N802
    """The step record controllers observe, built from plain data (``Rollouts.from_responses``)."""
    return Rollouts.from_responses(
        step, tasks, responses, verdicts or None, prompts=prompts or None, rewards=rewards,
        advantages=advantages,
    )  # fmt: skip


def _tasks(n, kinds=None):
    kinds = kinds or [("", ())] * n
    return [
        Task(
            id=f"t{i}",
            prompt=({"role": "user", "content": f"q{i}"},),
            rubric=RUBRIC,
            task_type=kinds[i][0],
            capabilities=kinds[i][1],
        )
        for i in range(n)
    ]


def _evidence(step, tasks, rewards):
    r = np.asarray(rewards, np.float64)
    return Evidence(step, tuple(tasks), (), (), (), None, r, np.zeros_like(r))


def _seeded():
    """t0 var 0.25, t1 var 0, t2 var 0.1875, t3 unseen."""
    s = RewardVarianceSampler(_tasks(4, KINDS), 4, explore_share=0.25, floor=0.01, ema=0.5)
    tasks = s.tasks
    m = s.observe(_evidence(1, tasks[:3], [[1, 0, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]))
    return s, m


def test_group_variance_matches_numpy_on_random_groups():
    rng = np.random.default_rng(0)
    for _ in range(50):
        r = rng.normal(size=rng.integers(2, 9))
        r[rng.random(len(r)) < 0.3] = np.nan
        got = group_variance(r)
        if np.sum(~np.isnan(r)) < 2:
            assert got is None
        else:
            assert got == pytest.approx(np.nanvar(r), rel=1e-12, abs=1e-15)
    assert group_variance(np.array([0.7, 0.7, 0.7])) == 0.0
    assert group_variance(np.array([1.0, np.nan])) is None
    assert group_variance(np.array([1.0, 0.0, 1.0]), min_group=4) is None


def test_hand_computed_probabilities_weights_and_cells():
    s, m = _seeded()
    np.testing.assert_allclose(s.estimates[:3], [0.25, 0.0, 0.1875])
    assert np.isnan(s.estimates[3])
    # q ∝ v + floor over the seen tasks: (0.26, 0.01, 0.1975) / 0.4675
    q = np.array([0.26, 0.01, 0.1975, 0.0]) / 0.4675
    np.testing.assert_allclose(s.adaptive_probabilities(), q, rtol=1e-12)
    # n_e = round(0.25 * 4) = 1 draw explores t3: p = 0.75 q + 0.25 [0, 0, 0, 1]
    p = np.array([0.41711229946524064, 0.016042780748663103, 0.31684491978609625, 0.25])
    np.testing.assert_allclose(s.task_probabilities(), p, rtol=1e-12)
    batch = s.sample_tasks(2, np.random.default_rng(0))
    ids = [t.id for t in batch.tasks]
    assert ids[0] == "t3" and "t3" not in ids[1:]  # the exploration draw, then adaptive ones
    expected_u = {"t0": 1 / (4 * p[0]), "t1": 1 / (4 * p[1]), "t2": 1 / (4 * p[2]), "t3": 1.0}
    np.testing.assert_allclose(batch.weights, [expected_u[i] for i in ids], rtol=1e-12)
    # cells: t1 splits q1 between counting and ordering; t3 (unseen) logs no cell
    assert set(k for k in m if k.startswith("p/")) == {
        "p/list/counting", "p/list/ordering", "p/format/general"}  # fmt: skip
    assert m["p/list/counting"] == pytest.approx(q[0] + q[1] / 2)
    assert m["p/list/ordering"] == pytest.approx(q[1] / 2)
    assert m["p/format/general"] == pytest.approx(q[2])
    assert sum(v for k, v in m.items() if k.startswith("p/")) == pytest.approx(1.0)
    assert m["seen"] == 0.75 and m["variance/mean"] == pytest.approx(0.4375 / 3)
    assert m["zero_variance_groups"] == pytest.approx(1 / 3)


def test_ema_update_and_no_unseen_left_means_no_exploration():
    s, _ = _seeded()
    s.observe(_evidence(2, [s.tasks[0], s.tasks[3]], [[1, 1, 1, 1], [1, 0, np.nan, np.nan]]))
    assert s.estimates[0] == pytest.approx(0.5 * 0.25 + 0.5 * 0.0)  # EMA, ema = 0.5
    assert s.estimates[3] == pytest.approx(0.25)  # first observation sets it (2 defined)
    assert s.num_explore() == 0
    w = np.array([0.125, 0.0, 0.1875, 0.25]) + 0.01
    np.testing.assert_allclose(s.task_probabilities(), w / w.sum(), rtol=1e-12)
    assert s.groups.tolist() == [2, 1, 1, 1]


def test_empirical_frequencies_and_unbiased_importance_weights():
    s, _ = _seeded()
    rng = np.random.default_rng(1)
    n, counts, est = 4000, np.zeros(4), []
    f = np.array([3.0, -1.0, 0.5, 2.0])  # any per-task quantity
    for _ in range(n):
        b = s.sample_tasks(2, rng)
        idx = [int(t.id[1:]) for t in b.tasks]
        counts += np.bincount(idx, minlength=4)
        est.append(np.mean(b.weights * f[idx]))
    freq = counts / counts.sum()
    p = s.task_probabilities()
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / counts.sum()) + 1e-12)
    # HarnessRL §2.1: E[u f] = mean_i f_i (importance correction)
    assert np.mean(est) == pytest.approx(f.mean(), abs=4 * np.std(est) / np.sqrt(n))


def test_nothing_seen_draws_distinct_uniform_tasks_with_unit_weights():
    s = RewardVarianceSampler(_tasks(5), 3, seed=0)
    b = s.sample_tasks(1, None)
    assert len({t.id for t in b.tasks}) == 3
    np.testing.assert_array_equal(b.weights, np.ones(3))
    big = RewardVarianceSampler(_tasks(5), 7, seed=0).sample_tasks(1, None)
    assert {t.id for t in big.tasks} == {f"t{i}" for i in range(5)}  # all 5 + 2 uniform extras
    np.testing.assert_allclose(big.weights, np.ones(7))
    assert s.observe(_evidence(1, [], np.zeros((0, 4)))) == {"seen": 0.0}  # no p/ keys yet


def test_explore_share_takes_distinct_unseen_tasks_first():
    s = RewardVarianceSampler(_tasks(8), 4, explore_share=0.5)
    s.observe(_evidence(1, s.tasks[:2], [[0, 1], [0, 0]]))
    assert s.num_explore() == 2
    for step in range(20):
        ids = [t.id for t in s.sample_tasks(step, None).tasks]
        assert len(set(ids[:2])) == 2 and not set(ids[:2]) & {"t0", "t1"}
        assert set(ids[2:]) <= {"t0", "t1"}
    s.observe(_evidence(2, s.tasks[2:7], [[0, 1]] * 5))
    assert s.num_explore() == 1  # only t7 is left unseen
    p = s.task_probabilities()
    assert p[7] == pytest.approx(0.25) and p.sum() == pytest.approx(1.0)


def test_undefined_rewards_and_foreign_tasks_are_no_evidence():
    s = RewardVarianceSampler(_tasks(3), 2)
    other = _tasks(5)[4]
    rewards = [[np.nan] * 4, [1, np.nan, np.nan, np.nan], [0, 1, 0, 1]]
    m = s.observe(_evidence(1, [s.tasks[0], s.tasks[1], other], rewards))
    assert not s.seen().any() and s.groups.sum() == 0
    assert m == {"seen": 0.0, "zero_variance_groups": 0.0}  # t4's group counted, not stored


def test_state_dict_is_json_and_resume_is_exact():
    tasks = _tasks(9, [("a", ("x",)), ("a", ("y",)), ("b", ())] * 3)

    def play(s, steps):
        out = []
        for step in steps:
            b = s.sample_tasks(step, np.random.default_rng(step))
            rng = np.random.default_rng(100 + step)
            rewards = rng.random((len(b), 4)).round(1)
            out.append(([t.id for t in b.tasks], b.weights.tolist(), s.observe(_evidence(
                step, b.tasks, rewards))))  # fmt: skip
        return out

    full = play(RewardVarianceSampler(tasks, 3, seed=5, ema=0.3), range(1, 9))
    part = RewardVarianceSampler(tasks, 3, seed=5, ema=0.3)
    play(part, range(1, 5))
    state = json.loads(json.dumps(part.state_dict()))
    resumed = RewardVarianceSampler(tasks, 3, seed=5, ema=0.3)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(resumed.estimates, part.estimates)  # bitwise, NaN = unseen
    assert play(resumed, range(5, 9)) == full[4:]


def test_bad_state_and_options_are_named():
    s = RewardVarianceSampler(_tasks(4), 2)
    s.observe(_evidence(1, s.tasks[:1], [[0, 1]]))
    state = s.state_dict()
    with pytest.raises(ValueError, match="4 tasks / seed 0"):
        RewardVarianceSampler(_tasks(5), 2).load_state_dict(state)
    with pytest.raises(ValueError, match="unknown tasks"):
        RewardVarianceSampler(_tasks(4), 2).load_state_dict({**state, "estimates": {"zz": 0.1}})
    with pytest.raises(ValueError, match="estimate of 't0'"):
        RewardVarianceSampler(_tasks(4), 2).load_state_dict({**state, "estimates": {"t0": -1}})
    with pytest.raises(ValueError, match="floor must be > 0"):
        RewardVarianceSampler(_tasks(4), 2, floor=0.0)
    with pytest.raises(ValueError, match="explore_share"):
        RewardVarianceConfig(batch_size=2, explore_share=1.5)
    with pytest.raises(KeyError, match="group reward source 'oracle'"):
        RewardVarianceSampler(_tasks(4), 2, reward="oracle")
    assert SAMPLERS.get("reward_variance") is RewardVarianceSampler
    assert GROUP_REWARDS.names() == ["evidence", "task_verifier"]


def test_task_verifier_reward_is_the_domain_verifier():
    domain = builders.build_domain(arise.get_config("smoke"))
    tasks = domain.train[:3]
    rng = np.random.default_rng(0)
    responses = tuple(
        tuple(warmstart_example(t, rng, guided=bool(j % 2))[1] for j in range(4)) for t in tasks
    )
    ev = Evidence(1, tuple(tasks), (), responses, (), None, np.zeros((3, 4)), np.zeros((3, 4)))
    got = task_verifier_rewards(ev, domain.verify)
    want = [[float(constraints.verify(t, r)) for r in rs] for t, rs in zip(tasks, responses)]
    np.testing.assert_array_equal(got, want)
    ev.set_signal("task_verifier", 1.0 - got)  # the step's signal, when present, is what is read
    np.testing.assert_array_equal(task_verifier_rewards(ev), 1.0 - got)
    bad = Evidence(1, tuple(_tasks(1)), (), (("x",),), (), None, np.zeros((1, 1)), None)
    with pytest.raises(ValueError, match="no verifier for domain ''"):
        task_verifier_rewards(bad)


def test_arise_variance_variant_builds_observes_and_resumes():
    c = arise.get_config("smoke,sampler=variance")
    domain = builders.build_domain(c)
    b, j = int(c.rollout.tasks_per_step), int(c.rollout.samples_per_task)
    kw = arise.arise_controller_kwargs(c)
    assert kw["sampler"] == "reward_variance" and kw["sampler_options"]["reward"] == "task_verifier"

    def make():  # the launch path: the arise method's controllers
        (ctl,) = get_method("arise").controllers(c, domain)
        return ctl

    ctl = make()
    assert isinstance(ctl.sampler, RewardVarianceSampler)
    judge = ProgrammaticJudge()
    for step in range(1, 4):
        rng = np.random.default_rng(step)
        batch = ctl.sample_tasks(step, rng)
        responses = [
            [warmstart_example(ctl.base_task(t), rng, guided=bool(k % 2))[1] for k in range(j)]
            for t in batch.tasks
        ]
        flat = judge.score([JudgeItem(t, r) for t, rs in zip(batch.tasks, responses) for r in rs])
        groups = tuple(tuple(tuple(v) for v in flat[g * j : (g + 1) * j]) for g in range(b))
        nan = np.full((b, j), np.nan)  # the pool's rubric reward: undefined, as with an empty pool
        ev = Evidence(step, batch.tasks, (), tuple(map(tuple, responses)), groups, None, nan, nan)
        # the reward stage's task_verifier signal (the domain's verifier), read by the sampler
        ev.set_signal("task_verifier", task_verifier_rewards(ev, domain.verify))
        m = ctl.observe(ev)
        probs = {k: v for k, v in m.items() if k.startswith("sampler/p/")}
        assert probs and sum(probs.values()) == pytest.approx(1.0)  # task rewards were scored
    assert m["sampler/seen"] == ctl.sampler.seen().mean() > 0
    assert np.nanmax(ctl.sampler.estimates) > 0  # guided and unguided rollouts disagree somewhere
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    a, r = ctl.sample_tasks(4, np.random.default_rng(9)), resumed.sample_tasks(
        4, np.random.default_rng(9))  # fmt: skip
    assert [t.id for t in a.tasks] == [t.id for t in r.tasks]
    np.testing.assert_array_equal(a.weights, r.weights)


def test_grpo_builder_accepts_reward_variance():
    c = grpo.get_config("smoke")
    c.controllers.sampler = "reward_variance"
    domain = builders.build_domain(c)
    (s,) = grpo_controllers(c, domain)
    assert isinstance(s, RewardVarianceSampler) and s.config.reward == "evidence"
    assert s.config.batch_size == c.rollout.tasks_per_step
