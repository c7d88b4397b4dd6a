"""Calibration before RL (rubric_rl/pre_rl/calibration.py): written once at step 1 from the policy
RL starts from, recomputable from the rollouts it records, and invisible to training. The runs are
the GRPO pipeline on a scripted engine (rubric_rl/rollout/scripted.py): nothing compiled."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import grpo
from rubric_rl.checks.controller_check import scripted_run
from rubric_rl.config.config_validation import validate_config
from rubric_rl.envs.constraint_lexicon import SKILL_TEXTS
from rubric_rl.envs.constraint_library import library_criteria
from rubric_rl.envs.constraints import ConstraintDomain, skill_guidance, verify
from rubric_rl.pre_rl import calibration
from rubric_rl.rollout.scripted import ScriptedEngine, prompt_words


def _config(enabled: bool):
    c = grpo.get_config("smoke")
    c.warmstart.steps = 0
    c.eval.update(at_start=False, every=0)
    c.train.steps = 2
    c.calibration.enabled = enabled
    return c


def _run(config, workdir):
    """Steps 1 and 2 of the GRPO pipeline (real controllers, services, judge; nothing trained)
    on the scripted policy; (each step's metrics and Rollouts, the run)."""
    run = scripted_run(
        config, None, str(workdir), engine=lambda tok: ScriptedEngine(tok, prompt_words)
    )
    steps = []
    for step in (1, 2):
        rollouts, ctx = run.step(step)
        steps.append((dict(run.metrics(rollouts, ctx), step=step), rollouts))
    return steps, run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibration")
    with_cal, run = _run(_config(True), root / "on")
    without, _ = _run(_config(False), root / "off")
    return with_cal, without, root / "on", run


def test_written_once_and_recomputable_from_its_rollouts(runs):
    steps, _, workdir, trainer = runs
    rows = [m for m, _ in steps]
    fig = calibration.read(str(workdir))
    n_tasks, j = 8, int(trainer.config.rollout.samples_per_task)
    assert len(fig["tasks"]) == n_tasks and fig["rollouts_per_task"] == j
    tasks = {t.id: t for t in trainer.domain.train}
    for arm in ("unguided", "guided"):
        a = fig[arm]
        assert len(a["rollouts"]) == n_tasks * j
        # Recompute every figure from the recorded rollouts and the seed rubrics.
        met, cnt, ok = {}, {}, []
        for r in a["rollouts"]:
            task = tasks[r["task"]]
            ok.append(float(verify(task, r["response"])))
            # Judged: the seed rubric plus the library's implicit requirements it lacks.
            weights = {c.id: c.weight for c in library_criteria(task)}
            weights |= {c.id: c.weight for c in task.rubric.criteria}
            for cid, m in r["verdicts"].items():
                if m is None:
                    continue
                sat = m if weights[cid] > 0 else not m
                met[cid] = met.get(cid, 0) + sat
                cnt[cid] = cnt.get(cid, 0) + 1
        assert a["task_pass_rate"] == pytest.approx(np.mean(ok))
        groups = np.array(ok).reshape(n_tasks, j)
        assert a["all_fail_groups"] == pytest.approx(np.mean(~groups.any(axis=1)))
        assert {c: v["pass_rate"] for c, v in a["criteria"].items()} == pytest.approx(
            {c: met[c] / cnt[c] for c in met}
        )
        assert {c: v["verdicts"] for c, v in a["criteria"].items()} == cnt
        assert cnt["plain"] == n_tasks * j  # every task's implicit "plain" is measured
    # The guided arm's prompts carry the skills; the two arms sample different text.
    assert [r["response"] for r in fig["guided"]["rollouts"]] != [
        r["response"] for r in fig["unguided"]["rollouts"]
    ]
    want_never = sorted(
        c
        for c, v in fig["unguided"]["criteria"].items()
        if calibration.genuine(v["weight"]) and v["pass_rate"] == 0
    )
    assert fig["never_met"] == want_never
    # Logged at step 1 only, with the file's numbers.
    by_step = {r["step"]: r for r in rows}
    assert by_step[1]["calibration/never_met"] == len(want_never)
    assert by_step[1]["calibration/unguided/task_pass_rate"] == fig["unguided"]["task_pass_rate"]
    assert not any(k.startswith("calibration/") for k in by_step[2])
    assert trainer.controllers.controllers[-1].done


def test_training_is_unchanged_by_calibration(runs):
    """What each step trains on (tasks, sampled tokens, seeds, rewards, advantages) and its
    metrics are the same with and without calibration: its rollouts draw from their own seed
    stream and its task draw from its own seed."""
    with_cal, without, _, _ = runs
    assert len(with_cal) == len(without) == 2
    for (a, ra), (b, rb) in zip(with_cal, without):
        shared = [k for k in b if not k.startswith(("time/", "perf/"))]
        assert {k: a[k] for k in shared} == {k: b[k] for k in shared}
        assert [t.id for t in ra.tasks] == [t.id for t in rb.tasks]
        for ga, gb in zip(ra.groups, rb.groups, strict=True):
            assert [(t.tokens, t.seed) for t in ga.trajectories] == [
                (t.tokens, t.seed) for t in gb.trajectories
            ]
        np.testing.assert_array_equal(ra.rewards, rb.rewards)
        np.testing.assert_array_equal(ra.advantages, rb.advantages)


def test_probe_set_is_fixed_by_its_own_seed():
    tasks = ConstraintDomain(0).tasks("train", 100)
    a = calibration.CalibrationController(tasks, 16, seed=3)
    b = calibration.CalibrationController(tasks, 16, seed=3)
    c = calibration.CalibrationController(tasks, 16, seed=4)
    assert [t.id for t in a.tasks] == [t.id for t in b.tasks] != [t.id for t in c.tasks]
    assert len({t.id for t in a.tasks}) == 16
    assert len(calibration.CalibrationController(tasks, 500).tasks) == 100
    state = json.loads(json.dumps({**a.state_dict(), "done": True}))
    a.load_state_dict(state)
    assert a.done and a.observe(None) == {}  # a resumed run does not measure again


def test_genuine_weights_and_skill_guidance():
    assert calibration.genuine(1.0) and calibration.genuine(3.0) and calibration.genuine(-2.0)
    assert not calibration.genuine(0.1) and not calibration.genuine(0.0)
    task = next(t for t in ConstraintDomain(0).tasks("train", 50) if len(t.capabilities) >= 2)
    guided = skill_guidance(task)[-1]["content"]
    assert guided.startswith(task.messages[-1]["content"])
    assert "<skills>" in guided
    for cap in task.capabilities:
        assert SKILL_TEXTS[cap].split()[0] in guided


def test_validation_names_the_field():
    c = _config(True)
    c.calibration.tasks = 0
    with pytest.raises(ValueError, match="config.calibration.tasks"):
        validate_config(c, num_devices=8)
