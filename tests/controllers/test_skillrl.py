"""SkillRL with the programmatic teacher (rubric_rl/methods/harness_rl/skillrl.py) on the scripted
stand-in policy through the real stages and judge: the bank distilled from the first step's
rollouts, retrieval into the trained prompt, evolution of failing categories, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import grpo
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.methods.harness_rl.skillrl import (
    SkillRLConfig,
    SkillRLController,
    category_of,
    failure_rates,
    kind_of,
)
from rubric_rl.methods.harness_rl.style import generic_style


def test_kinds_and_failure_rates():
    assert kind_of("end:!") == "end" and kind_of("distinct") == "distinct"
    rates = failure_rates({"a": (1, 4), "b": (3, 4), "c": (3, 4), "d": (0, 0)})
    assert rates == [("b", 0.75), ("c", 0.75), ("a", 0.25)]  # unseen kinds left out
    with pytest.raises(ValueError, match="threshold"):
        SkillRLConfig(threshold=1.5)
    with pytest.raises(ValueError, match="checker library"):
        SkillRLController(SkillRLConfig(), generic_style(), None)


def _config(**skill):
    c = grpo.get_config("smoke,skillrl")
    c.unlock()
    c.rollout.update(tasks_per_step=8, samples_per_task=8)
    c.domain.n_train = 48
    c.skillrl.update(**skill)
    c.lock()
    return c


def _skill(run):
    return next(x for x in run.controllers.controllers if isinstance(x, SkillRLController))


def _library_failures(run, r, ctl):
    """Per category and kind: (failed, judged) of the step's rollouts on the library criteria,
    judged afresh through the services (the reference the bank must follow)."""
    out: dict[str, dict[str, list[int]]] = {}
    for g in r.groups:
        lib = [c for c in ctl.library(g.task) if c.weight > 0]
        rows = run.services.judge([g.task], [[t.response for t in g.trajectories]], [lib])[0]
        per = out.setdefault(category_of(g.task), {})
        for k, c in enumerate(lib):
            met = [row[k].met for row in rows if row[k].met is not None]
            f, n = per.get(kind_of(c.id), (0, 0))
            per[kind_of(c.id)] = (f + sum(not m for m in met), n + len(met))
    return out


def test_bank_from_the_first_step_then_skills_in_the_trained_prompt(tmp_path):
    run = scripted_run(_config(), ScriptedPolicy(seed=0), str(tmp_path))
    ctl = _skill(run)
    r1, ctx1 = run.step(1)
    assert ctx1.metrics["skillrl/shown_per_task"] == 0.0  # no bank before the first rollouts
    ref = _library_failures(run, r1, ctl)
    for cat, stats in ref.items():
        want = [k for k, rate in failure_rates(stats) if rate >= 0.5][:3]
        assert [s["kind"] for s in ctl.bank.get(cat, [])] == want, cat
    assert sum(len(v) for v in ctl.bank.values()) > 0
    r2, ctx2 = run.step(2)
    mounted = 0
    for g in r2.groups:
        skills = ctl.skills_for(g.task)
        kinds = [s["kind"] for s in ctl.bank.get(category_of(g.task), [])]
        assert [kind_of(c.id) for c in skills] == [k for k in kinds if k in
                                                   {kind_of(c.id) for c in skills}]  # fmt: skip
        assert len(skills) <= 3
        text = g.messages[-1]["content"]
        for c in skills:
            assert c.text in text  # the task's own requirement, written as guidance
        # The decorated prompt is the one trained.
        assert g.prompt_ids == run.services.encode_prompt(g.messages, "x")
        mounted += bool(skills)
    assert mounted > 0
    assert ctx2.metrics["skillrl/shown_per_task"] == pytest.approx(
        np.mean([len(ctl.skills_for(g.task)) for g in r2.groups])
    )


def test_failing_categories_get_new_skills_they_failed(tmp_path):
    # threshold 1: every category counts as failing; evolve after every 2 steps.
    run = scripted_run(_config(update_every=2, threshold=1.0), ScriptedPolicy(seed=0),
                       str(tmp_path))  # fmt: skip
    ctl = _skill(run)
    window: dict[str, dict[str, list[int]]] = {}
    for step in (1, 2):
        r, _ = run.step(step)
        if step == 1:  # the bank the evolution at the end of step 2 starts from
            before = {k: [s["kind"] for s in v] for k, v in ctl.bank.items()}
        for g in r.groups:  # failed rollouts only, as the controller reads them
            lib = [c for c in ctl.library(g.task) if c.weight > 0]
            rows = run.services.judge([g.task], [[t.response for t in g.trajectories]], [lib])[0]
            per = window.setdefault(category_of(g.task), {})
            failed = [j for j, t in enumerate(g.trajectories) if t.signals["task_verifier"] <= 0.5]
            for j in failed[:10]:
                for k, c in enumerate(lib):
                    if rows[j][k].met is None:
                        continue
                    f, n = per.get(kind_of(c.id), (0, 0))
                    per[kind_of(c.id)] = (f + (not rows[j][k].met), n + 1)
    events = [e for e in ctl.pop_events() if e["event"] == "evolve"]
    assert events and ctl.n_dynamic == sum(len(e["added"]) for e in events)
    for e in events:
        have = before.get(e["category"], [])
        want = [k for k, rate in failure_rates(window[e["category"]]) if rate > 0 and k not in
                have][:3]  # fmt: skip
        assert e["added"] == want
        assert [s["kind"] for s in ctl.bank[e["category"]]] == have + want
    assert any(s["source"].startswith("dyn_") for v in ctl.bank.values() for s in v)


def test_resume_replays_the_uninterrupted_bank(tmp_path):
    c = _config(update_every=2, threshold=1.0)
    full = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path / "a"))
    metrics = []
    for step in range(1, 6):
        _, ctx = full.step(step)
        if step == 3:
            state = json.loads(json.dumps(full.controllers.state_dict()))
        if step > 3:
            metrics.append({k: v for k, v in ctx.metrics.items() if k.startswith("skillrl/")})
    again = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path / "b"))
    again.controllers.load_state_dict(state)
    replay = []
    for step in (4, 5):
        _, ctx = again.step(step)
        replay.append({k: v for k, v in ctx.metrics.items() if k.startswith("skillrl/")})
    assert replay == metrics
    assert json.dumps(_skill(again).state_dict(), sort_keys=True) == json.dumps(
        _skill(full).state_dict(), sort_keys=True
    )
