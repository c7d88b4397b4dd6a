"""RISED's selection (rubric_rl/methods/rised/rised_selection.py) and the controllers around it
(rised_selectors.py): hand-checked greedy picks, a plain-loop reference on random profiles, the
variance selectors on hand-made rewards, the quota sampler, and the selector in the scripted
check's real pipeline."""

import collections
import json
import math

import numpy as np
import pytest

from configs import grpo
from rubric_rl.checks.controller_check import ScriptedPolicy, run_check, scripted_run
from rubric_rl.config import builders
from rubric_rl.controllers.sampling import SAMPLERS
from rubric_rl.loop.evaluation import env_of
from rubric_rl.methods.grpo import grpo_controllers
from rubric_rl.methods.rised.rised_selection import (
    cosine,
    env_quotas,
    greedy_picks,
    group_variances,
    select_groups,
    selection_stats,
    top_variance,
    variance_target,
    variance_targeted,
)
from rubric_rl.methods.rised.rised_selectors import (
    EnvQuotaSampler,
    VarianceSelectConfig,
    VarianceSelector,
)
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.types import Criterion, Rubric, Task

RUBRIC = Rubric((Criterion("c", "is short"),))

# ------------------------------------------------------------------------------ cosine, quotas


def test_cosine_edge_cases():
    assert cosine([1, 0], [0, 1]) == 0.0
    assert cosine([2, 0], [3, 0]) == pytest.approx(1.0)
    assert cosine([1, 1], [-1, -1]) == pytest.approx(-1.0)
    assert cosine([1, 1, 0], [1, 0, 0]) == pytest.approx(1 / math.sqrt(2))
    assert cosine([0, 0, 0], [1, 2, 3]) == 0.0  # an empty profile scores 0
    assert cosine([1, 2, 3], [0, 0, 0]) == 0.0
    assert cosine([0, 0], [0, 0]) == 0.0
    with pytest.raises(ValueError, match="one length"):
        cosine([1, 0], [1, 0, 0])


def test_env_quotas_largest_remainder_ties_by_name():
    assert env_quotas(["b", "a", "c", "a"], 6) == {"a": 2, "b": 2, "c": 2}
    # 7 / 3 = 2.33 each: the one left over goes to the first name of the tie.
    assert env_quotas(["c", "b", "a"], 7) == {"a": 3, "b": 2, "c": 2}
    assert env_quotas(["c", "b", "a"], 8) == {"a": 3, "b": 3, "c": 2}
    # weights 5:3:1 of 4 = 2.22, 1.33, 0.44: floors 2, 1, 0; remainders .22 .33 .44 -> c then b
    assert env_quotas(["a", "b", "c"], 4, {"a": 5, "b": 3, "c": 1}) == {"a": 2, "b": 1, "c": 1}
    assert env_quotas(["a", "b"], 3, {"a": 0, "b": 1}) == {"a": 0, "b": 3}
    assert env_quotas(["a", "b", "c"], 1) == {"a": 1, "b": 0, "c": 0}
    # exact arithmetic: 10 * 0.1 / 0.3 is not 3.333.. in floats, the split is still 4/3/3
    assert env_quotas(["a", "b", "c"], 10, {"a": 0.1, "b": 0.1, "c": 0.1}) == {
        "a": 4, "b": 3, "c": 3}  # fmt: skip
    with pytest.raises(ValueError, match=r"missing \['c'\], unknown \['z'\]"):
        env_quotas(["a", "c"], 2, {"a": 1, "z": 1})
    with pytest.raises(ValueError, match="environment 'a'"):
        env_quotas(["a"], 2, {"a": -1})


# ------------------------------------------------------------------------------ greedy picks

