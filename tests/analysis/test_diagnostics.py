"""HarnessRL pair failure classes and Kendall's τ_b vs plain-Python double-loop references."""

import dataclasses
import math

import numpy as np
import pytest

from rubric_rl.analysis.pair_failures import (
    PairCounts,
    failure_metrics,
    kendall_tau_b,
    pair_classes,
)

NAN = float("nan")


# --- plain-Python references (one pair at a time) ---------------------------------------------


def reference_pair_classes(rewards, oracle, reward_tie_tol=1e-6, oracle_tie_tol=1e-6, blind=50.0):
    c = dict.fromkeys(
        ("blind", "saturated", "spurious", "agree", "oracle_tied", "oracle_tied_reward_tied"), 0
    )
    c["excluded"] = 0
    n = len(rewards)
    for a in range(n):
        for b in range(a + 1, n):
            ra, rb, oa, ob = (
                float(rewards[a]),
                float(rewards[b]),
                float(oracle[a]),
                float(oracle[b]),
            )
            if any(math.isnan(x) for x in (ra, rb, oa, ob)):
                c["excluded"] += 1
                continue
            oracle_tie = abs(oa - ob) <= oracle_tie_tol
            if abs(ra - rb) <= reward_tie_tol:
                c["blind" if 100 * ((ra + rb) / 2) < blind else "saturated"] += 1
                c["oracle_tied_reward_tied"] += oracle_tie
            elif oracle_tie:
                c["spurious"] += 1
                c["oracle_tied"] += 1
            elif (ra > rb) == (oa > ob):
                c["agree"] += 1
            else:
                c["spurious"] += 1
    return PairCounts(**c)


def reference_kendall_tau_b(x, y, x_tol=0.0, y_tol=0.0):
    keep = [k for k in range(len(x)) if not (math.isnan(x[k]) or math.isnan(y[k]))]
    n0 = n1 = n2 = concordant = discordant = 0
    for p, a in enumerate(keep):
        for b in keep[p + 1 :]:
            n0 += 1
            x_tie, y_tie = abs(x[a] - x[b]) <= x_tol, abs(y[a] - y[b]) <= y_tol
            n1 += x_tie
            n2 += y_tie
            if not (x_tie or y_tie):
                if (x[a] - x[b]) * (y[a] - y[b]) > 0:
                    concordant += 1
                else:
                    discordant += 1
    if (n0 - n1) * (n0 - n2) == 0:
        return NAN
    return (concordant - discordant) / math.sqrt((n0 - n1) * (n0 - n2))


def random_group(rng, j):
    """Rewards / oracle with exact ties, near-tolerance ties, the 0.5 boundary and NaNs."""
    reward_pool = [0.0, 0.2, 0.3, 0.3 + 5e-7, 0.3 + 2e-6, 0.5, 0.5 - 1e-7, 0.7, 1.0]
    rewards = rng.choice(reward_pool, size=j) if rng.uniform() < 0.7 else rng.uniform(size=j)
    oracle = rng.integers(0, 4, size=j) / 2.0  # win counts: many ties
    oracle = oracle + rng.choice([0.0, 5e-7, 2e-6], size=j)
    rewards[rng.uniform(size=j) < 0.05] = NAN
    oracle[rng.uniform(size=j) < 0.05] = NAN
    return rewards, oracle


# --- hand-computed group ------------------------------------------------------------------------


def test_hand_built_group_of_four():
    #             A    B    C    D
    rewards = [0.2, 0.2, 0.7, 0.7]
    oracle = [0.6, 0.5, 0.9, 0.5]
    # AB: rewards tie at 20 points (< 50)                     -> blind
    # CD: rewards tie at 70 points (>= 50)                    -> saturated
    # AC: r A<C, o 0.6<0.9                                    -> agree
    # AD: r A<D, o 0.6>0.5 (inverted)                         -> spurious
    # BC: r B<C, o 0.5<0.9                                    -> agree
    # BD: r B<D, oracle ties 0.5=0.5                          -> spurious (oracle-tied)
    counts = pair_classes(np.array(rewards), np.array(oracle))
    assert counts == PairCounts(
        blind=1,
        saturated=1,
        spurious=2,
        agree=2,
        oracle_tied=1,
        oracle_tied_reward_tied=0,
        excluded=0,
    )
    assert counts.classified == 6
    # τ_b: C=2 (AC, BC), D=1 (AD), n0=6, reward ties n1=2 (AB, CD), oracle ties n2=1 (BD)
    tau = 1 / math.sqrt((6 - 2) * (6 - 1))
    assert kendall_tau_b(np.array(rewards), np.array(oracle)) == tau
    assert failure_metrics([(np.array(rewards), np.array(oracle))]) == {
        "failure/pairs": 6.0,
        "failure/excluded": 0.0,
        "failure/blind": 1 / 6,
        "failure/saturated": 1 / 6,
        "failure/spurious": 2 / 6,
        "failure/agree": 2 / 6,
        "failure/oracle_tied_frac": 1 / 6,
        "failure/spurious_oracle_untied": 1 / 6,
        "failure/agreement": 2 / 4,
        "failure/kendall_tau": tau,
    }


