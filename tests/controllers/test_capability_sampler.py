"""Capability sampler: hand-computed probabilities, importance weights, discovery share, evidence
retention by rubric id, exact resume."""

import dataclasses
import json

import numpy as np
import pytest

from rubric_rl.controllers.sampling import SAMPLERS
from rubric_rl.methods.arise.capability_sampler import (
    CapabilitySampler,
    CapabilitySamplerConfig,
    variance_priority,
)
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verdict, Verifier


def _crit(cid, cap, weight=1.0):
    return Criterion(
        cid,
        f"criterion {cid}",
        weight=weight,
        capability=cap,
        verifier=Verifier.rule("cf_non_empty"),
    )


def _task(tid, ttype, caps, crits=()):
    return Task(
        id=tid,
        prompt=({"role": "user", "content": tid},),
        rubric=Rubric(tuple(crits)),
        task_type=ttype,
        capabilities=caps,
    )


def _verdicts(cid, sat, unsat):
    return [[Verdict(cid, True)] for _ in range(sat)] + [
        [Verdict(cid, False)] for _ in range(unsat)
    ]


def _bank():
    # cells: (a, x) ← t0, t1; (a, y) ← t1, t2; (b, x) ← t3
    crits = (_crit("rx", "x"), _crit("ry", "y"), _crit("pit", "x", weight=-1.0))
    return [
        _task("t0", "a", ("x",), crits),
        _task("t1", "a", ("x", "y"), crits),
        _task("t2", "a", ("y",), crits),
        _task("t3", "b", ("x",), crits),
    ]


def test_probabilities_match_hand_computed_values():
    tasks = _bank()
    cfg = CapabilitySamplerConfig(
        batch_size=4,
        discovery_share=0.0,
        min_priority=0.0,
        min_cell_evidence=0.0,
        importance_weights=True,
    )
    s = CapabilitySampler(tasks, cfg)
    # (a, x): 3 satisfied + 1 unsatisfied -> Beta(4, 2), mean 2/3, p(1-p) = 2/9.
    s.observe_verdicts(tasks[0], _verdicts("rx", 2, 1))
    # A pitfall NOT met is satisfied: +1 satisfied for (a, x).
    s.observe_verdicts(tasks[0], [[Verdict("pit", False)]])
    # (b, x): 0 satisfied + 4 unsatisfied -> Beta(1, 5), mean 1/6, p(1-p) = 5/36.
    s.observe_verdicts(tasks[3], _verdicts("rx", 0, 4))
    # (a, y): no evidence -> Beta(1, 1), mean 1/2, p(1-p) = 1/4. A judge failure adds nothing.
    s.observe_verdicts(tasks[2], [[Verdict("ry", None)]])
    est = s.estimates()
    assert est[("a", "x")] == (4.0, 2.0, pytest.approx(2 / 3))
    assert est[("b", "x")] == (1.0, 5.0, pytest.approx(1 / 6))
    assert est[("a", "y")] == (1.0, 1.0, 0.5)
    p = s.probabilities()
    assert p == pytest.approx({("a", "x"): 8 / 22, ("a", "y"): 9 / 22, ("b", "x"): 5 / 22})
    # Task marginals q_i = Σ_{c ∋ i} P(c)/|c|; with no discovery, u = 1/(N q_i).
    q = s.task_probabilities()
    expected_q = np.array([8 / 44, 8 / 44 + 9 / 44, 9 / 44, 5 / 22])
    np.testing.assert_allclose(q, expected_q)
    batch = s.sample_tasks(0, np.random.default_rng(0))
    ids = [int(t.id[1:]) for t in batch.tasks]
    np.testing.assert_allclose(batch.weights, 1.0 / (4 * expected_q[ids]))
    # ARISE's own default: the prioritised draws are trained as drawn (u = 1), same draws.
    plain = CapabilitySampler(tasks, dataclasses.replace(cfg, importance_weights=False))
    plain.evidence, plain.evaluations = s.evidence, s.evaluations
    again = plain.sample_tasks(0, np.random.default_rng(0))
    assert [t.id for t in again.tasks] == [t.id for t in batch.tasks]
    np.testing.assert_array_equal(again.weights, np.ones(4))
    assert not CapabilitySamplerConfig(batch_size=4).importance_weights


