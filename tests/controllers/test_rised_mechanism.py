"""RISED as its paper describes it, each piece on hand-made inputs and on the scripted policy
(rubric_rl/methods/rised/rised_check.py: the real controllers, responses whose per-constraint
success is scripted): outcome-conditioned tags, SD only for groups with a success, teacher hints
ranked by success/failure contrast, presence-count profiles, untagged groups never preferred to
tagged ones, Var-Target that keeps the groups with a signal, "w/o selection" as a random k of the
same 2k; and the earlier rule of each under its flag."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import rised as rised_config
from rubric_rl.envs.constraint_behaviours import constraint_behaviours
from rubric_rl.envs.constraint_domain import task_bank, verify
from rubric_rl.methods.rised import rised_selection as sel
from rubric_rl.methods.rised.rised import RisedConfig, RisedController
from rubric_rl.methods.rised.rised_check import PREVIOUS_FLAGS, rised_figures
from rubric_rl.methods.rised.rised_tagger import ProgrammaticTagger, warmup_vocabulary
from rubric_rl.methods.rised.rised_tags import Tags, group_profile, profile
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.rubrics.types import Task
from tests.controllers.test_rised import VOCAB, task


class JsonTagger:
    """Tags written in each response as JSON: {"counts": {...}, "withheld": {...}}."""

    def tag_batch(self, tasks, responses, rewards=None, *, step=None):
        return [Tags(**json.loads(r)) for r in responses]


def _task(i: int, env: str = "e") -> Task:
    return task(i, env)


def _rollouts(step, spec) -> Rollouts:
    """spec: [(task, [(reward, counts, withheld), ...]), ...]"""
    groups = []
    for t, rows in spec:
        trajs = [
            Trajectory((1,), (-0.1,), "stop", 0, json.dumps({"counts": c, "withheld": w}),
                       reward=float(rw))
            for rw, c, w in rows
        ]  # fmt: skip
        groups.append(Group(t, trajectories=trajs))
    return Rollouts(step, groups)


def _ctl(**kw) -> RisedController:
    return RisedController(
        RisedConfig(**{"k": 0, "selection": "none", "retag_every": 0, **kw}), VOCAB, JsonTagger()
    )


# --- the tagger ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    vocab = warmup_vocabulary(constraint_behaviours())
    task = next(t for t in task_bank("train", 60) if t.task_type == "list")
    return vocab, task


def test_outcome_conditioned_tags_positives_from_successes_negatives_from_failures(embedded):
    vocab, task = embedded
    ref = task.reference_answer
    assert verify(task, ref) == 1.0
    b = constraint_behaviours()
    cond = ProgrammaticTagger(b, vocab)
    plain = ProgrammaticTagger(b, vocab, outcome_conditioned=False)
    pol = {r: vocab.entry(r).polarity for r in vocab.ids}
    good = cond.tag(task, ref, 1.0)
    assert good.counts and {pol[r] for r in good.counts} == {"positive"}
    assert good.withheld == {}
    # A failure (an empty answer breaks every stated check): negatives only; a failure that
    # follows some checks keeps them withheld, never in its profile.
    words = ref.split()
    half = " ".join(words[: len(words) // 2])
    reward = float(verify(task, half))
    assert reward < 0.5
    bad, bad_plain = cond.tag(task, half, reward), plain.tag(task, half, reward)
    assert {pol[r] for r in bad.counts} == {"negative"}
    assert dict(bad.counts) | dict(bad.withheld) == dict(bad_plain.counts)
    assert bad.withheld and {pol[r] for r in bad.withheld} == {"positive"}
    assert not profile(bad, vocab)[np.asarray(vocab.positive_mask, bool)].any()
    # Without a reward nothing can be conditioned: every rubric kept.
    assert cond.tag(task, half) == plain.tag(task, half)
    with pytest.raises(ValueError, match="attributed .counts. or withheld"):
        Tags({"p_a": 1}, withheld={"p_a": 1})


# --- teacher hints -------------------------------------------------------------------------------


def test_hints_rank_by_success_failure_contrast_then_rarity_and_sd_needs_a_success():
    ctl = _ctl(top_n=2)
    # Group 0: two successes, two failures. p_a in every rollout (contrast 0); p_b in both
    # successes and one failure (0.5); p_c in both successes only (1.0); p_d in one success only
    # (0.5) but rarer across the step than p_b.
    ok = [
        (1, {"p_a": 1, "p_b": 1, "p_c": 1, "p_d": 1}, {}),
        (1, {"p_a": 1, "p_b": 1, "p_c": 1}, {}),
    ]
    bad = [(0, {"n_x": 2}, {"p_a": 1, "p_b": 1}), (0, {"n_y": 1}, {"p_a": 1})]
    # Group 1: failures only (no positive rubric): no teacher prompt at all.
    r = _rollouts(1, [(_task(0), ok + bad), (_task(1), [(0, {"n_x": 1}, {"p_b": 1})] * 2)])
    ctl.observe(r)
    assert ctl.group_hints(0) == ["p_c", "p_d"]
    ctx = ctl.teacher_contexts(r)
    # A success: its own top-2 ∪ the group's; a failure (no positive of its own): the group's.
    assert ctx[0][0][-1]["content"].endswith("- do c\n- do d")
    assert ctx[0][2][-1]["content"].endswith("- do c\n- do d")
    assert ctx[1] == [None, None] and ctl.group_hints(1) == []
    # The count ranking (previous): count, ties by vocabulary order.
    old = _ctl(top_n=2, hint_rank="count")
    old.observe(r)
    assert old.group_hints(0) == ["p_a", "p_b"]


def test_hint_ties_are_broken_at_random_never_by_vocabulary_order():
    orders = set()
    for seed in range(12):
        ctl = _ctl(top_n=2, seed=seed)
        r = _rollouts(1, [(_task(0), [(1, {"p_a": 1, "p_b": 1}, {}), (0, {"n_x": 1}, {})])])
        ctl.observe(r)
        orders.add(tuple(ctl.group_hints(0)))
        again = _ctl(top_n=2, seed=seed)
        again.observe(r)
        assert again.group_hints(0) == list(orders and ctl.group_hints(0))  # deterministic
    assert orders == {("p_a", "p_b"), ("p_b", "p_a")}


# --- profiles, anti-patterns and untagged groups -------------------------------------------------


def test_presence_and_log_profiles_and_the_anti_pattern_trigger_on_presence():
    t = Tags({"p_a": 1, "n_x": 5})
    a, x = VOCAB.index("p_a"), VOCAB.index("n_x")
    want = np.zeros(len(VOCAB))
    want[[a, x]] = 1.0
    assert profile(t, VOCAB, "presence").tolist() == want.tolist()
    want[x] = 1 + np.log(5)
    assert profile(t, VOCAB, "log") == pytest.approx(want)
    want[x] = 5
    assert profile(t, VOCAB, "raw").tolist() == want.tolist()
    assert group_profile([t, Tags.failure("x"), t], VOCAB, "presence")[x] == 2.0
    # Two positives and one negative counted 5 times: raw counts fire the trigger (5 > 2),
    # presence counts do not (1 < 2).
    spec = [(_task(0, "ea"), [(0, {"n_x": 5, "p_a": 1}, {}), (1, {"p_b": 1}, {})])]
    raw, pres = _ctl(profile_counts="raw"), _ctl()
    raw.observe(_rollouts(1, spec))
    pres.observe(_rollouts(1, spec))
    assert raw.anti == {"ea": ["n_x"]} and pres.anti == {}
    # Outcome-conditioned tags: a failure's positives are withheld. "detected" counts what the
    # rollouts showed (3 positives, 2 of them withheld, against 2 negatives: no block),
    # "attributed" the attributed tags only (1 positive against 2 negatives: a block).
    spec = [
        (_task(0, "ea"), [(0, {"n_x": 1, "n_y": 1}, {"p_a": 1, "p_b": 1}), (1, {"p_c": 1}, {})])
    ]
    detected, attributed = _ctl(), _ctl(anti_counts="attributed")
    detected.observe(_rollouts(1, spec))
    attributed.observe(_rollouts(1, spec))
    assert detected.anti == {} and attributed.anti == {"ea": ["n_x", "n_y"]}


def test_an_all_zero_profile_is_never_picked_over_a_tagged_one():
    rng = np.random.default_rng(0)
    envs = [e for e in "abc" for _ in range(10)]
    picked_old = 0
    for _ in range(60):
        prof = rng.poisson(rng.gamma(0.3, 0.5, 20) * 8, (30, 20)).astype(float)
        prof[[0, 10, 20]] = 0.0
        prof[[i for i in range(30) if i % 10 and not prof[i].any()], 0] = 1.0
        quotas = sel.env_quotas(envs, 15)
        new = sel.greedy_picks(prof, envs, quotas, batch="unit", untagged="last")
        assert not {0, 10, 20} & set(new.order)
        assert (new.untagged_candidates, new.untagged_picked) == (3, 0)
        old = sel.select_groups(prof, envs, quotas)
        picked_old += len({0, 10, 20} & set(old))
    assert picked_old > 0  # the previous scoring (0 for an empty profile) did prefer them
    # An environment with only untagged candidates left still fills its quota.
    p = np.array([[0.0, 0], [1, 0], [0, 0]])
    assert sorted(sel.select_groups(p, ["a"] * 3, {"a": 2}, untagged="last")) == [0, 1]
    # "median": the untagged group Z scores the median of the free tagged candidates. Picks:
    # B (best aligned); then C (0.38) over Z (median of A −0.12 and C 0.38) and A; then A ties
    # Z at A's score and wins on index. "score0" takes Z third (0 > A's −0.12).
    p = np.array([[1.0, 0], [1, 0.1], [0, 1], [0, 0]])
    med = sel.greedy_picks(p, ["a"] * 4, {"a": 3}, batch="unit", untagged="median")
    assert med.order == (1, 2, 0)
    u = p[:3] / np.linalg.norm(p[:3], axis=1, keepdims=True)
    total = u.sum(0)
    a_third = u[0] @ total / np.linalg.norm(total) - u[0] @ u[1]
    assert med.score[2] == pytest.approx(a_third) and a_third < 0
    assert sel.select_groups(p, ["a"] * 4, {"a": 3}, batch="unit") == [1, 2, 3]
    assert sel.select_groups(p, ["a"] * 4, {"a": 3}, batch="unit", untagged="last") == [1, 2, 0]
    with pytest.raises(ValueError, match="untagged must be one of"):
        sel.select_groups(p, ["a"] * 4, {"a": 1}, untagged="nope")


def test_unit_batch_profile_weighs_every_group_the_same():
    p = np.array([[100.0, 0], [0, 1], [0, 1]])
    u = p / np.linalg.norm(p, axis=1, keepdims=True)
    got = sel.greedy_picks(p, ["a"] * 3, {"a": 1}, batch="unit")
    want = u @ u.sum(0) / np.linalg.norm(u.sum(0))
    assert got.alignment[0] == pytest.approx(want.max()) and got.order == (1,)
    assert sel.greedy_picks(p, ["a"] * 3, {"a": 1}, batch="sum").order == (0,)


# --- Var-Target and w/o selection ----------------------------------------------------------------


def _repro():
    rewards = np.zeros((32, 8))
    rewards[27:30, 0] = 1.0  # 3 groups at 1/8
    rewards[30:32, :2] = 1.0  # 2 groups at 2/8
    return rewards


def test_var_target_keeps_the_five_signal_groups_of_the_repro():
    rewards, envs = _repro(), ["a"] * 32
    for seed in range(20):
        rng = np.random.default_rng(seed)
        kept = sel.var_target(rewards, envs, None, 16, rng)
        assert len(kept) == 16 and set(range(27, 32)) <= set(kept)
    assert set(range(27, 32)) <= set(sel.var_target(rewards, envs, None, 16, rng, "max"))
    # The previous target (2× the pool mean) keeps none of them.
    old = sel.var_target(rewards, envs, None, 16, rng, "pool_multiple")
    assert not set(range(27, 32)) & set(old)


def test_proportional_draw_follows_the_variances():
    # Two groups with a signal (variances 7/64 and 12/64) and k = 1: P(each) ∝ its variance.
    rewards = np.zeros((4, 8))
    rewards[1, 0] = 1.0
    rewards[3, :2] = 1.0
    rng = np.random.default_rng(0)
    draws = [sel.variance_proportional(rewards, ["a"] * 4, None, 1, rng)[0] for _ in range(4000)]
    assert set(draws) == {1, 3}
    assert np.mean(np.array(draws) == 3) == pytest.approx(12 / 19, abs=0.03)
    # Per environment with quotas: each environment's quota, signal first.
    envs = ["a", "a", "b", "b"]
    kept = sel.variance_proportional(rewards, envs, {"a": 1, "b": 2}, 3, rng)
    assert kept == [1, 2, 3]


def test_random_keep_is_uniform_inside_the_quotas():
    envs = ["a"] * 4 + ["b"] * 2
    rng = np.random.default_rng(0)
    counts = np.zeros(6)
    for _ in range(3000):
        kept = sel.random_keep(envs, {"a": 2, "b": 1}, 3, rng)
        assert sum(i < 4 for i in kept) == 2 and len(kept) == 3
        counts[kept] += 1
    assert counts / 3000 == pytest.approx([0.5] * 4 + [0.5] * 2, abs=0.04)


def test_no_select_arm_draws_k_of_the_same_2k():
    c = rised_config.get_config("no_select")
    assert (c.rised.selection, c.rollout.tasks_per_step, c.rollout.train_groups) == (
        "random", 32, 16,
    )  # fmt: skip
    old = rised_config.get_config("no_select_k")
    assert (old.rised.selection, old.rollout.tasks_per_step) == ("none", 16)
    assert rised_config.get_config("var_target").rised.variance_targeting == "proportional"


# --- on the scripted policy ----------------------------------------------------------------------


def _small(**rised):
    c = rised_config.get_config()
    c.unlock()
    c.rollout.update(tasks_per_step=16, train_groups=8)
    c.domain.update(n_train=256)
    c.rised.update(**rised)
    c.lock()
    return c


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    d = tmp_path_factory.mktemp("rised")
    return {
        "new": rised_figures(_small(), 10, str(d / "new")),
        "old": rised_figures(_small(**PREVIOUS_FLAGS), 10, str(d / "old")),
    }


def test_scripted_sd_reach_equals_the_share_of_groups_with_a_success(figures):
    new, old = figures["new"], figures["old"]
    assert new["reach_matches_success"] == 1.0
    assert new["sd_reach"] == new["success_share"] < 1.0
    assert new["failed_with_positive"] == 0.0
    # Unconditioned tags: SD reaches every group, successes or not.
    assert old["sd_reach"] == 1.0 > old["success_share"] and old["failed_with_positive"] > 0.5


def test_scripted_hints_name_the_constraints_that_separate_successes_from_failures(figures):
    new, old = figures["new"], figures["old"]
    assert new["hint_groups"] >= 12
    assert new["hint_precision_at_available"] >= 0.95
    assert new["hint_top1_precision"] >= 0.7
    assert old["hint_precision_at_available"] <= 0.7 and old["hint_top1_precision"] <= 0.3


def test_the_controller_keeps_the_repro_signal_groups_and_never_an_untagged_group():
    """Through RisedController.observe/select: Var-Target on the repro pool keeps the 5 groups
    with a signal; the profile selection leaves out a group whose taggings all failed."""
    rewards = _repro()
    spec = [(_task(i), [(rw, {"p_a": 1} if rw else {"n_x": 1}, {}) for rw in row])
            for i, row in enumerate(rewards)]  # fmt: skip
    vt = _ctl(selection="variance_targeted", k=16)
    vt.observe(_rollouts(1, spec))
    assert set(range(27, 32)) <= set(np.flatnonzero(vt.select(_rollouts(1, spec))))
    old = _ctl(selection="variance_targeted", k=16, variance_targeting="pool_multiple")
    old.observe(_rollouts(1, spec))
    assert not set(range(27, 32)) & set(np.flatnonzero(old.select(_rollouts(1, spec))))

    class FailingFirstGroup(JsonTagger):
        def tag_batch(self, tasks, responses, rewards=None, *, step=None):
            out = super().tag_batch(tasks, responses, rewards, step=step)
            return [Tags.failure("judge down") if t.id == "t0" else x
                    for t, x in zip(tasks, out, strict=True)]  # fmt: skip

    rng = np.random.default_rng(0)
    spec = [(_task(i), [(0, {"p_a": 1, "n_x": 1, "n_y": int(rng.integers(1, 3))}, {})] * 2)
            for i in range(6)]  # fmt: skip
    for untagged, picked in (("last", False), ("score0", True)):
        cfg = RisedConfig(k=5, selection="profile", untagged=untagged)
        ctl = RisedController(cfg, VOCAB, FailingFirstGroup())
        m = ctl.observe(_rollouts(1, spec))
        assert bool(ctl.select(_rollouts(1, spec))[0]) is picked
        assert m["select/untagged_candidates"] == 1.0
        assert m["select/untagged_selected"] == float(picked)
