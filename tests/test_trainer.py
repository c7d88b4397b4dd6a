"""End to end: the smoke config through ``python -m rubric_rl.launch``; SIGKILL + --resume equals
the uninterrupted run; a judge that fails every call stops the run naming the judge."""

import glob
import gzip
import json
import math
import os
import subprocess
import sys

import pytest

from configs import grpo
from rubric_rl.metrics import read_metrics
from rubric_rl.rollout.scripted import ScriptedEngine
from rubric_rl.rubrics.judges import Judge
from rubric_rl.rubrics.types import verdict_failed
from tests.launch_env import kill_then_resume, launch_env, metric_diffs
from tests.trainer_spy import one_device, serve_scripted, short_words

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 5


def _cmd(workdir, *extra):
    return [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke",
        f"--config.train.steps={STEPS}", f"--workdir={workdir}", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    env = launch_env(base / "jax_cache")
    full, killed = base / "full", base / "killed"
    subprocess.run(_cmd(full), cwd=REPO, env=env, check=True, timeout=600, capture_output=True)
    # Killed once step 3 is logged and the step-2 checkpoint is complete: 3 (and 4, if logged)
    # must be replayed.
    rows_at_kill = kill_then_resume(_cmd(killed), env, killed, after_step=3, checkpoint=2)
    return full, killed, rows_at_kill


@pytest.mark.slow
def test_smoke_run_directory_and_metrics(runs):
    full, _, _ = runs
    rows = read_metrics(str(full / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # 0 = warm-start evaluation
    cfg = json.loads((full / "config.json").read_text())
    assert cfg["train"]["steps"] == STEPS and cfg["model"]["name"] == "tiny"
    required = [
        "reward/mean", "reward/std", "reward/zero_variance_frac", "loss", "loss/policy",
        "train/entropy", "train/grad_norm", "train/rollout_corr/abs_dlogp",
        "train/rollout_corr/is_weight", "perf/tokens_per_s", "time/rollout", "time/judge",
        "time/train", "time/controllers", "time/step", "judge/failure_rate",
    ]  # fmt: skip
    for r in rows[1:]:
        for k in required:
            assert k in r and math.isfinite(r[k]), (r["step"], k)
        assert 0.0 <= r["reward/zero_variance_frac"] <= 1.0
        assert -1.0 <= r["reward/mean"] <= 1.0 and r["reward/undefined"] == 0
        rates = [k for k in r if k.startswith("criteria/") and k.endswith("/pass_rate")]
        assert rates and all(0.0 <= r[k] <= 1.0 for k in rates)
        # The step-time split adds up (sync is the rest).
        parts = sum(r[f"time/{k}"] for k in ("rollout", "judge", "train", "sync"))
        assert parts <= r["time/step"] + 1e-6
    evals = [r for r in rows if "eval/heldout/score" in r]
    assert [r["step"] for r in evals] == [0, 2, 4, 5]
    for r in evals:
        for split in ("heldout", "ood"):
            assert 0.0 <= r[f"eval/{split}/pass_rate"] <= 1.0
            assert 0.0 <= r[f"eval/{split}/oracle"] <= 1.0
            assert -100.0 <= r[f"eval/{split}/score"] <= 100.0
    roll = sorted(glob.glob(str(full / "rollouts" / "step_*.jsonl.gz")))
    assert len(roll) == STEPS
    with gzip.open(roll[0], "rt") as f:
        first = json.loads(f.readline())
    assert set(first) >= {"task_id", "prompt", "response", "reward", "advantage", "verdicts"}
    assert all(v in (True, False) for v in first["verdicts"].values())
    assert glob.glob(str(full / "tb" / "events.out.tfevents.*"))
    assert sorted(os.listdir(full / "checkpoints")) == ["4", "5"]  # keep=2
    assert (full / "warmstart" / "corpus.jsonl").exists()
    assert (full / "tokenizer" / "tokenizer.json").exists()


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(runs):
    full, killed, rows_at_kill = runs
    assert max(r["step"] for r in rows_at_kill) < STEPS, "the run was not interrupted"
    a = read_metrics(str(full / "metrics.jsonl"))
    b = read_metrics(str(killed / "metrics.jsonl"))
    assert [r["step"] for r in b] == list(range(STEPS + 1))
    diffs = metric_diffs(a, b)
    assert not diffs, f"resumed metrics differ (step, key, uninterrupted, resumed): {diffs[:10]}"


class _SwitchableJudge(Judge):
    """The programmatic judge, or (``failing=True``) a judge whose every verdict fails."""

    def __init__(self):
        from rubric_rl.config.builders import build_judge

        self.inner = build_judge(grpo.get_config("smoke"), "")
        self.failing = False

    async def ascore(self, items):
        if self.failing:
            return [[verdict_failed(c.id, "judge backend unreachable") for c in it.criteria]
                    for it in items]  # fmt: skip
        return await self.inner.ascore(items)


class _StepRecorder:
    """A step callback (the ``on_step_end`` object form) keeping what it was given: the step, the
    metrics row, the TrainState's update count and a copy of its parameters."""

    def __init__(self):
        self.calls = []

    def on_step_end(self, step, metrics, state):
        import jax
        import numpy as np

        params = [np.array(x) for x in jax.tree.leaves(jax.device_get(state.params))]
        self.calls.append((step, metrics, int(state.step), params))


_RECORDER = _StepRecorder()  # registered through Trainer(callbacks=...) by the fixture below


class _ServedParams(ScriptedEngine):
    """The scripted engine (``short_words`` replies), keeping a copy of the parameters and the
    version of each ``update_weights``: what the trainer hands its engine to serve."""

    def __init__(self, tok):
        super().__init__(tok, short_words)
        self.served = []

    def update_weights(self, params_or_path, version):
        import jax
        import numpy as np

        params = jax.tree.map(np.array, jax.device_get(params_or_path.params))
        self.served.append((int(version), params))
        super().update_weights(params_or_path, version)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """One in-process Trainer for the loop's tests, sampling from the scripted engine (no
    generation program compiled; the updates, checkpoints and logs are the real ones)."""
    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke")
    c.warmstart.steps = 0
    c.eval.at_start = False
    c.eval.every = 0
    c.train.max_nonfinite_skips = 2
    t = Trainer(
        c, str(tmp_path_factory.mktemp("inproc")), judge=_SwitchableJudge(), callbacks=[_RECORDER]
    )
    serve_scripted(t, _ServedParams(t.tokenizer))
    t._restore_or_warmstart(resume=False)
    yield t
    t.close()


def test_nonfinite_loss_skips_the_update_then_stops(trainer):
    import jax
    import numpy as np

    from rubric_rl.trainer import NonFiniteLossError

    real_step = trainer.train_step
    before = jax.tree.map(np.asarray, trainer.state.params)

    def nan_step(state, batch, ref_params=None):
        # The real jitted step on a poisoned batch: the skip happens inside it (no state copy).
        return real_step(state, batch.replace(advantages=batch.advantages * np.nan), ref_params)

    nan_step.compute_logps = real_step.compute_logps
    trainer.train_step = nan_step
    before = jax.tree.map(np.array, trainer.state)  # params, Adam moments and counts, step
    try:
        m = trainer.train_one_step()
        # Both of the step's updates (2 mini-batches) were skipped: the count, not a 0/1 flag.
        assert m["train/skipped"] == 2.0 and m["train/updates"] == 2.0 and trainer.step == 1
        assert not np.isfinite(m["loss"])
        after = jax.tree.map(np.asarray, trainer.state)
        assert jax.tree.structure(before) == jax.tree.structure(after)
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                        jax.tree.leaves(after)))  # fmt: skip
        with pytest.raises(NonFiniteLossError, match="2 consecutive steps") as e:
            trainer.train_one_step()
        assert "update 1 of 2: loss nan" in str(e.value)
    finally:
        trainer.train_step = real_step
        trainer.nonfinite_streak = 0


def test_a_step_that_skips_one_update_of_two_counts_one_and_names_the_gradient_norm(trainer):
    import jax
    import numpy as np

    from rubric_rl.trainer import NonFiniteLossError

    real_step = trainer.train_step
    calls = []

    def overflow_first(state, batch, ref_params=None):
        # Huge finite advantages on the step's first update: the loss stays finite, the gradient
        # norm overflows to inf (the case: a finite loss quoted as the non-finite one).
        calls.append(len(calls))
        if len(calls) % 2 == 1:
            batch = batch.replace(advantages=batch.advantages * 1e32)
        return real_step(state, batch, ref_params)

    overflow_first.compute_logps = real_step.compute_logps
    trainer.train_step = overflow_first
    step0 = int(trainer.state.step)
    params0 = jax.tree.map(np.array, trainer.state.params)
    try:
        m = trainer.train_one_step()
        assert m["train/skipped"] == 1.0 and m["train/updates"] == 2.0
        assert int(trainer.state.step) == step0 + 1  # the second update was applied
        moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), params0, trainer.state.params)
        assert any(jax.tree.leaves(moved))
        with pytest.raises(NonFiniteLossError) as e:
            trainer.train_one_step()
        msg = str(e.value)
        assert "2 consecutive steps with a non-finite update" in msg
        assert "update 1 of 2: gradient norm inf (loss " in msg and "loss inf" not in msg
    finally:
        trainer.train_step = real_step
        trainer.nonfinite_streak = 0