def test_unscored_cells_are_blank_and_left_to_discovery():
    tasks = _bank()
    cfg = CapabilitySamplerConfig(
        batch_size=4, discovery_share=0.0, min_priority=0.0, importance_weights=True
    )
    s = CapabilitySampler(tasks, cfg)
    # No evidence at all (empty pool): no cell is scored, adaptive draws are uniform over tasks.
    assert s.probabilities() == {} and s.metrics()["scored_cells"] == 0.0
    np.testing.assert_allclose(s.task_probabilities(), np.full(4, 0.25))
    np.testing.assert_allclose(s.sample_tasks(0, np.random.default_rng(0)).weights, np.ones(4))
    s.observe_verdicts(tasks[0], _verdicts("rx", 3, 1))  # (a, x): 2/9
    s.observe_verdicts(tasks[3], _verdicts("rx", 0, 4))  # (b, x): 5/36; (a, y) stays blank
    assert s.probabilities() == pytest.approx({("a", "x"): 8 / 13, ("b", "x"): 5 / 13})
    np.testing.assert_allclose(s.task_probabilities(), [4 / 13, 4 / 13, 0.0, 5 / 13])
    assert "p/a/y" not in s.metrics() and s.metrics()["p/b/x"] == pytest.approx(5 / 13)
    drawn = {t.id for k in range(20) for t in s.sample_tasks(k, np.random.default_rng(k)).tasks}
    assert "t2" not in drawn  # only (a, y): reached by discovery alone
    s = CapabilitySampler(tasks, dataclasses.replace(cfg, discovery_share=0.25))
    s.observe_verdicts(tasks[0], _verdicts("rx", 3, 1))
    s.evaluations[:] = [3, 3, 0, 3]
    batch = s.sample_tasks(0, np.random.default_rng(0))
    assert batch.tasks[0].id == "t2"  # discovery: u = 1 / (N · 0.25 · 1)
    assert batch.weights[0] == pytest.approx(1 / (4 * 0.25))


def test_priority_floor_and_variance_function():
    np.testing.assert_allclose(variance_priority(np.array([0.0, 0.5, 0.9])), [0.0, 0.25, 0.09])
    tasks = _bank()
    cfg = CapabilitySamplerConfig(batch_size=2, min_priority=0.01, min_cell_evidence=0.0)
    s = CapabilitySampler(tasks, cfg)
    s.observe_verdicts(tasks[3], _verdicts("rx", 0, 1000))  # (b, x) ≈ always failing
    p = s.probabilities()
    w_bx = (1 / 1002) * (1001 / 1002) + 0.01
    total = 0.25 + 0.01 + 0.25 + 0.01 + w_bx
    assert p[("b", "x")] == pytest.approx(w_bx / total)
    assert p[("a", "x")] == pytest.approx(0.26 / total)


def test_draw_frequencies_follow_cell_probabilities():
    tasks = _bank()
    cfg = CapabilitySamplerConfig(batch_size=4000, discovery_share=0.0, min_cell_evidence=0.0)
    s = CapabilitySampler(tasks, cfg)
    s.observe_verdicts(tasks[3], _verdicts("rx", 0, 4))
    q = s.task_probabilities()
    assert np.all(q > 0.1) and np.ptp(q) > 0.05  # every task reachable, unequal probabilities
    batch = s.sample_tasks(0, np.random.default_rng(1))
    freq = np.bincount([int(t.id[1:]) for t in batch.tasks], minlength=4) / 4000
    np.testing.assert_allclose(freq, q, atol=0.025)


