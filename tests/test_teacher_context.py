"""Self-distillation plumbing (DESIGN §3–5): controllers' ``teacher_context`` / ``sd_gate`` reach
the train step as teacher rows aligned to the student's own completion, λ per group, and a step
with no context has an SD term of exactly 0."""

import numpy as np
import pytest

from configs import grpo
from rubric_rl.controllers.base import Controller
from rubric_rl.rollout.engine import Generation, GenerationRequest
from rubric_rl.trainer_batch import build_train_batch

CONTEXT = "<coach> remember : end with ? </coach>"


def test_teacher_rows_align_with_the_student_completion():
    reqs = [GenerationRequest((5, 6, 7), "a"), GenerationRequest((8,), "b")]

    def gen(toks):
        return Generation(tuple(toks), tuple(-0.5 for _ in toks), "stop", weight_version=0)

    gens = [[gen([11, 12]), gen([13, 14, 15])], [gen([16]), gen([17, 18])]]
    ones = np.ones((2, 2), bool)
    tb = build_train_batch(
        reqs, gens, np.zeros((2, 2)), np.ones(2), ones, prompt_len=4, buckets=(4,), pad_id=0,
        teacher_prompts=[(5, 6, 7, 90, 91), None], sd_coef=np.array([0.5, 0.7]),
        teacher_prompt_len=6,
    )  # fmt: skip
    tids = np.asarray(tb.teacher_input_ids)
    assert tids.shape == (4, 10)  # teacher prompt 6 + the same completion bucket 4
    np.testing.assert_array_equal(tids[1], [0, 5, 6, 7, 90, 91, 13, 14, 15, 0])
    np.testing.assert_array_equal(tids[2], [0, 0, 0, 0, 0, 8, 16, 0, 0, 0])  # no context
    np.testing.assert_array_equal(np.asarray(tb.teacher_attention_mask)[1], [0] + [1] * 8 + [0])
    np.testing.assert_array_equal(np.asarray(tb.teacher_positions)[1, 1:9], np.arange(8))
    np.testing.assert_array_equal(np.asarray(tb.teacher_offset), [2, 2, 2, 2])
    np.testing.assert_array_equal(np.asarray(tb.sd_mask), [1, 1, 0, 0])
    np.testing.assert_allclose(np.asarray(tb.sd_coef), [0.5, 0.5, 0.0, 0.0])
    # Student position t <-> teacher t + offset on every completion token (prediction layout).
    ids, off = np.asarray(tb.input_ids), 2
    for r in range(4):
        for t in range(4, 8):
            assert tids[r, t + off] == ids[r, t]
    with pytest.raises(ValueError, match="teacher_prompt_len 3 < the student's prompt_len 4"):
        build_train_batch(
            reqs, gens, np.zeros((2, 2)), np.ones(2), ones, prompt_len=4, buckets=(4,), pad_id=0,
            teacher_prompts=[None, None], teacher_prompt_len=3,
        )  # fmt: skip


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
    t = Trainer(c, str(tmp_path_factory.mktemp("sd")), extra_controllers=[coach])
    t._restore_or_warmstart(resume=False)
    seen = []
    real = t.train_step

    def spy(state, batch, ref_params=None):
        seen.append(batch)
        return real(state, batch, ref_params)

    spy.compute_logps = real.compute_logps
    t.train_step = spy
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