def test_a_failing_judge_stops_the_run_and_logs_no_reward(trainer):
    from rubric_rl.trainer import ComponentError

    judge = trainer.services.judge_impl
    judge.failing = True
    step = trainer.step
    try:
        with pytest.raises(ComponentError, match="judge _SwitchableJudge.*unreachable"):
            trainer.train_one_step()
    finally:
        judge.failing = False
    assert trainer.step == step  # the step never reached the update or the metrics
    assert read_metrics(trainer.metrics.path) == []  # nothing logged, no zero reward
    # The programmatic checkers themselves never fail on this domain.
    m = trainer.train_one_step()
    assert m["judge/failed"] == 0 and m["reward/undefined"] == 0


def _spied_step(trainer, record, mini_batches, epochs, step=None, tcfg=None):
    """One ``train_one_step`` of ``mini_batches`` x ``epochs`` updates through ``step`` (with
    ``tcfg``; the trainer's own by default), wrapped so that ``record(state, batch)`` sees every
    update's input. The trainer's step, config and train config are restored afterwards."""
    real, real_tcfg = trainer.train_step, trainer.tcfg
    inner = step or real

    def spy(state, batch, ref_params=None):
        record(state, batch)
        return inner(state, batch, ref_params)

    spy.compute_logps = inner.compute_logps
    o = trainer.config.optim
    saved = (o.mini_batches, o.epochs)
    trainer.train_step, trainer.tcfg = spy, tcfg or real_tcfg
    o.mini_batches, o.epochs = mini_batches, epochs
    try:
        return trainer.train_one_step()
    finally:
        trainer.train_step, trainer.tcfg, (o.mini_batches, o.epochs) = real, real_tcfg, saved