# Three environments, V = 3 rubrics. P = Σ p_g = [4, 3, 2], |P| = √29 = 5.385.
#   g  env  p_g        cos(p_g, P)
#   0  a    [1, 0, 0]  4 / 5.385        = 0.7428
#   1  a    [1, 1, 0]  7 / (√2 · 5.385) = 0.9191
#   2  b    [1, 0, 0]  0.7428
#   3  b    [0, 1, 0]  3 / 5.385        = 0.5571
#   4  c    [0, 0, 1]  2 / 5.385        = 0.3714
#   5  c    [1, 1, 1]  9 / (√3 · 5.385) = 0.9649
PROFILES = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], float)
ENVS = ["a", "a", "b", "b", "c", "c"]


def test_greedy_picks_by_hand_and_the_overlap_penalty_changes_a_pick():
    # beta = 1, quotas 1 each; environments in name order a, b, c.
    # a: S empty, no penalty -> g1 (0.9191 > 0.7428).
    # b: cos(g2, g1) = cos(g3, g1) = 1/√2 = 0.7071: g2 0.7428 − 0.7071 = 0.0357,
    #    g3 0.5571 − 0.7071 = −0.1500 -> g2.
    # c: g4 is orthogonal to g1 and g2: 0.3714 − 0 = 0.3714; g5: max(cos(g5, g1) = 2/√6 = 0.8165,
    #    cos(g5, g2) = 1/√3 = 0.5774) -> 0.9649 − 0.8165 = 0.1484 -> g4.
    quotas = {"a": 1, "b": 1, "c": 1}
    picks = greedy_picks(PROFILES, ENVS, quotas, beta=1.0)
    assert picks.order == (1, 2, 4) and picks.envs == ("a", "b", "c")
    np.testing.assert_allclose(picks.alignment, [0.9191, 0.7428, 0.3714], atol=1e-4)
    np.testing.assert_allclose(picks.overlap, [0.0, 0.7071, 0.0], atol=1e-4)
    np.testing.assert_allclose(picks.score, [0.9191, 0.0357, 0.3714], atol=1e-4)
    assert select_groups(PROFILES, ENVS, quotas) == [1, 2, 4]
    # beta = 0: alignment alone, c takes g5 (0.9649 > 0.3714).
    assert select_groups(PROFILES, ENVS, quotas, beta=0.0) == [1, 2, 5]


def test_round_robin_cycles_while_any_environment_has_quota():
    # a: 2, b: 1, c: 2 -> visits a, b, c, a, c. Round 1 as above (g1, g2, g4); round 2: a has
    # only g0 left; c only g5.
    picks = greedy_picks(PROFILES, ENVS, {"a": 2, "b": 1, "c": 2})
    assert picks.order == (1, 2, 4, 0, 5) and picks.envs == ("a", "b", "c", "a", "c")
    # g0 = g2's profile: overlap 1 -> 0.7428 − 1; g5's max overlap is still cos(g5, g1) = 0.8165
    # (cos(g5, g0) = cos(g5, g4) = 0.5774).
    np.testing.assert_allclose(picks.score[3:], [0.7428 - 1.0, 0.9649 - 0.8165], atol=1e-4)
    # An environment with a zero quota is never visited.
    assert select_groups(PROFILES, ENVS, {"a": 1, "b": 0, "c": 1}) == [1, 4]


def test_a_pick_in_one_environment_changes_the_scores_in_another():
    # b's choice with and without a's pick before it (S spans environments).
    profiles = np.array([[0, 1, 0], [1, 0, 0], [0, 1, 0]], float)
    # P = [1, 2, 0]: align g1 = 1/√5 = 0.447, g2 = 2/√5 = 0.894; after a takes g0 = [0, 1, 0],
    # g2's overlap is 1 -> −0.106, g1's is 0 -> 0.447: b takes g1.
    assert select_groups(profiles, ["a", "b", "b"], {"a": 1, "b": 1}) == [0, 1]
    assert select_groups(profiles, ["a", "b", "b"], {"a": 0, "b": 1}) == [2]