def test_both_sides_tied_counts_in_blind_and_oracle_tied_reward_tied():
    counts = pair_classes(np.array([0.1, 0.1, 0.9]), np.array([2.0, 2.0, 1.0]))
    # (0,1): both tie at 10 points -> blind, oracle_tied_reward_tied; (0,2), (1,2): inverted
    assert counts == PairCounts(blind=1, spurious=2, oracle_tied_reward_tied=1)


def test_nan_reward_or_oracle_is_excluded_not_classed():
    rewards = np.array([0.2, NAN, 0.7, 0.4])
    oracle = np.array([0.1, 0.5, 0.9, NAN])
    # only pair (0, 2) has four finite values: r 0.2<0.7, o 0.1<0.9 -> agree; 5 pairs excluded
    counts = pair_classes(rewards, oracle)
    assert counts == PairCounts(agree=1, excluded=5)
    m = failure_metrics([(rewards, oracle)])
    assert m["failure/pairs"] == 1.0 and m["failure/excluded"] == 5.0
    assert m["failure/agree"] == 1.0 and m["failure/blind"] == 0.0
    assert m["failure/kendall_tau"] == 1.0


def test_no_classified_pair_omits_fractions():
    m = failure_metrics([(np.array([NAN, 0.3, 0.4]), np.array([1.0, NAN, 2.0]))])
    assert m == {"failure/pairs": 0.0, "failure/excluded": 3.0}
    assert failure_metrics([]) == {"failure/pairs": 0.0, "failure/excluded": 0.0}
    # only tied pairs: classes present, the conditional agreement and τ_b are undefined
    m = failure_metrics([(np.array([0.8, 0.8]), np.array([0.0, 1.0]))], prefix="f/")
    assert m == {
        "f/pairs": 1.0,
        "f/excluded": 0.0,
        "f/blind": 0.0,
        "f/saturated": 1.0,
        "f/spurious": 0.0,
        "f/agree": 0.0,
        "f/oracle_tied_frac": 0.0,
        "f/spurious_oracle_untied": 0.0,
    }


def test_oracle_ties_are_spurious_and_counted_apart():
    rewards = np.array([0.1, 0.4, 0.9])
    oracle = np.array([0.5, 0.5, 0.5])
    assert pair_classes(rewards, oracle) == PairCounts(spurious=3, oracle_tied=3)
    m = failure_metrics([(rewards, oracle)])
    assert m["failure/spurious"] == 1.0
    assert m["failure/oracle_tied_frac"] == 1.0
    assert m["failure/spurious_oracle_untied"] == 0.0
    assert m["failure/agreement"] == 0.0
    assert "failure/kendall_tau" not in m  # the oracle side is all tied


def test_ragged_groups():
    groups = [
        (np.array([0.3]), np.array([1.0])),  # no pairs
        (np.array([0.1, 0.2, 0.3]), np.array([3.0, 2.0, 1.0])),  # 3 inverted: τ = -1
        (np.linspace(0.1, 0.9, 5), np.arange(5.0)),  # 10 agree: τ = 1
        (np.array([0.9, 0.9, 0.9]), np.array([1.0, 2.0, 3.0])),  # 3 saturated: τ undefined
    ]
    m = failure_metrics(groups)
    assert m["failure/pairs"] == 16.0  # 0 + 3 + 10 + 3
    assert m["failure/spurious"] == 3 / 16
    assert m["failure/agree"] == 10 / 16
    assert m["failure/saturated"] == 3 / 16
    assert m["failure/blind"] == 0.0
    assert m["failure/agreement"] == 10 / 13
    assert m["failure/kendall_tau"] == 0.0  # mean over groups (-1, 1), not over pairs
    total = sum((pair_classes(r, o) for r, o in groups), PairCounts())
    assert total == PairCounts(saturated=3, spurious=3, agree=10)