def test_mini_batches_and_epochs_are_separate_updates_over_every_rollout(trainer):
    import numpy as np

    seen = []

    def rows(b):
        return list(zip(map(bytes, np.asarray(b.input_ids)), np.asarray(b.advantages).tolist()))

    m = _spied_step(trainer, lambda st, b: seen.append((int(st.step), rows(b))), 2, 2)
    assert m["train/updates"] == 4 and len(seen) == 4
    first = seen[0][0]
    assert [s for s, _ in seen] == [first, first + 1, first + 2, first + 3]  # 4 optimizer steps
    seqs = trainer.config.rollout.tasks_per_step * trainer.config.rollout.samples_per_task
    assert all(len(r) == seqs // 2 for _, r in seen)
    epoch = [sorted(seen[0][1] + seen[1][1]), sorted(seen[2][1] + seen[3][1])]
    assert epoch[0] == epoch[1] and len(set(epoch[0])) == seqs  # each epoch: every rollout once
    assert sorted(seen[0][1]) != sorted(seen[2][1])  # dealt anew each epoch


def test_decoupled_mini_batches_share_the_step_start_old_logps(trainer):
    """π_old of every mini-batch is the policy at the start of the step; the step itself would
    compute it from the live state, which the first mini-batch has already moved."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rubric_rl.core.train_step import make_train_step

    # A constant lr: the fixture's cosine schedule has decayed to 0 after the earlier tests' steps.
    cfg = dataclasses.replace(
        trainer.tcfg, rollout_correction="decoupled_token_tis", schedule="constant"
    )
    decoupled = make_train_step(cfg, trainer.graphdef, trainer.mesh)
    seen = []

    def record(state, batch):
        seen.append((jax.tree.map(jnp.copy, state), batch))

    _spied_step(trainer, record, 2, 1, step=decoupled, tcfg=cfg)
    (start, b1), (moved, b2) = seen
    for b in (b1, b2):
        mask = np.asarray(b.loss_mask) > 0
        at_start = np.asarray(decoupled.compute_logps(start, b))[mask]
        np.testing.assert_allclose(np.asarray(b.old_logps)[mask], at_start, atol=1e-5)
    live = np.asarray(decoupled.compute_logps(moved, b2))[np.asarray(b2.loss_mask) > 0]
    assert np.abs(live - at_start).max() > 1e-4  # the check above can tell the two apart


def test_on_a_cpu_mesh_each_update_starts_from_finished_programs(trainer):
    """XLA:CPU can deadlock when independent programs with collectives are in flight together
    (the next mini-batch's gather and the running update): on the fixture's 8-device CPU mesh
    every update is dispatched only once its state and mini-batch are computed."""
    import jax

    from rubric_rl.core import sharding

    assert sharding.one_program_at_a_time(trainer.mesh)
    ready = []

    def record(state, batch):
        ready.append([x.is_ready() for x in jax.tree.leaves((state, batch))])

    _spied_step(trainer, record, 2, 2)
    assert len(ready) == 4 and all(all(r) for r in ready)


def test_mini_batches_partition_the_rows_and_keep_the_batch_sharding():
    import jax
    import numpy as np

    from rubric_rl.core import sharding
    from rubric_rl.core.train_step import TrainBatch
    from rubric_rl.loop.trainer_batch import mini_batches

    mesh = sharding.make_mesh(-1, 1, 1)
    b, t = 32, 6
    ids = np.arange(b * t, dtype=np.int32).reshape(b, t)
    f = np.arange(b, dtype=np.float32)
    tb = TrainBatch(
        input_ids=ids, positions=ids, attention_mask=ids, loss_mask=ids.astype(np.float32),
        rollout_logps=-ids.astype(np.float32), advantages=f, seq_weights=f + 1,
    )  # fmt: skip
    tb = jax.device_put(tb, sharding.batch_sharding(mesh))
    parts = list(mini_batches(tb, 4, np.random.default_rng(0), mesh))
    again = list(mini_batches(tb, 4, np.random.default_rng(0), mesh))
    got = [np.asarray(p.advantages).astype(int).tolist() for p in parts]
    assert sorted(np.concatenate(got).tolist()) == list(range(b))  # every row exactly once
    assert all(np.all(np.diff(g) > 0) for g in got)  # batch order within a mini-batch
    assert got != [list(range(i * 8, i * 8 + 8)) for i in range(4)]  # dealt, not cut
    for p, q, g in zip(parts, again, got):
        np.testing.assert_array_equal(np.asarray(p.input_ids), ids[g])  # rows stay whole
        np.testing.assert_array_equal(np.asarray(p.seq_weights), f[g] + 1)
        np.testing.assert_array_equal(np.asarray(q.advantages), np.asarray(p.advantages))
        assert p.input_ids.sharding == sharding.batch_sharding(mesh)
    assert next(mini_batches(tb, 1, np.random.default_rng(0), mesh)) is tb
    with pytest.raises(ValueError, match="32 rows do not split into 3"):
        next(mini_batches(tb, 3, np.random.default_rng(0), mesh))


def test_build_train_batch_layout_against_a_plain_reference():
    import numpy as np

    from rubric_rl.config.builders import build_domain
    from rubric_rl.loop.trainer_batch import build_train_batch
    from rubric_rl.rollout.batch import Group, Rollouts, Trajectory

    tasks = build_domain(grpo.get_config("smoke")).train[:2]

    def traj(toks, adv, finish="stop", trainable=True, mask=None):
        lps = tuple(-0.1 * (i + 1) for i in range(len(toks)))
        t = Trajectory(tuple(toks), lps, finish, 3, "", loss_mask=mask)
        t.advantage, t.trainable = adv, trainable
        return t

    groups = [
        Group(tasks[0], 2.0, prompt_ids=(5, 6, 7),
              trajectories=[traj([11, 12], 1.0), traj([13, 14, 15], -1.0, "length")]),
        Group(tasks[1], 0.5, prompt_ids=(8,),
              trajectories=[traj([16], 0.5, trainable=False), traj([17, 18], -0.5, "abort")]),
    ]  # fmt: skip
    tb = build_train_batch(Rollouts(1, groups), prompt_len=4, buckets=(4, 8), pad_id=0)
    ids = np.asarray(tb.input_ids)
    assert ids.shape == (4, 8)  # prompt 4 + completion bucket 4
    np.testing.assert_array_equal(ids[1], [0, 5, 6, 7, 13, 14, 15, 0])
    np.testing.assert_array_equal(ids[2], [0, 0, 0, 8, 16, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(tb.attention_mask)[1], [0, 1, 1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(np.asarray(tb.positions)[2], [0, 0, 0, 0, 1, 1, 1, 1])
    # Prediction layout: entry t is about token t+1 -> completion i at entry 3 + i.
    lm = np.asarray(tb.loss_mask)
    np.testing.assert_array_equal(lm[1], [0, 0, 0, 1, 1, 1, 0, 0])
    assert lm[2].sum() == 0  # undefined reward: not trained on
    assert lm[3].sum() == 0  # aborted generation: not trained on
    np.testing.assert_allclose(np.asarray(tb.rollout_logps)[1, 3:6], [-0.1, -0.2, -0.3])
    np.testing.assert_allclose(np.asarray(tb.advantages), [1.0, -1.0, 0.5, -0.5])
    np.testing.assert_allclose(np.asarray(tb.seq_weights), [2.0, 2.0, 0.5, 0.5])
    np.testing.assert_array_equal(np.asarray(tb.finish_status), [0, 1, 0, 2])
    np.testing.assert_array_equal(np.asarray(tb.group_id), [0, 0, 1, 1])
    # Ragged groups and agent masks: a group of 3, a group of 1 whose middle tokens are a tool
    # output (loss mask 0), an unselected group left out.
    groups = [
        Group(tasks[0], prompt_ids=(5,), trajectories=[traj([11], 1.0) for _ in range(3)]),
        Group(tasks[1], prompt_ids=(6,),
              trajectories=[traj([21, 90, 91, 22], 2.0, "truncated", mask=(1, 0, 0, 1))]),
        Group(tasks[1], prompt_ids=(7,), trajectories=[traj([31], 3.0)], selected=False),
    ]  # fmt: skip
    tb = build_train_batch(Rollouts(1, groups), prompt_len=2, buckets=(4,), pad_id=0)
    assert np.asarray(tb.input_ids).shape == (4, 6)
    np.testing.assert_array_equal(np.asarray(tb.loss_mask)[3], [0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(np.asarray(tb.group_id), [0, 0, 0, 1])
    np.testing.assert_array_equal(np.asarray(tb.finish_status), [0, 0, 0, 3])
    np.testing.assert_allclose(np.asarray(tb.advantages), [1.0, 1.0, 1.0, 2.0])


def test_criterion_pass_rates_pool_groups_and_skip_failures():
    import numpy as np

    from rubric_rl.loop.step_metrics import criterion_pass_rates
    from rubric_rl.rubrics.scores import ScoreMatrices

    rng = np.random.default_rng(0)
    met = (rng.random((3, 2, 4)) < 0.5).astype(np.float32)
    valid = rng.random((3, 2, 4)) < 0.8
    met = np.where(valid, met, 0.0)
    ids = (("a", "b"), ("b", "a"), ("a", "c"))
    scores = ScoreMatrices(met, valid, np.ones((3, 2), np.float32), ids)
    ref: dict[str, list[float]] = {}
    for g, names in enumerate(ids):
        for i, cid in enumerate(names):
            ref.setdefault(cid, []).extend(met[g, i][valid[g, i]].tolist())
    got = criterion_pass_rates(scores)
    assert set(got) == set(ref)
    for cid, vals in ref.items():
        assert got[cid] == pytest.approx(np.mean(vals))


def test_embedded_default_prompts_fit_with_every_skill_injected(tmp_path):
    # A prompt longer than model.max_prompt_len is an error (a left-truncated prompt loses its
    # instruction: ARISE's skill blocks once pushed 36 % of its prompts past the old cap of 40 and
    # cut "list 4 fruits" off). Every task of the default domain must fit even with every skill
    # text of the domain injected at once (ARISE's worst case).
    from rubric_rl.config.builders import build_domain, build_word_tokenizer
    from rubric_rl.envs.constraint_corpus import decorate_prompt
    from rubric_rl.envs.constraint_lexicon import SKILL_TEXTS
    from rubric_rl.envs.constraints import domain_vocabulary

    c = grpo.get_config()
    tok = build_word_tokenizer(domain_vocabulary(), str(tmp_path / "tok"))
    domain = build_domain(c)
    longest = 0
    for split in ("train", "heldout", "ood"):
        for task in getattr(domain, split):
            msgs = decorate_prompt(task, {"skills": list(SKILL_TEXTS.values())})
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
            longest = max(longest, len(ids))
    assert 40 < longest <= int(c.model.max_prompt_len), longest


def test_an_overlong_prompt_is_an_error_naming_the_task_and_field(trainer):
    msgs = [{"role": "user", "content": " ".join(["apple"] * 200)}]
    with pytest.raises(ValueError, match=r"task t-long.*> config.model.max_prompt_len=96"):
        trainer.services.encode_prompt(msgs, "task t-long")
    # Batches are padded to the smallest prompt bucket that fits (smoke: 32, 64, then the cap).
    got = [trainer.services.prompt_len([n]) for n in (5, 32, 33, 64, 65, 96)]
    assert got == [32, 32, 64, 64, 96, 96]


def test_default_advantages_keep_the_rubric_weights_scale():
    # GRPO's division by the group std gives a group that differs only in a small-weight cue the
    # same +-1 advantages as one that differs in a heavy requirement, so the embedded default's
    # policy learned fluff (0.1-weight cues) as fast as the task. The default estimator must keep
    # the reward's scale: A = r - mean_g r (Dr.GRPO), checked against plain numpy.
    import numpy as np

    from rubric_rl.core.advantages import ADVANTAGE_ESTIMATORS

    c = grpo.get_config()
    est = ADVANTAGE_ESTIMATORS.get(c.loss.advantage)
    rng = np.random.default_rng(0)
    r = np.zeros((3, 8))
    r[0, :3] = 0.1 / 12  # only a 0.1-weight cue varies (rubric weight sum ~12)
    r[1, :3] = 3.0 / 12  # a weight-3 requirement varies
    r[2] = rng.random(8)
    adv, zero_var = est(r, eps=float(c.loss.adv_eps), zero_variance_tol=float(c.loss.zero_var_eps))
    adv = np.asarray(adv)
    np.testing.assert_allclose(adv, r - r.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert not np.asarray(zero_var).any()
    assert np.abs(adv[0]).max() * 10 < np.abs(adv[1]).max()


@pytest.mark.slow
def test_kl_reference_is_the_warm_start_policy_and_survives_a_resume(tmp_path):
    """loss.kl_beta > 0: the trainer passes the policy RL started from as the KL reference; after
    updates the KL is positive, and a resumed trainer rebuilds the same reference bit for bit."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke")
    c.loss.kl_beta = 0.5
    c.optim.mini_batches = 1  # one update per step: the first one starts at the reference
    c.eval.at_start, c.eval.every = False, 0
    c.checkpoint.every = 2

    def leaves(tree):
        return [np.asarray(x) for x in jax.tree.leaves(tree)]

    def scripted(workdir):  # the updates are what is checked: no generation compiled
        t = Trainer(c, str(workdir), devices=one_device())
        serve_scripted(t, ScriptedEngine(t.tokenizer, short_words))
        return t

    t = scripted(tmp_path)
    try:
        t._restore_or_warmstart(resume=False)
        warm = ocp.StandardCheckpointer().restore(str(tmp_path / "warmstart" / "params"))
        ref = leaves(t.ref_params)
        assert all(np.array_equal(a, b) for a, b in zip(leaves(warm), ref))
        first = t.train_one_step()
        second = t.train_one_step()
        t.save(wait=True)
        # The first update starts at the reference (KL 0); the second starts one update away.
        assert first["train/kl_ref/k3"] == pytest.approx(0.0, abs=1e-6)
        assert second["train/kl_ref/k3"] > 1e-7
        assert all(np.array_equal(a, b) for a, b in zip(ref, leaves(t.ref_params)))  # not donated
        assert any(not np.array_equal(a, b) for a, b in zip(ref, leaves(t.state.params)))
    finally:
        t.close()
    resumed = scripted(tmp_path)
    try:
        resumed._restore_or_warmstart(resume=True)
        assert resumed.step == 2
        assert all(np.array_equal(a, b) for a, b in zip(ref, leaves(resumed.ref_params)))
    finally:
        resumed.close()
    c.warmstart.steps = 0  # no warm start: the reference is the initial (checkpoint) policy
    cold = scripted(tmp_path / "cold")
    try:
        init = leaves(cold.state.params)
        cold._restore_or_warmstart(resume=False)
        assert all(np.array_equal(a, b) for a, b in zip(init, leaves(cold.ref_params)))
    finally:
        cold.close()
    c.loss.kl_ref_dtype = "bfloat16"  # the gpu variants' reference: the same weights in bf16
    half = scripted(tmp_path / "half")
    try:
        init = leaves(half.state.params)
        half._restore_or_warmstart(resume=False)
        got = leaves(half.ref_params)
        assert all(g.dtype == jnp.bfloat16 for g in got)
        assert all(np.array_equal(g, a.astype(jnp.bfloat16)) for g, a in zip(got, init))
        # The first update starts at the reference up to its bf16 rounding: a KL near 0.
        kl = half.train_one_step()["train/kl_ref/k3"]
        assert 0.0 <= kl < 1e-3
    finally:
        half.close()


def _run_steps(trainer, steps, resume=False, **checkpoint):
    """``trainer.run`` for ``steps`` more steps with ``checkpoint.<key>`` settings; the config's
    step count and checkpoint section are restored afterwards."""
    c = trainer.config
    saved = (c.train.steps, dict(c.checkpoint))
    c.train.steps = trainer.step + steps
    c.checkpoint.update(checkpoint)
    try:
        return trainer.run(resume=resume)
    finally:
        c.train.steps = saved[0]
        c.checkpoint.update(saved[1])


def test_step_callbacks_see_each_steps_final_metrics_and_state(trainer):
    import jax
    import numpy as np

    from rubric_rl.trainer import StepCallbackError

    seen = []
    trainer.add_callback(lambda step, metrics, state: seen.append((step, metrics["step"])))
    _RECORDER.calls.clear()
    start, updates = trainer.step, int(trainer.state.step)
    rows = _run_steps(trainer, 2, every=0, final=False)
    assert [c[0] for c in _RECORDER.calls] == [start + 1, start + 2]
    assert seen == [(start + 1, start + 1), (start + 2, start + 2)]  # in registration order
    # metrics: the step's row as written to metrics.jsonl (and returned by run)
    assert [c[1] for c in _RECORDER.calls] == rows == read_metrics(trainer.metrics.path)[-2:]
    assert all(r["train/updates"] == 2.0 and "reward/mean" in r for r in rows)
    # state: the TrainState after that step's updates (2 per step here), the last one the
    # trainer's final state (earlier tests may have run the lr schedule down to 0, so parameters
    # of consecutive steps are not compared)
    assert [c[2] for c in _RECORDER.calls] == [updates + 2, updates + 4]
    final = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(trainer.state.params))]
    assert all(np.array_equal(a, b) for a, b in zip(_RECORDER.calls[-1][3], final))

    def broken_callback(step, metrics, state):
        raise KeyError("no such metric")

    trainer.add_callback(broken_callback)
    try:
        with pytest.raises(StepCallbackError) as e:
            _run_steps(trainer, 2, every=0, final=False)
    finally:
        trainer.callbacks.remove(broken_callback)
    name = "tests.test_trainer.test_step_callbacks_see_each_steps_final_metrics_and_state"
    assert str(e.value) == (
        f"step callback {name}.<locals>.broken_callback raised at step {start + 3}: "
        "KeyError: 'no such metric'"
    )
    assert isinstance(e.value.__cause__, KeyError) and e.value.step == start + 3
    assert read_metrics(trainer.metrics.path)[-1]["step"] == start + 3  # its row was written
    with pytest.raises(TypeError, match="has no on_step_end"):
        trainer.add_callback(object())
    trainer.callbacks.pop()  # the lambda