def test_ties_go_to_the_lowest_index():
    profiles = np.array([[0, 1], [1, 1], [1, 1], [1, 1]], float)
    assert select_groups(profiles, ["a", "b", "b", "b"], {"b": 2}) == [1, 2]
    assert select_groups(profiles[::-1], ["b", "b", "b", "a"], {"b": 1}) == [0]
    zeros = np.zeros((4, 3))  # P = 0: every score 0
    assert select_groups(zeros, ["a", "b", "a", "b"], {"a": 2, "b": 2}) == [0, 1, 2, 3]


def test_empty_profiles_score_zero():
    # g0 = [0, 0] (untagged group) vs g1 = [1, 0] in b after a took g2 = [1, 0]:
    # g1: cos(g1, P) = 1 (P = [2, 0]) − 1 · 1 = 0.0 ties g0's 0 -> g0 (lower index);
    # with beta = 2, g1 scores −1 < 0.
    profiles = np.array([[0, 0], [1, 0], [1, 0]], float)
    picks = greedy_picks(profiles, ["b", "b", "a"], {"a": 1, "b": 1}, beta=2.0)
    assert picks.order == (2, 0) and picks.score[1] == 0.0
    assert picks.alignment[1] == 0.0 and picks.overlap[1] == 0.0
    assert select_groups(profiles, ["b", "b", "a"], {"a": 1, "b": 1}, beta=0.5) == [2, 1]


def test_mean_and_max_overlap_pick_differently():
    # a and b have one candidate each: s1 = [2, 0, 0], s2 = [0, 2, 0]. c chooses between
    # x = [3, 0, 1] and y = [1, 1, 1]. P = [6, 3, 2], |P| = 7.
    #   cos(x, P) = 20 / (√10 · 7) = 0.9035; cos(x, s1) = 3/√10 = 0.9487, cos(x, s2) = 0
    #   cos(y, P) = 11 / (√3 · 7)  = 0.9073; cos(y, s1) = cos(y, s2) = 1/√3 = 0.5774
    # max:  x 0.9035 − 0.9487 = −0.0452, y 0.9073 − 0.5774 = 0.3299 -> y (index 3)
    # mean: x 0.9035 − 0.4743 =  0.4292, y 0.3299                -> x (index 2)
    profiles = np.array([[2, 0, 0], [0, 2, 0], [3, 0, 1], [1, 1, 1]], float)
    envs, quotas = ["a", "b", "c", "c"], {"a": 1, "b": 1, "c": 1}
    assert select_groups(profiles, envs, quotas, overlap="max") == [0, 1, 3]
    mean = greedy_picks(profiles, envs, quotas, overlap="mean")
    assert mean.order == (0, 1, 2)
    assert mean.score[2] == pytest.approx(0.9035 - 0.4743, abs=1e-4)
    with pytest.raises(ValueError, match="overlap"):
        select_groups(profiles, envs, quotas, overlap="min")


def test_quota_errors_name_the_environment():
    with pytest.raises(ValueError, match="environment 'b' has a quota of 3 but only 2"):
        select_groups(PROFILES, ENVS, {"a": 1, "b": 3})
    with pytest.raises(ValueError, match="environment 'z' has a quota of 1 but no candidate"):
        select_groups(PROFILES, ENVS, {"a": 1, "z": 1})
    with pytest.raises(ValueError, match="environment 'a'.*>= 0"):
        select_groups(PROFILES, ENVS, {"a": -1})
    with pytest.raises(ValueError, match="G = len"):
        select_groups(PROFILES[:5], ENVS, {"a": 1})
    with pytest.raises(ValueError, match="environment 'c' has a quota of 3 but only 2"):
        top_variance(np.zeros((6, 2)), ENVS, {"c": 3}, 3)


