"""Self-distillation plumbing (DESIGN §3–5): controllers' ``teacher_context`` / ``sd_gate`` reach
the train step as teacher rows aligned to the student's own completion, λ per group, and a step
with no context has an SD term of exactly 0."""

import numpy as np
import pytest

from configs import grpo
from rubric_rl.config.builders import build_domain
from rubric_rl.controllers.base import Controller
from rubric_rl.loop.trainer_batch import build_train_batch
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.rollout.scripted import ScriptedEngine, prompt_words
from tests.trainer_spy import one_device, record_train_batches, serve_scripted

CONTEXT = "<coach> remember : end with ? </coach>"


def _traj(toks, teacher=None, sd_mask=None, coef=0.0):
    t = Trajectory(tuple(toks), tuple(-0.5 for _ in toks), "stop", 0, "", sd_mask=sd_mask)
    t.teacher_prompt_ids, t.sd_coef = (tuple(teacher) if teacher else None), coef
    return t


def _groups(trajs_a, trajs_b):
    tasks = build_domain(grpo.get_config("smoke")).train[:2]
    return [
        Group(tasks[0], prompt_ids=(5, 6, 7), trajectories=trajs_a),
        Group(tasks[1], prompt_ids=(8,), trajectories=trajs_b),
    ]


def test_teacher_rows_align_with_the_student_completion_per_rollout():
    # Per-rollout contexts: rows 0 and 3 have one (of different lengths), rows 1 and 2 none.
    groups = _groups(
        [_traj([11, 12], (5, 6, 7, 90, 91), coef=0.5), _traj([13, 14, 15])],
        [_traj([16]), _traj([17, 18], (70, 8), coef=0.7)],
    )
    tb = build_train_batch(
        Rollouts(1, groups), prompt_len=4, buckets=(4,), pad_id=0, teacher_prompt_len=6,
        with_teacher=True,
    )  # fmt: skip
    tids = np.asarray(tb.teacher_input_ids)
    assert tids.shape == (4, 10)  # teacher prompt 6 + the same completion bucket 4
    np.testing.assert_array_equal(tids[0], [0, 5, 6, 7, 90, 91, 11, 12, 0, 0])
    np.testing.assert_array_equal(tids[1], [0, 0, 0, 5, 6, 7, 13, 14, 15, 0])  # no context
    np.testing.assert_array_equal(tids[2], [0, 0, 0, 0, 0, 8, 16, 0, 0, 0])  # no context
    np.testing.assert_array_equal(tids[3], [0, 0, 0, 0, 70, 8, 17, 18, 0, 0])
    np.testing.assert_array_equal(np.asarray(tb.teacher_attention_mask)[0], [0] + [1] * 7 + [0, 0])
    np.testing.assert_array_equal(np.asarray(tb.teacher_positions)[0, 1:8], np.arange(7))
    np.testing.assert_array_equal(np.asarray(tb.teacher_offset), [2, 2, 2, 2])
    np.testing.assert_array_equal(np.asarray(tb.sd_mask), [1, 0, 0, 1])
    np.testing.assert_allclose(np.asarray(tb.sd_coef), [0.5, 0.0, 0.0, 0.7])
    # Student position t <-> teacher t + offset on every completion token (prediction layout:
    # the loss entry at t is about input token t + 1).
    ids, lm, off = np.asarray(tb.input_ids), np.asarray(tb.loss_mask), 2
    for r in range(4):
        for t in np.nonzero(lm[r])[0]:
            assert tids[r, t + 1 + off] == ids[r, t + 1]
    # A row without context sees the student's exact prompt.
    am = np.asarray(tb.attention_mask)
    for r in (1, 2):
        student = ids[r, :4][am[r, :4] == 1].tolist()
        tam = np.asarray(tb.teacher_attention_mask)[r, :6]
        assert tids[r, :6][tam == 1].tolist() == student
    with pytest.raises(ValueError, match="teacher_prompt_len 3 < the student's prompt_len 4"):
        build_train_batch(
            Rollouts(1, groups), prompt_len=4, buckets=(4,), pad_id=0, teacher_prompt_len=3,
            with_teacher=True,
        )  # fmt: skip
    long = _groups([_traj([11], tuple(range(1, 9)), coef=1.0)], [_traj([16])])
    with pytest.raises(ValueError, match=r"teacher prompt of task .*8 tokens > .* 6"):
        build_train_batch(
            Rollouts(1, long), prompt_len=4, buckets=(4,), pad_id=0, teacher_prompt_len=6,
            with_teacher=True,
        )  # fmt: skip