def test_tolerances():
    # rewards 5e-7 apart tie (30 points: blind); 2e-6 apart separate (agree with the oracle)
    assert pair_classes(np.array([0.3, 0.3 + 5e-7]), np.array([0.0, 1.0])) == PairCounts(blind=1)
    assert pair_classes(np.array([0.3, 0.3 + 2e-6]), np.array([0.0, 1.0])) == PairCounts(agree=1)
    # the oracle likewise: 5e-7 ties (spurious, oracle-tied), 2e-6 separates
    assert pair_classes(np.array([0.3, 0.6]), np.array([0.5, 0.5 + 5e-7])) == PairCounts(
        spurious=1, oracle_tied=1
    )
    assert pair_classes(np.array([0.3, 0.6]), np.array([0.5, 0.5 + 2e-6])) == PairCounts(agree=1)
    # keywords move the thresholds
    assert pair_classes(
        np.array([0.3, 0.3 + 2e-6]), np.array([0.0, 1.0]), reward_tie_tol=1e-5
    ) == PairCounts(blind=1)
    assert pair_classes(
        np.array([0.3, 0.6]), np.array([0.5, 0.5 + 5e-7]), oracle_tie_tol=0.0
    ) == PairCounts(agree=1)


def test_fifty_point_boundary():
    oracle = np.array([0.0, 1.0])
    assert pair_classes(np.array([0.5, 0.5]), oracle) == PairCounts(saturated=1)
    assert pair_classes(np.array([0.4999, 0.4999]), oracle) == PairCounts(blind=1)
    assert pair_classes(np.array([0.5, 0.5]), oracle, blind_below_points=60.0) == PairCounts(
        blind=1
    )


def test_pair_counts_add():
    a = PairCounts(1, 2, 3, 4, 5, 6, 7)
    assert a + PairCounts(7, 6, 5, 4, 3, 2, 1) == PairCounts(8, 8, 8, 8, 8, 8, 8)
    assert a.classified == 10


def test_shape_errors_name_the_group():
    with pytest.raises(ValueError, match="group 1"):
        failure_metrics([(np.zeros(3), np.zeros(3)), (np.zeros(3), np.zeros(4))])
    with pytest.raises(ValueError, match="1-D"):
        pair_classes(np.zeros((2, 3)), np.zeros((2, 3)))


def test_pair_classes_match_reference_on_random_groups():
    rng = np.random.default_rng(0)
    groups = [random_group(rng, int(rng.integers(1, 17))) for _ in range(200)]
    total = PairCounts()
    for rewards, oracle in groups:
        got = pair_classes(rewards, oracle)
        assert got == reference_pair_classes(rewards, oracle), (rewards, oracle)
        total += got
    # the reference's classes are all exercised, so the comparison can fail on each
    assert min(dataclasses.astuple(total)) > 0, total
    m = failure_metrics(groups)
    n = total.classified
    assert m["failure/pairs"] == n and m["failure/excluded"] == total.excluded
    for name in ("blind", "saturated", "spurious", "agree"):
        assert m[f"failure/{name}"] == getattr(total, name) / n
    assert m["failure/agreement"] == total.agree / (total.agree + total.spurious)
    taus = [reference_kendall_tau_b(r, o, 1e-6, 1e-6) for r, o in groups]
    assert m["failure/kendall_tau"] == pytest.approx(np.nanmean(taus), abs=1e-12)


@pytest.mark.parametrize("tol", [0.0, 1e-6])
def test_kendall_tau_b_matches_reference(tol):
    rng = np.random.default_rng(1)
    defined = 0
    for _ in range(100):
        rewards, oracle = random_group(rng, int(rng.integers(1, 17)))
        want = reference_kendall_tau_b(list(rewards), list(oracle), tol, tol)
        got = kendall_tau_b(rewards, oracle, reward_tie_tol=tol, oracle_tie_tol=tol)
        if math.isnan(want):
            assert math.isnan(got)
        else:
            defined += 1
            assert got == pytest.approx(want, abs=1e-12)
    assert defined > 50


def test_kendall_tau_b_textbook_values():
    # no ties: τ = (C - D) / n0; one swap of four -> (5 - 1) / 6
    assert kendall_tau_b(np.array([1.0, 2, 3, 4]), np.array([1.0, 2, 4, 3])) == 4 / 6
    # ties on one side only: x = [1, 1, 2], y = [1, 2, 3]: C = 2, D = 0, n1 = 1, n2 = 0
    assert kendall_tau_b(np.array([1.0, 1, 2]), np.array([1.0, 2, 3])) == 2 / math.sqrt(2 * 3)
    assert math.isnan(kendall_tau_b(np.array([0.4]), np.array([1.0])))
    assert math.isnan(kendall_tau_b(np.array([0.4, NAN, 0.5]), np.array([1.0, 2.0, NAN])))