def _reference_picks(profiles, envs, quotas, beta, overlap):
    """The seed's rule written as plain loops over ``cosine``."""
    total = profiles.sum(axis=0)
    left = {e: quotas[e] for e in sorted(quotas)}
    chosen: list[int] = []
    while any(left.values()):
        for e in sorted(left):
            if not left[e]:
                continue
            best, best_score = None, -np.inf
            for g in range(len(profiles)):
                if envs[g] != e or g in chosen:
                    continue
                sims = [cosine(profiles[g], profiles[s]) for s in chosen]
                pen = 0.0 if not sims else (max(sims) if overlap == "max" else np.mean(sims))
                score = cosine(profiles[g], total) - beta * pen
                if score > best_score + 1e-12:  # strictly better: ties stay at the lower index
                    best, best_score = g, score
            chosen.append(best)
            left[e] -= 1
    return chosen


@pytest.mark.parametrize("overlap", ["max", "mean"])
def test_greedy_picks_match_a_plain_loop_reference(overlap):
    rng = np.random.default_rng(0)
    for trial in range(20):
        g, v = int(rng.integers(6, 30)), int(rng.integers(2, 12))
        # rubric counts: sparse non-negative integers, some groups untagged
        profiles = rng.poisson(0.7, (g, v)).astype(float) * (rng.random((g, 1)) > 0.15)
        envs = [str(e) for e in rng.choice(["x", "y", "z"], size=g)]
        counts = collections.Counter(envs)
        quotas = {e: int(rng.integers(0, n + 1)) for e, n in counts.items()}
        beta = float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        got = select_groups(profiles, envs, quotas, beta, overlap)
        assert got == _reference_picks(profiles, envs, quotas, beta, overlap), trial
        assert len(got) == len(set(got)) == sum(quotas.values())
        assert all(collections.Counter(envs[i] for i in got)[e] == q for e, q in quotas.items())


# ------------------------------------------------------------------------------ reward variance

NAN = np.nan
# g  env  rewards              defined  variance
# 0  a    [1, 0, 1, 0]          4       0.25
# 1  a    [1, 1, 1, 1]          4       0
# 2  a    [1, 0, 0, 0]          4       0.1875   (mean 1/4: (9/16 + 3/16) / 4)
# 3  b    [1, NaN, 0, NaN]      2       0.25
# 4  b    [1, NaN, NaN, NaN]    1       0        (fewer than two defined)
# 5  b    [0, 0, 1, NaN]        3       2/9      (mean 1/3: (1/9 + 1/9 + 4/9) / 3)
REWARDS = np.array(
    [[1, 0, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, NAN, 0, NAN], [1, NAN, NAN, NAN], [0, 0, 1, NAN]]
)
R_ENVS = ["a", "a", "a", "b", "b", "b"]
VARIANCES = [0.25, 0.0, 0.1875, 0.25, 0.0, 2 / 9]


def test_group_variances_by_hand():
    np.testing.assert_allclose(group_variances(REWARDS), VARIANCES, rtol=1e-12)
    assert group_variances(np.full((2, 3), NAN)).tolist() == [0.0, 0.0]


def test_top_variance_global_per_env_and_ties():
    assert top_variance(REWARDS, R_ENVS, None, 3) == [0, 3, 5]
    assert top_variance(REWARDS, R_ENVS, {"a": 2, "b": 1}, 3) == [0, 2, 3]
    # k = 5: g1 and g4 (both 0) tie for the last place -> the lower index without rng
    assert top_variance(REWARDS, R_ENVS, None, 5) == [0, 1, 2, 3, 5]
    # k = 1: g0 and g3 tie at 0.25; with a generator either may win, the same for one seed
    assert top_variance(REWARDS, R_ENVS, None, 1) == [0]
    seen = {tuple(top_variance(REWARDS, R_ENVS, None, 1, np.random.default_rng(s))) for s in
            range(40)}  # fmt: skip
    assert seen == {(0,), (3,)}
    a = top_variance(REWARDS, R_ENVS, None, 5, np.random.default_rng(7))
    assert a == top_variance(REWARDS, R_ENVS, None, 5, np.random.default_rng(7))
    assert set(a) >= {0, 2, 3, 5} and set(a) - {0, 2, 3, 5} <= {1, 4} and len(a) == 5
    with pytest.raises(ValueError, match="sum to 2, not k = 3"):
        top_variance(REWARDS, R_ENVS, {"a": 1, "b": 1}, 3)
    with pytest.raises(ValueError, match=r"k must be in \[0, 6\]"):
        top_variance(REWARDS, R_ENVS, None, 7)