def test_final_turn_only_sd_masks_every_earlier_token():
    # An agent rollout: model turn (2 tokens), tool output (2 tokens, loss mask 0), final turn
    # (2 tokens). Distilling only the final turn: the per-token SD mask is 1 on its tokens only.
    agent = Trajectory(
        (11, 12, 90, 91, 13, 14), (-0.5,) * 6, "stop", 0, "",
        loss_mask=(1, 1, 0, 0, 1, 1), sd_mask=(0, 0, 0, 0, 1, 1),
    )  # fmt: skip
    agent.teacher_prompt_ids, agent.sd_coef = (5, 6, 7, 99), 1.0
    groups = _groups([agent, _traj([13, 14, 15], (5, 6, 7, 98), coef=1.0)], [_traj([16])] * 2)
    tb = build_train_batch(
        Rollouts(1, groups), prompt_len=4, buckets=(8,), pad_id=0, teacher_prompt_len=4,
        with_teacher=True,
    )  # fmt: skip
    sd, lm = np.asarray(tb.sd_mask), np.asarray(tb.loss_mask)
    assert sd.shape == lm.shape  # [B, T]
    # Completion token i sits at loss entry prompt_len - 1 + i = 3 + i.
    np.testing.assert_array_equal(sd[0, 3:9], [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(lm[0, 3:9], [1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(sd[1], lm[1])  # no per-token mask: every loss token
    assert sd[2].sum() == 0 and sd[3].sum() == 0  # no context: exactly 0
    assert not np.any(sd * (1 - lm))  # never on a token that is not trained


class _Coach(Controller):
    """Privileged context for even task slots, gated per group; ``on`` switches it off."""

    name = "coach"

    def __init__(self):
        self.on = True

    def teacher_context(self, task, evidence):
        idx = evidence.tasks.index(task)
        return CONTEXT if self.on and idx % 2 == 0 else None

    def sd_gate(self, evidence):
        return np.linspace(0.5, 1.0, len(evidence.tasks))


@pytest.fixture(scope="module")
def sd_trainer(tmp_path_factory):
    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke")
    c.warmstart.steps = 0
    c.eval.update(at_start=False, every=0)
    c.loss.update(sd_estimator="full", sd_coef=0.5)
    c.optim.mini_batches = 1  # the spy below sees the whole step's batch in one update
    coach = _Coach()
    t = Trainer(
        c, str(tmp_path_factory.mktemp("sd")), extra_controllers=[coach], devices=one_device()
    )
    serve_scripted(t, ScriptedEngine(t.tokenizer, prompt_words))  # no generation compiled
    t._restore_or_warmstart(resume=False)
    seen = record_train_batches(t)
    yield t, coach, seen
    t.close()


def test_controller_context_reaches_the_train_step(sd_trainer):
    t, coach, seen = sd_trainer
    m = t.train_one_step()
    tb = seen[-1]
    g_n, j_n = int(t.config.rollout.tasks_per_step), int(t.config.rollout.samples_per_task)
    has = np.repeat(np.arange(g_n) % 2 == 0, j_n)
    np.testing.assert_array_equal(np.asarray(tb.sd_mask), has.astype(np.float32))
    gate = np.repeat(np.linspace(0.5, 1.0, g_n), j_n)
    np.testing.assert_allclose(np.asarray(tb.sd_coef), np.where(has, 0.5 * gate, 0.0), rtol=1e-6)
    ids, tids = np.asarray(tb.input_ids), np.asarray(tb.teacher_input_ids)
    tattn = np.asarray(tb.teacher_attention_mask)
    # The student's prompt bucket: the loss mask of a row starts at prompt_len - 1.
    lm = np.asarray(tb.loss_mask)
    p = int(np.argmax(lm[lm.sum(1) > 0][0] > 0)) + 1
    assert p in (32, 64)
    offset = int(np.asarray(tb.teacher_offset)[0])
    tp = p + offset
    assert tp in (32, 64, int(t.config.model.max_teacher_prompt_len))  # a teacher bucket
    assert tids.shape[1] == tp + ids.shape[1] - p
    np.testing.assert_array_equal(tids[:, tp:], ids[:, p:])  # the student's own completion
    ctx_ids = t.tokenizer.encode(CONTEXT)
    for r in range(len(ids)):
        prompt = tids[r, :tp][tattn[r, :tp] == 1].tolist()
        student = ids[r, :p][np.asarray(tb.attention_mask)[r, :p] == 1].tolist()
        contains = any(prompt[i : i + len(ctx_ids)] == ctx_ids for i in range(len(prompt)))
        assert contains == bool(has[r]), r
        if not has[r]:
            assert prompt == student  # no context: the teacher sees the student's exact input
    assert m["sd/context_frac"] == pytest.approx(0.5)
    assert np.isfinite(m["loss/sd"]) and m["loss/sd"] > 0


def test_no_context_gives_an_sd_term_of_exactly_zero(sd_trainer):
    t, coach, seen = sd_trainer
    coach.on = False
    try:
        m = t.train_one_step()
    finally:
        coach.on = True
    assert float(np.asarray(seen[-1].sd_mask).sum()) == 0.0
    assert m["loss/sd"] == 0.0


def test_per_rollout_contexts_in_the_system_message_reach_the_train_step(sd_trainer):
    """A method's own teacher stage: a context per rollout (odd samples only), placed in the
    system message (ARISE-RL places its memory there)."""
    from rubric_rl import step as stages

    t, coach, seen = sd_trainer

    def teacher(rollouts, ctx):
        for g in rollouts.groups:
            for j, tr in enumerate(g.trajectories):
                if j % 2:
                    tr.teacher_placement = "system"
                    tr.teacher_prompt = stages.with_context(g.messages, CONTEXT, "system", "t")
        return rollouts

    saved = t.pipeline
    t.pipeline = saved.replace("teacher", teacher)
    try:
        m = t.train_one_step()
    finally:
        t.pipeline = saved
    tb = seen[-1]
    j_n = int(t.config.rollout.samples_per_task)
    has = np.arange(tb.input_ids.shape[0]) % j_n % 2 == 1
    np.testing.assert_array_equal(np.asarray(tb.sd_mask), has.astype(np.float32))
    ids, tids = np.asarray(tb.input_ids), np.asarray(tb.teacher_input_ids)
    tattn, lm = np.asarray(tb.teacher_attention_mask), np.asarray(tb.loss_mask)
    off = np.asarray(tb.teacher_offset)
    sys_msg = [{"role": "system", "content": CONTEXT}]
    sys_ctx = t.tokenizer.apply_chat_template(sys_msg, add_generation_prompt=False)
    for r in range(len(ids)):
        for p in np.nonzero(lm[r])[0]:  # every completion token, per rollout
            assert tids[r, p + 1 + off[r]] == ids[r, p + 1]
        p0 = int(np.argmax(tattn[r]))
        row = tids[r, p0 : p0 + len(sys_ctx)].tolist()
        assert (row == list(sys_ctx)) == bool(has[r]), r  # the system message comes first
    assert np.isfinite(m["loss/sd"]) and m["loss/sd"] > 0