def test_discovery_share_draws_the_least_evaluated_tasks():
    tasks = [_task(f"t{i}", "a", ("x",)) for i in range(10)]
    cfg = CapabilitySamplerConfig(batch_size=8, discovery_share=0.25, importance_weights=True)
    assert cfg.num_discovery == 2
    s = CapabilitySampler(tasks, cfg)
    s.evaluations[:] = 5
    s.evaluations[[3, 7]] = 0
    batch = s.sample_tasks(0, np.random.default_rng(0))
    assert len(batch) == 8
    assert sorted(t.id for t in batch.tasks[:2]) == ["t3", "t7"]
    # u for the two discovered tasks: p_i = 0.75 q_i + 0.25 d_i, d uniform over {t3, t7}.
    p = 0.75 * (1 / 10) + 0.25 * 0.5
    np.testing.assert_allclose(batch.weights[:2], 1 / (10 * p))
    np.testing.assert_allclose(
        batch.weights[2:][[t.id not in ("t3", "t7") for t in batch.tasks[2:]]], 1 / (10 * 0.075)
    )
    # Discovery alone covers the bank: 2 fresh tasks per step when nothing else is observed.
    s = CapabilitySampler(tasks, CapabilitySamplerConfig(batch_size=2, discovery_share=1.0))
    seen = set()
    for step in range(5):
        for t in s.sample_tasks(step, np.random.default_rng(step)).tasks:
            assert t.id not in seen
            seen.add(t.id)
            s.observe_verdicts(t, [])
    assert len(seen) == 10


def test_retired_rubric_evidence_no_longer_moves_estimates():
    tasks = _bank()
    s = CapabilitySampler(tasks, CapabilitySamplerConfig(batch_size=2))
    ref = CapabilitySampler(tasks, CapabilitySamplerConfig(batch_size=2))
    s.observe_verdicts(tasks[0], _verdicts("rx", 5, 0))  # rubric rx: (a, x) succeeds
    s.observe_verdicts(tasks[0], _verdicts("pit", 3, 0))  # pitfall present: 3 unsatisfied
    ref.observe_verdicts(tasks[0], _verdicts("pit", 3, 0))
    assert s.estimates()[("a", "x")] == (6.0, 4.0, 0.6)
    s.forget(["rx"])
    assert s.estimates() == ref.estimates()
    assert s.probabilities() == ref.probabilities()
    # Unchanged rubrics keep their evidence and keep accumulating.
    s.observe_verdicts(tasks[0], _verdicts("pit", 0, 1))  # pitfall absent: satisfied
    assert s.estimates()[("a", "x")] == (2.0, 4.0, pytest.approx(1 / 3))


def test_decay_and_unknown_criterion_error():
    tasks = _bank()
    s = CapabilitySampler(tasks, CapabilitySamplerConfig(batch_size=2, decay=0.5))
    s.observe_verdicts(tasks[0], _verdicts("rx", 4, 2))
    s.decay()
    assert s.counts()[("a", "x")] == (2.0, 1.0)
    with pytest.raises(ValueError, match="no such criterion"):
        s.observe_verdicts(tasks[0], [[Verdict("nope", True)]])
    with pytest.raises(KeyError, match="unknown capability priority"):
        CapabilitySamplerConfig(batch_size=2, priority="nope")
    with pytest.raises(ValueError, match="discovery_share"):
        CapabilitySamplerConfig(batch_size=2, discovery_share=1.5)


def test_registered_and_resume_is_exact():
    assert SAMPLERS.get("capability") is CapabilitySampler
    s = SAMPLERS.get("capability")(_bank(), 5, seed=3, discovery_share=0.4)
    assert s.config == CapabilitySamplerConfig(batch_size=5, seed=3, discovery_share=0.4)
    tasks = _bank()
    cfg = CapabilitySamplerConfig(batch_size=3, discovery_share=0.34, decay=0.9)

    def run(s, steps):
        out = []
        for step in steps:
            b = s.sample_tasks(step, np.random.default_rng([7, step]))
            out.append(([t.id for t in b.tasks], b.weights.tolist()))
            s.decay()
            for k, t in enumerate(b.tasks):
                s.observe_verdicts(t, _verdicts("rx" if k % 2 else "ry", step % 3, 1))
        return out

    full = run(CapabilitySampler(tasks, cfg), range(8))
    part = CapabilitySampler(tasks, cfg)
    run(part, range(4))
    resumed = CapabilitySampler(tasks, cfg)
    resumed.load_state_dict(json.loads(json.dumps(part.state_dict())))
    assert run(resumed, range(4, 8)) == full[4:]
    with pytest.raises(ValueError, match="tasks"):
        CapabilitySampler(tasks[:2], cfg).load_state_dict(part.state_dict())