def test_variance_targeted_default_target_and_a_given_one():
    pool_mean = np.mean(VARIANCES)  # 0.15162
    assert variance_target(REWARDS) == pytest.approx(2 * pool_mean)
    # target 0.30324: |v − t| = .053 .303 .116 .053 .303 .081 -> g0, g3, g5
    assert variance_targeted(REWARDS, R_ENVS, None, 3) == [0, 3, 5]
    # target 0.2: .05 .2 .0125 .05 .2 .0222 -> g2, g5 (top_variance keeps g0, g3)
    assert variance_targeted(REWARDS, R_ENVS, None, 2, target=0.2) == [2, 5]
    assert top_variance(REWARDS, R_ENVS, None, 2) == [0, 3]
    # per environment, target 0.2: a -> g2; b -> g5
    assert variance_targeted(REWARDS, R_ENVS, {"a": 1, "b": 1}, 2, target=0.2) == [2, 5]
    # multiple 0: the target is 0, the zero-variance groups come first (tie g1 / g4 by index)
    assert variance_targeted(REWARDS, R_ENVS, None, 1, multiple=0.0) == [1]
    seen = {tuple(variance_targeted(REWARDS, R_ENVS, None, 1, multiple=0.0,
                                    rng=np.random.default_rng(s))) for s in range(40)}  # fmt: skip
    assert seen == {(1,), (4,)}


def test_selection_stats_by_hand():
    keep = np.array([True, False, True, False, False, True])
    s = selection_stats(REWARDS, keep)
    pool = (0.25 + 0 + 0.1875 + 0.25 + 0 + 2 / 9) / 6
    sel = (0.25 + 0.1875 + 2 / 9) / 3
    assert s == pytest.approx({
        "candidates/zero_variance_frac": 2 / 6,
        "candidates/variance_mean": pool,
        "selected/zero_variance_frac": 0.0,
        "selected/variance_mean": sel,
        "selected/variance_ratio": sel / pool,
    })  # fmt: skip
    none = selection_stats(REWARDS, np.zeros(6, bool))
    assert set(none) == {"candidates/zero_variance_frac", "candidates/variance_mean"}
    flat = selection_stats(np.ones((3, 4)), np.array([True, False, False]))
    assert flat["selected/zero_variance_frac"] == 1.0 and "selected/variance_ratio" not in flat
    with pytest.raises(ValueError, match=r"\[6\] bool"):
        selection_stats(REWARDS, np.ones(6))


def test_top_k_of_2k_reaches_twice_the_pool_mean_when_most_groups_have_no_variance():
    # The seed's figures: 62.9 % zero-variance candidates; keeping 64 of 128 by top variance
    # keeps every non-zero group, so the selected mean is exactly 2x the pool mean.
    rng = np.random.default_rng(3)
    p = np.where(rng.random(128) < 0.629, rng.choice([0.0, 1.0], 128), rng.uniform(0.1, 0.9, 128))
    rewards = (rng.random((128, 8)) < p[:, None]).astype(float)
    keep = np.zeros(128, bool)
    keep[top_variance(rewards, ["e"] * 128, None, 64, rng)] = True
    s = selection_stats(rewards, keep)
    assert s["candidates/zero_variance_frac"] >= 0.5
    assert s["selected/variance_ratio"] == pytest.approx(2.0)


# ------------------------------------------------------------------------------ controllers


def _tasks(envs):
    return [
        Task(
            id=f"t{i}", prompt=({"role": "user", "content": f"q{i}"},), rubric=RUBRIC, env_name=e
        )  # fmt: skip
        for i, e in enumerate(envs)
    ]


