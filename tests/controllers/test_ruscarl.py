"""RuscaRL's scaffold (rubric_rl/methods/harness_rl/ruscarl.py): the schedule against its
formulas, the per-sample prompts, the generate stage's behaviour prompts, and — through the real
trainer — that the loss is taken on the unscaffolded prompt with π_old recomputed there."""

from __future__ import annotations

import math

import numpy as np
import pytest

from configs import grpo, harness_rl
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.config.builders import build_domain
from rubric_rl.controllers.base import Controller, ControllerSet
from rubric_rl.loop.trainer_batch import build_train_batch
from rubric_rl.methods.harness_rl.ruscarl import (
    RuscaRLConfig,
    RuscaRLController,
    group_ratio,
    shown_count,
    step_ratio,
)
from rubric_rl.methods.harness_rl.style import style_for
from tests.trainer_spy import one_device


def test_schedule_matches_the_released_formulas():
    # λ_group, linear: (G − 1 − i)/(G − 1); binary: the first full_reveal_count see all.
    assert [group_ratio(i, 8) for i in range(8)] == [(7 - i) / 7 for i in range(8)]
    assert [group_ratio(i, 4, "binary", 2) for i in range(4)] == [1, 1, 0, 0]
    # λ_step, sigmoid: x = (t − 1)/(T − 1); 1/(1 + exp(κ (x − x0))).
    for t in (1, 30, 31, 40, 150):
        x = (t - 1) / 149
        assert step_ratio(t, 150) == pytest.approx(1 / (1 + math.exp(125 * (x - 0.2))))
    assert step_ratio(1, 150) > 0.99999 and step_ratio(150, 150) < 1e-40
    assert step_ratio(150, 150, kappa=1e4) == 0.0  # exp would overflow: exactly 0
    assert step_ratio(38, 150, x0=0.25, kappa=10) == pytest.approx(0.5, abs=0.02)
    assert step_ratio(51, 101, "linear") == pytest.approx(0.5)
    assert step_ratio(99, 100, "none") == 1.0
    # m = round(K · ratio), half to even as Python's round.
    assert [shown_count(5, r) for r in (0.0, 0.1, 0.3, 0.5, 1.0)] == [0, 0, 2, 2, 5]
    with pytest.raises(ValueError, match="group_rule"):
        RuscaRLConfig(total_steps=10, group_rule="nope")


@pytest.fixture(scope="module")
def domain():
    return build_domain(grpo.get_config("smoke"))


def test_sample_prompts_shrink_within_the_group_and_over_training(domain):
    style = style_for(domain)
    ctl = RuscaRLController(RuscaRLConfig(total_steps=100, max_shown=3, seed=0), style)
    tasks = list(domain.train[:4])
    prompts = [t.messages for t in tasks]
    out = ctl.sample_prompts(1, tasks, prompts, 8)
    assert out is not None and len(out) == 4
    for task, per in zip(tasks, out, strict=True):
        crits = task.rubric.evaluated().criteria
        assert len(per) == 8
        assert per[-1] == task.messages  # the last sample sees nothing
        first = per[0][-1]["content"]
        # The first sample sees min(K, 3) of the task's criteria, as the domain writes them.
        shown = ctl.shown(1, task, 0, len(crits))
        assert len(shown) == min(len(crits), 3)
        assert per[0] == style.mount(task, {"criterion": [
            style.hint(crits[k].text, crits[k].weight) for k in shown]})  # fmt: skip
        assert first.startswith(task.messages[-1]["content"]) and "<criterion>" in first
        # Fewer criteria further down the group: m_i = min(round(K (7 - i)/7 λ_step), 3).
        lam = step_ratio(1, 100)
        m = [min(shown_count(len(crits), (7 - i) / 7 * lam), 3) for i in range(8)]
        assert m == sorted(m, reverse=True) and m[0] > 0 and m[-1] == 0
        for i in range(8):
            n_shown = 0 if per[i] == task.messages else per[i][-1]["content"].count(" ; ") + 1
            assert n_shown == m[i]
    # Deterministic, and late in training (λ_step ≈ 0) nothing is scaffolded.
    assert ctl.sample_prompts(1, tasks, prompts, 8) == out
    assert ctl.sample_prompts(60, tasks, prompts, 8) is None
    with pytest.raises(ValueError, match="decorated by another controller"):
        ctl.sample_prompts(1, tasks[:1], [[{"role": "user", "content": "other"}]], 8)


class _Scaffold(Controller):
    def __init__(self, name, per):
        self.name, self.per = name, per

    def sample_prompts(self, step, tasks, prompts, n):
        return self.per(tasks, n)


