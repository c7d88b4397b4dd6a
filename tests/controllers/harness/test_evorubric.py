"""The EvoRubric-style rule (harness/evorubric.py): zero-variance pruning, verified regeneration
(within-group variance, leave-one-out Spearman consensus), and the EvoRubric baseline / c_t ←
EvoRubric and p_t ← SEC switching arms through the real stages on the scripted policy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from configs import harness_rl
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.methods.harness_rl import evorubric
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verifier

pytest.importorskip("chromadb")
scipy_stats = pytest.importorskip("scipy.stats")

NAN = math.nan


def crit(cid, weight=10.0, anchor=False, checker="cf_non_empty", **args):
    return Criterion(
        id=cid, text=cid, weight=weight, verifier=Verifier.rule(checker, **args), anchor=anchor
    )


TASK = Task(id="t", prompt=({"role": "user", "content": "q"},), rubric=Rubric((crit("a"),)))


def test_zero_variance_needs_two_defined_identical_verdicts():
    assert evorubric.zero_variance([1, 1, NAN, 1])
    assert evorubric.zero_variance([0, 0])
    assert not evorubric.zero_variance([1, 0, 1])
    assert not evorubric.zero_variance([1, NAN, NAN])  # one defined verdict: no evidence


@pytest.mark.parametrize(
    "a,b",
    [
        ([1, 0, 1, 0, 1], [0.9, 0.1, 0.5, 0.5, 0.7]),
        ([0, 0, 1, 1, 1, 0], [3, 1, 2, 2, 5, 0]),
        ([1, 2, 3, 4], [4, 3, 2, 1]),
    ],
)
def test_spearman_matches_scipy_with_ties(a, b):
    want = scipy_stats.spearmanr(a, b).statistic
    assert evorubric.spearman(a, b) == pytest.approx(want, abs=1e-12)


def test_spearman_is_undefined_for_a_constant_side_and_skips_nan():
    assert evorubric.spearman([1, 1, 1], [0, 1, 2]) is None
    assert evorubric.spearman([1, NAN], [0, 1]) is None
    got = evorubric.spearman([1, 0, NAN, 1], [2, 1, 9, 3])
    assert got == pytest.approx(scipy_stats.spearmanr([1, 0, 1], [2, 1, 3]).statistic)


def test_pruning_deletes_zero_variance_non_anchors_and_keeps_the_last_positive():
    crits = [crit("anc", anchor=True), crit("sat"), crit("var"), crit("pit", weight=-5.0)]
    met = np.array([[1, 1, 1], [1, 1, 1], [1, 0, 1], [0, 0, 0]], float)
    ops = evorubric.prune_ops(crits, met, ["anc", "sat", "var", "pit"])
    assert [(o.op, o.targets) for o in ops] == [("delete", ("sat",)), ("delete", ("pit",))]
    # Only non-anchor positives, all constant: the last one stays.
    crits = [crit("x"), crit("y")]
    ops = evorubric.prune_ops(crits, np.ones((2, 4)), ["x", "y"])
    assert [o.targets for o in ops] == [("x",)]


def test_regeneration_keeps_varying_candidates_that_agree_with_the_rest():
    have = [crit("a", checker="cf_non_empty")]
    lib = [
        crit("dup", checker="cf_non_empty"),  # checks what the rubric checks: skipped
        crit("const", checker="cf_plain"),  # constant on the group: no signal
        crit("against", checker="cf_praise"),  # ranks the group against the rest: LOO fails
        crit("agrees", checker="cf_numbered"),
        crit("also", checker="cf_case", case="lower"),
        crit("pitfall", weight=-3.0, checker="cf_distinct"),  # only positives are generated
    ]
    verdicts = {
        "const": [1, 1, 1, 1],
        "against": [0, 0, 1, 1],
        "agrees": [1, 1, 0, 0],
        "also": [1, 0, 1, 0],
    }
    asked = []

    def judge_new(cs):
        asked.append([c.id for c in cs])
        return np.array([verdicts[c.id.removeprefix("evo:")] for c in cs], float)

    rest = [0.9, 0.8, 0.2, 0.1]
    got = evorubric.regenerate(TASK, have, rest, lambda t: lib, judge_new, max_new=1)
    assert asked == [["evo:const", "evo:against", "evo:agrees", "evo:also"]]
    assert [(c.id, c.origin) for c, _ in got] == [("evo:agrees", "evorubric")]
    assert got[0][1] == pytest.approx(scipy_stats.spearmanr([1, 1, 0, 0], rest).statistic)
    two = evorubric.regenerate(TASK, have, rest, lambda t: lib, judge_new, max_new=2)
    assert [c.id for c, _ in two] == ["evo:agrees", "evo:also"]
    # The rest of the rubric is constant: consensus undefined, kept on variance alone (ours).
    flat = evorubric.regenerate(TASK, have, [0.5] * 4, lambda t: lib, judge_new, max_new=1)
    assert [c.id for c, rho in flat] == ["evo:against"] and flat[0][1] is None


def test_candidate_weights_new_criteria_at_the_median_positive():
    crits = [crit("a", weight=10.0), crit("b", weight=30.0), crit("c", weight=60.0)]
    prune = evorubric.prune_ops(crits, np.array([[1, 1], [1, 0], [0, 1]], float), "abc")
    new = [(crit("evo:n", checker="cf_plain"), 0.5)]
    cand = evorubric.candidate(TASK, crits, prune, new)
    assert cand.label == evorubric.RULE and cand.interface == "rubric"
    assert [o.op for o in cand.rubric] == ["delete", "create"]
    assert cand.rubric[1].new[0].weight == 30.0
    assert evorubric.candidate(TASK, crits, [], []) is None


def _small(arg):
    c = harness_rl.get_config(arg)
    c.unlock()
    c.rollout.update(tasks_per_step=8, samples_per_task=8)
    c.domain.n_train = 32
    c.train.steps = 40
    c.lock()
    return c


def test_the_evorubric_baseline_prunes_what_did_not_vary_and_adds_what_does(tmp_path):
    """EvoRubric on the scripted policy through the real judge: every rubric update is the
    rule's (no critic, no other interface), each pruned criterion had zero variance on the
    group it was judged on, each added one varies on it, and anchors are never deleted."""
    c = _small("smoke,evorubric")
    assert (c.harness.interfaces, c.harness.rubric_rule) == (("rubric",), "evorubric")
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path))
    ctl = run.controllers.sampler
    pruned = added = 0
    for step in range(1, 7):
        r, ctx = run.step(step)
        assert ctx.metrics["harness/updates/rollout/proposed"] == 0
        assert ctx.metrics["harness/updates/sampling/proposed"] == 0
        events = [e for e in ctl.pop_events() if e.get("event") == "update"]
        for e in events:
            assert e["status"] == "accepted" and e["candidate"]["label"] == "evorubric"
            g = next(i for i, grp in enumerate(r.groups) if grp.task.id == e["task_id"])
            ids = list(r.scores.criterion_ids[g])
            j = len(r.groups[g].trajectories)
            met = np.where(r.scores.valid[g, :, :j], r.scores.met[g, :, :j], np.nan)
            before = {x.id: x for x in r.groups[g].task.rubric.criteria}
            for op in e["candidate"]["rubric"]:
                if op["op"] == "delete":
                    (cid,) = op["targets"]
                    assert not before[cid].anchor
                    assert evorubric.zero_variance(met[ids.index(cid)])
                    pruned += 1
                else:
                    assert op["op"] == "create" and op["new"][0]["origin"] == "evorubric"
                    added += 1
        for tid, st in ctl.state.items():
            assert any(x.anchor for x in st.criteria) or not any(
                x.anchor for x in run.domain.train[ctl.index[tid]].rubric.criteria
            )
    assert pruned > 0 and added > 0


def test_switching_arms_hand_one_interface_to_the_published_rule(tmp_path):
    c = _small("smoke,switch=p")
    assert c.harness.sampling_rule == "sec"
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path / "p"))
    ctl = run.controllers.sampler
    for step in range(1, 5):
        r, ctx = run.step(step)
        assert all(g.weight == 1.0 for g in r.groups)  # SEC: no importance weight
        assert ctx.metrics["harness/updates/sampling/proposed"] == 0
        assert "harness/sec/q/max" in ctx.metrics
    assert ctl.state_dict()["sec"]["q"] == ctl.sec.q.tolist()
    c = _small("smoke,switch=c")
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path / "c"))
    kinds = set()
    for step in range(1, 4):
        run.step(step)
        for e in run.controllers.sampler.pop_events():
            if e.get("event") == "update":
                kinds.add((e["candidate"]["interface"], e["candidate"]["label"]))
    rubric_labels = {lab for iface, lab in kinds if iface == "rubric"}
    assert rubric_labels == {"evorubric"}
    assert any(iface == "rollout" for iface, _ in kinds)  # the harness keeps guidance
    with pytest.raises(ValueError, match="switch='x'"):
        harness_rl.get_config("switch=x")
    a = harness_rl.get_config("amaris").harness
    assert (a.interfaces, a.critic, a.memory) == (("rubric",), False, "full")