def test_env_quota_sampler_draws_the_quota_per_environment():
    tasks = _tasks(["a"] * 5 + ["b"] * 3 + ["c"] + [None])
    assert SAMPLERS.get("env_quota") is EnvQuotaSampler
    s = EnvQuotaSampler(tasks, 9, seed=1)
    # 4 environments ("default" for env_name None); 9 / 4 = 2.25 -> the extra one to "a"
    assert s.quotas == {"a": 3, "b": 2, "c": 2, "default": 2}
    for step in range(1, 6):
        b = s.sample_tasks(step, np.random.default_rng(step))
        counts = collections.Counter(env_of(t) for t in b.tasks)
        assert counts == s.quotas
        ids = [t.id for t in b.tasks]
        for e in ("a", "b"):  # without replacement where the environment has enough tasks
            assert len({t.id for t in b.tasks if t.env_name == e}) == s.quotas[e]
        assert ids.count("t8") == 2 and ids.count("t9") == 2  # one task, quota 2: drawn twice
        np.testing.assert_array_equal(b.weights, np.ones(9))
    draw = [t.id for t in s.sample_tasks(3, np.random.default_rng(11)).tasks]
    assert draw == [t.id for t in s.sample_tasks(3, np.random.default_rng(11)).tasks]
    assert [t.id for t in s.sample_tasks(3, None).tasks] == [
        t.id for t in EnvQuotaSampler(tasks, 9, seed=1).sample_tasks(3, None).tasks]  # fmt: skip
    draws = {tuple(t.id for t in s.sample_tasks(1, np.random.default_rng(r)).tasks)
             for r in range(20)}  # fmt: skip
    assert len(draws) > 1  # uniform inside an environment, not a fixed list
    a_counts = collections.Counter(
        t.id
        for r in range(300)
        for t in s.sample_tasks(1, np.random.default_rng(r)).tasks
        if t.env_name == "a"
    )
    assert sorted(a_counts) == ["t0", "t1", "t2", "t3", "t4"]
    assert max(a_counts.values()) - min(a_counts.values()) < 90  # 180 expected each
    state = json.loads(json.dumps(s.state_dict()))
    EnvQuotaSampler(tasks, 9, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="quotas"):
        EnvQuotaSampler(tasks, 10, seed=1).load_state_dict(state)


def test_env_quota_sampler_weights_and_errors_name_the_environment():
    tasks = _tasks(["a"] * 4 + ["b"] * 4 + ["c"] * 4)
    s = EnvQuotaSampler(tasks, 8, weights={"a": 2, "b": 1, "c": 1})
    assert s.quotas == {"a": 4, "b": 2, "c": 2}
    b = s.sample_tasks(1, np.random.default_rng(0))
    assert collections.Counter(t.env_name for t in b.tasks) == {"a": 4, "b": 2, "c": 2}
    with pytest.raises(ValueError, match="environment 'z' .* has no training task"):
        EnvQuotaSampler(tasks, 8, weights={"a": 1, "b": 1, "c": 1, "z": 1})
    with pytest.raises(ValueError, match="batch_size 2 < the 3 environments"):
        EnvQuotaSampler(tasks, 2)
    with pytest.raises(ValueError, match="empty task list"):
        EnvQuotaSampler([], 2)


def _rollouts(step, rewards, envs):
    return Rollouts.from_responses(step, _tasks(envs), [], rewards=np.asarray(rewards))