def test_controller_set_composes_and_checks_behaviour_prompts(domain):
    tasks = list(domain.train[:2])
    msgs = [t.messages for t in tasks]
    one = _Scaffold("a", lambda ts, n: [[m] * n if i == 0 else None for i, m in enumerate(msgs)])
    other = _Scaffold("b", lambda ts, n: [None, [msgs[1]] * n])
    got = ControllerSet(Controller(), [one, other]).sample_prompts(1, tasks, msgs, 2)
    assert got == [[msgs[0]] * 2, [msgs[1]] * 2]
    both = _Scaffold("c", lambda ts, n: [[msgs[0]] * n, None])
    with pytest.raises(ValueError, match="both 'a' and 'c'"):
        ControllerSet(Controller(), [one, both]).sample_prompts(1, tasks, msgs, 2)
    short = _Scaffold("d", lambda ts, n: [[msgs[0]], None])
    with pytest.raises(ValueError, match="1 behaviour prompts"):
        ControllerSet(Controller(), [short]).sample_prompts(1, tasks, msgs, 2)


def test_generate_samples_each_rollout_from_its_scaffold_and_trains_the_plain_prompt(tmp_path):
    c = grpo.get_config("smoke,ruscarl")
    c.unlock()
    c.rollout.update(tasks_per_step=4, samples_per_task=8)
    c.train.steps = 100
    c.lock()
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path))
    r, _ = run.step(1)
    enc = run.services.encode_prompt
    scaffolded = 0
    for g in r.groups:
        assert g.prompt_ids == enc(g.task.messages, "x")  # the trained prompt: unscaffolded
        assert [t.sample_index for t in g.trajectories] == list(range(8))
        for t in g.trajectories:
            assert t.info["scaffolded"] == (t.info["behaviour_prompt_ids"] != g.prompt_ids)
            scaffolded += t.info["scaffolded"]
        assert g.trajectories[0].info["scaffolded"] and not g.trajectories[-1].info["scaffolded"]
    assert scaffolded > len(r.groups)
    tb = build_train_batch(r, prompt_len=64, buckets=(8, 16, 32), pad_id=0)
    ids = np.asarray(tb.input_ids)
    rows = [g for g in r.groups for _ in g.trajectories]
    for row, g in enumerate(rows):
        assert tuple(ids[row, 64 - len(g.prompt_ids) : 64]) == g.prompt_ids


def test_the_trainer_recomputes_pi_old_on_the_unscaffolded_prompt(tmp_path):
    """One RuscaRL step through the real trainer: the batch's prompts are the tasks' own, π_old
    is the step-start forward on them (ratio 1 at the first update), and the engine's log-probs
    of the scaffolded samples — taken under another prompt — differ from it."""
    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke,ruscarl")
    c.warmstart.steps = 0
    c.eval.update(at_start=False, every=0)
    c.calibration.enabled = False
    c.optim.mini_batches = 1
    c.train.steps = 100
    c.model.prompt_buckets = ()  # one prompt shape (the cap) to compile
    assert c.loss.rollout_correction == "off"
    t = Trainer(c, str(tmp_path / "run"), devices=one_device())
    try:
        t._restore_or_warmstart(resume=False)
        real, seen = t.train_step, []

        def spy(state, batch, ref_params=None):  # the one update of the step: π at step start
            seen.append((batch, np.asarray(real.compute_logps(state, batch))))
            return real(state, batch, ref_params)

        spy.compute_logps = real.compute_logps
        t.train_step = spy
        m = t.train_one_step()
        ((tb, start),) = seen
        mask = np.asarray(tb.loss_mask) > 0
        old, roll = np.asarray(tb.old_logps), np.asarray(tb.rollout_logps)
        np.testing.assert_allclose(old[mask], start[mask], atol=1e-5)  # π_old: trained prompt
        assert np.abs(old - roll)[mask].max() > 1e-2  # the behaviour prompt was another
        assert m["train/actor/ratio"] == pytest.approx(1.0, abs=1e-4)
    finally:
        t.close()
    c = grpo.get_config("smoke,ruscarl")
    c.loss.rollout_correction = "bypass"
    with pytest.raises(ValueError, match="rollout_correction='bypass' with config.ruscarl"):
        Trainer(c, str(tmp_path / "bad"))


def test_the_rollout_switching_arm_replaces_the_harness_guidance(tmp_path):
    pytest.importorskip("chromadb")
    c = harness_rl.get_config("smoke,switch=g")
    assert (c.harness.rollout_rule, c.loss.rollout_correction) == ("ruscarl", "off")
    c.unlock()
    c.rollout.update(tasks_per_step=8, samples_per_task=8)
    c.domain.n_train = 32
    c.train.steps = 40
    c.lock()
    run = scripted_run(c, ScriptedPolicy(seed=0), str(tmp_path))
    names = [x.name for x in run.controllers.controllers]
    assert names[:2] == ["harness", "ruscarl"]
    for step in range(1, 4):
        r, ctx = run.step(step)
        assert ctx.metrics["harness/updates/rollout/proposed"] == 0
        assert not any(st.fields for st in run.controllers.sampler.state.values())
        assert any(t.info.get("scaffolded") for g in r.groups for t in g.trajectories)