def test_checkpoint_every_0_and_final_false_write_no_checkpoint(trainer):
    """(Last in this module: it leaves a checkpoint in the shared trainer's workdir.)"""
    from rubric_rl.runs.run_dir import checkpoint_steps

    start = trainer.step
    rows = _run_steps(trainer, 2, every=0, final=False)
    assert [r["step"] for r in rows] == [start + 1, start + 2] and trainer.step == start + 2
    assert checkpoint_steps(trainer.workdir) == []
    with pytest.raises(FileNotFoundError, match=r"nothing to resume.*checkpoint\.every=0 and "):
        _run_steps(trainer, 1, resume=True, every=0, final=False)
    # every=0 with the final checkpoint: only the last step's
    rows = _run_steps(trainer, 2, every=0, final=True)
    assert checkpoint_steps(trainer.workdir) == [start + 4] == [rows[-1]["step"]]


def test_load_policy_serves_a_checkpoint_of_this_run_or_another(trainer, tmp_path):
    """(After the test above: its final checkpoint is the one loaded.) The restored parameters
    are the checkpoint's, bit for bit, and the engine is given them to serve at that step's
    version (that the engine serves what it is given: tests/rollout/test_jax_engine.py)."""
    import shutil

    import jax
    import numpy as np

    from rubric_rl.loop.policy_loading import load_policy
    from rubric_rl.runs.run_dir import checkpoint_steps

    (ck,) = checkpoint_steps(trainer.workdir)[-1:]
    assert trainer.step == ck
    want = jax.tree.map(np.asarray, trainer.state.params)

    def move_on():  # another policy, served, at another step
        halved = jax.tree.map(lambda x: x * 0.5, trainer.state.params)
        trainer.state = trainer.state.replace(params=halved)
        trainer.step = ck + 1
        trainer.engine.update_weights(trainer.state, ck + 1)

    def same(tree):
        return all(jax.tree.leaves(jax.tree.map(np.array_equal, tree, want)))

    other = tmp_path / "other_run_checkpoints"
    shutil.copytree(f"{trainer.workdir}/checkpoints", other)
    for where in (None, str(other)):
        move_on()
        assert not same(jax.tree.map(np.asarray, trainer.state.params))
        load_policy(trainer, ck, where)
        assert trainer.step == ck and trainer.engine.weight_version == ck
        assert same(jax.tree.map(np.asarray, trainer.state.params))
        version, served = trainer.engine.served[-1]
        assert version == ck and same(served)