def test_variance_selector_keeps_exactly_k_and_logs_its_stats():
    r = _rollouts(4, REWARDS, R_ENVS)
    top = VarianceSelector(VarianceSelectConfig(k=3, mode="top", per_env=False))
    keep = top.select(r)
    assert keep.dtype == bool and keep.tolist() == [True, False, False, True, False, True]
    # per environment: the quotas follow the candidates' environments (3 and 3 -> 2 and 1)
    env = VarianceSelector(VarianceSelectConfig(k=3, mode="top", per_env=True))
    assert np.flatnonzero(env.select(r)).tolist() == [0, 2, 3]
    m = env.observe(r)
    assert m == pytest.approx(selection_stats(REWARDS, env.select(r)))
    assert m["selected/variance_mean"] == pytest.approx((0.25 + 0.1875 + 0.25) / 3)
    tgt = VarianceSelector(VarianceSelectConfig(k=2, mode="targeted", per_env=False, target=0.2))
    assert np.flatnonzero(tgt.select(r)).tolist() == [2, 5]
    # ties at random per (seed, step): stable for a step, resumable without state
    ties = VarianceSelector(VarianceSelectConfig(k=1, per_env=False, seed=0))
    picks = {int(np.flatnonzero(ties.select(_rollouts(s, REWARDS, R_ENVS)))[0]) for s in range(30)}
    assert picks == {0, 3}
    assert ties.state_dict() == {}
    with pytest.raises(ValueError, match="k = 7"):
        VarianceSelector(VarianceSelectConfig(k=7)).select(r)
    with pytest.raises(ValueError, match="mode"):
        VarianceSelectConfig(k=2, mode="sample")
    with pytest.raises(KeyError, match="group reward source 'oracle'"):
        VarianceSelectConfig(k=2, reward="oracle")


def _varsel_config(which, tasks_per_step=8):
    c = grpo.get_config("smoke")
    c.unlock()
    c.rollout.tasks_per_step = tasks_per_step
    grpo.apply_variance_select(c, which)
    c.lock()
    return c


def test_the_varsel_variants_build_the_quota_sampler_and_the_selector():
    c = grpo.get_config("smoke,varsel=targeted_env")
    assert c.controllers.sampler == "env_quota" and c.rollout.train_groups == 2
    domain = builders.build_domain(c)
    sampler, selector = grpo_controllers(c, domain)
    assert isinstance(sampler, EnvQuotaSampler) and isinstance(selector, VarianceSelector)
    assert selector.config == VarianceSelectConfig(
        k=2, mode="targeted", per_env=True, targeting="proportional", seed=0
    )
    with pytest.raises(ValueError, match="varsel must be one of"):
        grpo.get_config("smoke,varsel=bottom")
    c = _varsel_config("top")
    c.unlock()
    c.rollout.train_groups = 0
    with pytest.raises(ValueError, match="config.rollout.train_groups"):
        grpo_controllers(c, domain)


def test_scripted_check_trains_the_k_selected_groups(tmp_path):
    c = _varsel_config("top_env", tasks_per_step=8)
    k = int(c.rollout.train_groups)
    assert k == 4
    run = scripted_run(c, ScriptedPolicy(), str(tmp_path))
    sampler = run.controllers.sampler
    assert isinstance(sampler, EnvQuotaSampler) and sum(sampler.quotas.values()) == 8
    for step in range(1, 4):
        r, ctx = run.step(step)
        envs = [env_of(t) for t in r.tasks]
        assert collections.Counter(envs) == sampler.quotas  # 2 per environment
        keep = np.array([g.selected for g in r.groups])
        assert keep.sum() == k and ctx.metrics["select/kept_frac"] == 0.5
        # the kept groups are Top-Var per environment on the trained reward (1 per environment)
        rng = np.random.default_rng([int(c.train.seed), step])
        quotas = env_quotas(envs, k, collections.Counter(envs))
        assert np.flatnonzero(keep).tolist() == top_variance(r.rewards, envs, quotas, k, rng)
        v = group_variances(r.rewards)
        for e in set(envs):
            idx = [i for i, x in enumerate(envs) if x == e]
            assert max(v[i] for i in idx if keep[i]) == max(v[i] for i in idx)
        stats = selection_stats(r.rewards, keep)
        for key, value in stats.items():
            assert ctx.metrics[f"variance_select/{key}"] == pytest.approx(value)
    report = run_check(c, ScriptedPolicy(), 3)
    assert [row["groups"] for row in report.per_step] == [float(k)] * 3
