"""The scripted-policy controller check (rubric_rl/checks/controller_check.py): the stand-in policy
follows its script through the domain's real checkers, and the real ARISE controller, driven
through the real reward path, shows the pathologies of its previous defaults (stuck slots,
importance weights shrinking the effective batch) and not with the current ones."""

from __future__ import annotations

import numpy as np
import pytest

from configs import arise, grpo
from rubric_rl.checks.controller_check import (
    DEFAULT_SCRIPT,
    CriterionScript,
    ScriptedPolicy,
    run_check,
)
from rubric_rl.envs.constraints import ConstraintDomain, hard_constraints
from rubric_rl.methods.arise.arise_config import EARLIER_DEFAULTS, with_arise_settings


def test_script_probabilities():
    s = CriterionScript(0.2, 0.8, tau=10, skill_gain=0.3)
    assert s.p(0, False) == pytest.approx(0.2)
    assert s.p(10, False) == pytest.approx(0.8 - 0.6 * np.exp(-1))
    assert s.p(0, True) == pytest.approx(0.5)
    assert CriterionScript(0.9, 0.9, skill_gain=0.5).p(3, True) == 1.0
    assert CriterionScript(0.0, 0.0).p(1000, True) == 0.0
    with pytest.raises(ValueError, match="start"):
        CriterionScript(1.5, 0.5)


def test_the_policy_meets_each_constraint_at_its_scripted_rate():
    tasks = [t for t in ConstraintDomain(0).tasks("train", 200) if t.task_type == "list"]
    # count always met, category never, everything else always: the real checkers agree.
    script = {k: CriterionScript(1.0, 1.0) for k in DEFAULT_SCRIPT}
    script["category"] = CriterionScript(0.0, 0.0)
    policy = ScriptedPolicy(script, seed=1)
    met = {"count": [], "category": []}
    for task in tasks[:40]:
        kinds = {c.kind: c for c in hard_constraints(task)}
        for j in range(4):
            response = policy.respond(task, task.messages, step=5, j=j)
            for kind in met:
                if kind in kinds:
                    met[kind].append(kinds[kind].met(response))
    assert len(met["count"]) > 50 and len(met["category"]) > 50
    assert np.mean(met["count"]) > 0.95 and np.mean(met["category"]) < 0.05
    # A skill for the capability in the prompt adds its gain: 0 -> 1 for counting.
    gain = {k: CriterionScript(1.0, 1.0) for k in DEFAULT_SCRIPT}
    gain["count"] = CriterionScript(0.0, 0.0, skill_gain=1.0)
    policy = ScriptedPolicy(gain, seed=1)
    task = next(t for t in tasks if any(c.kind == "count" for c in hard_constraints(t)))
    count = next(c for c in hard_constraints(task) if c.kind == "count")
    skill = policy.skill_texts["counting"]
    guided = [{"role": "user", "content": task.messages[-1]["content"] + " " + skill}]
    assert not any(count.met(policy.respond(task, task.messages, 1, j)) for j in range(8))
    assert all(count.met(policy.respond(task, guided, 1, j)) for j in range(8))
    # Deterministic: the same (seed, step, rollout, task) gives the same text.
    assert policy.respond(task, guided, 3, 2) == policy.respond(task, guided, 3, 2)


def _arise(previous: bool):
    c = arise.get_config()
    c.unlock()
    c.rollout.tasks_per_step = 16
    c.domain.n_train = 512
    c.lock()
    # ARISE's earlier defaults (importance weights, separation ranking, no exit for a pair
    # that never improves, seed-rubric candidates, a pool of 8 filled 2 a step) or the defaults.
    return with_arise_settings(c, EARLIER_DEFAULTS if previous else {})


@pytest.fixture(scope="module")
def reports():
    policy = ScriptedPolicy()
    return {p: run_check(_arise(p), policy, 60, stuck_window=10) for p in (True, False)}


def test_previous_arise_defaults_clog_the_pool_and_shrink_the_batch(reports):
    old, new = reports[True].figures, reports[False].figures
    # Previous: never-met criteria ranked first hold slots for good; u = 1/(N p) on each draw.
    assert old["pool/stuck"] >= 1 and old["pool/stuck_mean"] > 0.5
    assert old["effective_batch_frac"] < 0.9 and old["u_max"] > 5
    # Current: no stuck slot, every draw trained as drawn, more all-failure groups get a signal.
    assert new["pool/stuck"] == 0 and new["pool/stuck_mean"] == 0
    assert new["effective_batch_frac"] == 1.0 and new["u_min"] == new["u_max"] == 1.0
    assert new["all_fail_rubric_signal"] > old["all_fail_rubric_signal"]
    assert new["pool/added"] > old["pool/added"] and new["pool/retired"] > old["pool/retired"]


def test_figures_agree_with_the_per_step_rows(reports):
    rep = reports[True]
    rows = rep.per_step
    assert len(rows) == 60 and rep.figures["steps"] == 60
    eff = [r["effective_batch"] for r in rows]
    assert rep.figures["effective_batch"] == pytest.approx(np.mean(eff))
    assert all(1.0 <= e <= 16.0 for e in eff)
    assert rep.figures["pool/live"] == rows[-1]["pool/live"] <= 8
    assert rep.figures["pool/full_frac"] == np.mean([r["pool/live"] >= 8 for r in rows])
    mix = {k: v for k, v in rep.figures.items() if k.startswith("env_mix/")}
    assert sum(mix.values()) == pytest.approx(1.0)
    held = {k: v for k, v in rep.figures.items() if k.startswith("heldout_mix/")}
    assert sum(held.values()) == pytest.approx(1.0)
    tv = sum(abs(mix[k] - held[k.replace("env_mix", "heldout_mix")]) for k in mix) / 2
    assert rep.figures["env_mix_tv"] == pytest.approx(tv)
    assert 0 < rep.figures["all_fail_groups"] < 1


def test_the_check_is_deterministic_and_runs_any_method():
    c = grpo.get_config("smoke")
    a = run_check(c, ScriptedPolicy(), 5)
    b = run_check(c, ScriptedPolicy(), 5)
    assert a.figures == b.figures and a.per_step == b.per_step
    assert not any(k.startswith("pool/") for k in a.figures)  # GRPO has no pool
    assert a.figures["effective_batch_frac"] == 1.0
    # The seed rubric varies in some all-failure groups (its partial-credit criteria).
    assert 0 <= a.figures["all_fail_rubric_signal"] <= 1
