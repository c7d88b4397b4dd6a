"""The step as a pipeline a method owns (rubric_rl/step.py), on the scripted engine (the real
domain, judge, Services, controllers and stages; the batch the trainer would build; nothing
compiled), and the controller files of a resumed run through the real trainer:

- a two-round method written only here (a generator round whose outputs become the solver
  round's tasks; both roles trained; probe rollouts never trained) runs without touching
  trainer.py;
- select k of 2k trains exactly the selected groups (batch of k·J rows, field for field the batch
  of only those groups) and validation checks k·J against the mesh and mini-batches;
- Services: probe rollouts on the pre-update policy with their own seeds; a candidate-rubric
  re-grade hits the verdict cache for unchanged criteria and misses for new ones; fresh misses;
- a controller's files in the run directory are rolled back to the checkpoint on resume.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil

import numpy as np
import pytest

from configs import grpo
from rubric_rl import step as stages
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.config.config_validation import validate_config
from rubric_rl.controllers.base import Controller
from rubric_rl.loop.trainer_batch import build_train_batch, rollouts_to_batch
from rubric_rl.rollout.batch import Group, Rollouts
from rubric_rl.rollout.scripted import ScriptedEngine, prompt_words
from rubric_rl.rubrics.types import Message
from rubric_rl.runs.run_files import append_jsonl, step_path
from tests.trainer_spy import one_device, serve_scripted, short_words


def _config(**rollout):
    c = grpo.get_config("smoke")
    c.warmstart.steps = 0
    c.eval.update(at_start=False, every=0)
    c.optim.mini_batches = 1  # the spy sees the whole step's batch in one update
    c.rollout.update(**rollout)
    return c


class _PolicyReply:
    """The scripted policy of the controller checks (``controller_check.ScriptedPolicy``) as the
    engine's reply: a task's prompt gets a rendered response that meets each of its constraints
    with the script's probability (so the verifier passes some and fails others); any other
    prompt (a generated task) gets some of its own words."""

    def __init__(self):
        self.policy, self.by_prompt = ScriptedPolicy(seed=0), {}

    def __call__(self, request, prompt_text, k):
        task = self.by_prompt.get(request.prompt_ids)
        if task is None:
            return prompt_words(request, prompt_text, k)
        messages = [{"role": "user", "content": prompt_text}]
        return self.policy.respond(task, messages, request.step, request.sample_offset + k)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """GRPO's smoke config with its real domain, judge, ``Services``, controllers and stages, on
    the scripted engine (rubric_rl/rollout/scripted.py): nothing is compiled or trained."""
    reply = _PolicyReply()
    r = scripted_run(
        _config(), None, str(tmp_path_factory.mktemp("pipeline")),
        engine=lambda tok: ScriptedEngine(tok, reply),
    )  # fmt: skip
    reply.by_prompt = {r.services.encode_prompt(t.messages): t for t in r.domain.train}
    yield r
    r.services.engine.close()


_STEPS = itertools.count(1)


def _step_with(run, pipeline=None, **config):
    """One step of ``pipeline`` (the method's by default) with config overrides
    (``"loss.reward": ...``); returns (metrics, the step's Rollouts, the ``TrainBatch`` the trainer
    builds from them). Everything is restored."""
    saved_pipeline, saved = run.pipeline, {}
    run.pipeline = pipeline or run.pipeline
    run.config.unlock()
    try:
        for key, value in config.items():
            section, field = key.split(".")
            saved[key] = run.config[section][field]
            run.config[section][field] = value
        rollouts, ctx = run.step(next(_STEPS))
        metrics = run.metrics(rollouts, ctx)
        tb = rollouts_to_batch(rollouts, run.services, False, None)
    finally:
        for key, value in saved.items():
            section, field = key.split(".")
            run.config[section][field] = value
        run.config.lock()
        run.pipeline = saved_pipeline
    return metrics, rollouts, tb


# ------------------------------------------------------------------------------ two rounds


def _generator_round(rollouts, ctx):
    """Replaces ``sample``: two generator groups write prompts; the first two responses of each
    become solver tasks (with the source task's rubric); the default stages then roll out and
    judge the solver groups only."""
    batch = ctx.controllers.sample_tasks(ctx.step, ctx.rng)
    gen = Rollouts(ctx.step, [Group(t, role="generator") for t in batch.tasks[:2]])
    for stage in (stages.decorate, stages.generate, stages.judge):
        gen = stage(gen, ctx)
    solver = []
    for g in gen.groups:
        for j, tr in enumerate(g.trajectories[:2]):
            text = tr.response.strip() or "write one word"
            task = dataclasses.replace(
                g.task, id=f"{g.task.id}/gen{j}", prompt=(Message("user", text),)
            )
            solver.append(Group(task, role="solver"))
    gen.groups.extend(solver)
    return gen


def _generator_reward(rollouts, ctx):
    """Difficulty-shaped generator reward: 1 − the mean reward of its solver groups."""
    solver_mean = {}
    for g in rollouts.groups:
        if g.role == "solver":
            src = g.task.id.rsplit("/gen", 1)[0]
            solver_mean.setdefault(src, []).append(np.nanmean([t.reward for t in g.trajectories]))
    for g in rollouts.groups:
        if g.role == "generator":
            d = 1.0 - float(np.mean(solver_mean[g.task.id]))
            for j, t in enumerate(g.trajectories):
                t.signals[stages.RUBRIC_SIGNAL] = d + 0.01 * j  # distinct, so advantages ≠ 0
    return rollouts


def _probe(rollouts, ctx):
    solver = [g for g in rollouts.groups if g.role == "solver"][:2]
    _, trajs = ctx.services.generate([g.messages for g in solver], 2, stream="probe")
    rollouts.metrics["probe"] = [t for ts in trajs for t in ts]
    return rollouts


def _solver_reward_first(rollouts, ctx):
    """The solver groups' rewards must exist before the generator's: a first advantage pass."""
    rollouts.set_matrix("reward", rollouts.signal(stages.RUBRIC_SIGNAL))
    return rollouts


def test_a_two_round_method_trains_both_roles_and_never_its_probes(run):
    pipeline = (
        stages.default_pipeline()
        .replace("sample", _generator_round)
        .insert_after("reward", "solver_rewards", _solver_reward_first)
        .insert_after("solver_rewards", "generator_reward", _generator_reward)
        .insert_after("observe", "probe", _probe)
    )
    version = run.services.engine.weight_version
    m, r, tb = _step_with(run, pipeline)
    roles = [g.role for g in r.groups]
    assert roles.count("generator") == 2 and roles.count("solver") == 4
    j = int(run.config.rollout.samples_per_task)
    assert tb.input_ids.shape[0] == 6 * j  # both rounds, nothing else
    # Row order is group order: the generator's rows first, then the solver's.
    lm = np.asarray(tb.loss_mask).sum(axis=1)
    assert lm[: 2 * j].sum() > 0 and lm[2 * j :].sum() > 0  # both roles carry loss tokens
    gen_adv = np.asarray(tb.advantages)[: 2 * j]
    assert np.any(gen_adv != 0)  # the generator's own (difficulty) reward is trained
    for g in r.groups:
        if g.role == "generator":
            assert all(tr.signals[stages.RUBRIC_SIGNAL] >= 0 for tr in g.trajectories)
    # Probe rollouts: on the pre-update policy, seeds of their own, never in the batch.
    probes = r.metrics["probe"]
    trained = [tr for g in r.groups for tr in g.trajectories]
    assert {p.weight_version for p in probes} == {version}
    assert {tr.weight_version for tr in trained} == {version}
    assert not {p.seed for p in probes} & {tr.seed for tr in trained}
    assert len({tr.seed for tr in trained}) == len(trained)  # the two rounds never share a seed


# ------------------------------------------------------------------------------ select


class _KeepEven(Controller):
    name = "keep_even"

    def select(self, rollouts):
        return np.arange(len(rollouts)) % 2 == 0


def test_select_k_of_2k_trains_exactly_the_selected_groups(run):
    keep = _KeepEven()
    keep.bind(run.services.for_caller(keep.name), None)
    run.controllers.controllers.append(keep)
    try:
        m, r, tb = _step_with(run, **{"rollout.train_groups": 2})
    finally:
        run.controllers.controllers.remove(keep)
    j = int(run.config.rollout.samples_per_task)
    assert len(r.groups) == 4 and [g.selected for g in r.groups] == [True, False, True, False]
    assert tb.input_ids.shape[0] == 2 * j  # k·J rows reach the jitted step
    assert m["select/kept_frac"] == 0.5
    # The same batch as a record holding only the selected groups, field for field (so the same
    # loss and gradients: the jitted step is a function of the batch alone).
    only = Rollouts(r.step, [g for g in r.groups if g.selected])
    p_len = run.services.prompt_len([len(g.prompt_ids) for g in only.groups])
    kw = dict(prompt_len=p_len, buckets=tuple(run.config.rollout.buckets), pad_id=0)
    a = build_train_batch(r, **kw)
    b = build_train_batch(only, **kw)
    for batch in (b, tb):  # and the trainer's batch is that one
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(batch, f.name)
            assert (x is None) == (y is None), f.name
            if f.name == "group_id":  # each group's own index: the same partition of the rows
                x, y = (
                    np.unique(np.asarray(x), return_inverse=True)[1],
                    np.unique(np.asarray(y), return_inverse=True)[1],
                )
            if x is not None:
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f.name)


def test_validation_checks_k_times_j_against_the_mesh_and_mini_batches():
    c = _config(tasks_per_step=8, train_groups=3)  # 3 x 4 = 12 rows on 8 shards
    with pytest.raises(ValueError, match="config.rollout.train_groups"):
        validate_config(c, num_devices=8)
    c = _config(tasks_per_step=8, train_groups=4)
    validate_config(c, num_devices=8)
    c.optim.mini_batches = 4  # 16 rows do not split into 4 mini-batches of 8 shards
    with pytest.raises(ValueError, match="config.optim.mini_batches"):
        validate_config(c, num_devices=8)
    c = _config(tasks_per_step=4, train_groups=8)
    with pytest.raises(ValueError, match="config.rollout.train_groups"):
        validate_config(c, num_devices=8)


# ------------------------------------------------------------------------------ services


def test_services_judge_cache_candidate_rubrics_and_fresh(run):
    svc = run.services.for_caller("critic")
    tasks = list(run.domain.train[:2])
    responses = [["a b c", "yes ."], ["red , blue", "no"]]
    first = svc.judge(tasks, responses)
    hits, misses = svc.cache.hits, svc.cache.misses
    again = svc.judge(tasks, responses)
    n_crit = [len(t.rubric.evaluated()) for t in tasks]
    assert svc.cache.hits - hits == 2 * sum(n_crit) and svc.cache.misses == misses
    assert again == first
    # A candidate rubric: the old criteria plus a rewritten copy of the first one.
    cand = []
    for t in tasks:
        old = list(t.rubric.evaluated().criteria)
        new = old[0].replace(id=old[0].id + "_v2", text=old[0].text + " (stated exactly)")
        cand.append([*old, new])
    hits, misses = svc.cache.hits, svc.cache.misses
    graded = svc.judge(tasks, responses, cand)
    assert svc.cache.hits - hits == 2 * sum(n_crit)  # unchanged criteria: cached
    assert svc.cache.misses - misses == 2 * 2  # the new one: judged, per response
    assert [[v[: len(f)] for v, f in zip(g, gf)] for g, gf in zip(graded, first)] == first
    assert graded[0][0][-1].criterion_id == cand[0][-1].id
    # The same criteria under other ids: cached verdicts, each under the id asked for.
    renamed = [[c.replace(id=c.id + "_r") for c in t.rubric.evaluated().criteria] for t in tasks]
    hits, misses = svc.cache.hits, svc.cache.misses
    relabelled = svc.judge(tasks, responses, renamed)
    assert svc.cache.hits - hits == 2 * sum(n_crit) and svc.cache.misses == misses
    for g, gf, cs in zip(relabelled, first, renamed):
        for row, row_first in zip(g, gf):
            assert [v.criterion_id for v in row] == [c.id for c in cs]
            assert [v.met for v in row] == [v.met for v in row_first]
    hits, misses = svc.cache.hits, svc.cache.misses
    fresh = svc.judge(tasks, responses, fresh=True)
    assert svc.cache.hits == hits and svc.cache.misses == misses  # the cache is bypassed
    assert fresh == first  # programmatic: the same verdicts
    assert svc.pop_seconds().get("critic", 0.0) > 0  # time/services/critic


def test_probe_streams_have_their_own_seeds(run):
    from rubric_rl.services import stream_base

    assert stream_base("train") == 0
    assert len({stream_base(s) for s in ("train", "probe", "critic", "eval/heldout")}) == 4
    svc = run.services
    prompts = [t.messages for t in run.domain.train[:2]]
    _, a = svc.generate(prompts, 2, stream="probe")
    _, b = svc.generate(prompts, 2, stream="probe")  # a second call in the same step
    _, c = svc.generate(prompts, 2, stream="critic")
    seeds = [{x.seed for g in r for x in g} for r in (a, b, c)]
    assert not (seeds[0] & seeds[1]) and not (seeds[0] & seeds[2]) and not (seeds[1] & seeds[2])


# ------------------------------------------------------------------------------ resume


class _Scribe(Controller):
    """Writes a JSONL row and a per-step file into its run directory every step."""

    name = "scribe"

    def observe(self, rollouts):
        append_jsonl(os.path.join(self.run_dir, "log.jsonl"), rollouts.step, {"n": len(rollouts)})
        with open(step_path(self.run_dir, rollouts.step, "tasks.json"), "w") as f:
            json.dump([t.id for t in rollouts.tasks], f)
        return {}


def _files(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


@pytest.mark.slow
def test_controller_files_are_rolled_back_to_the_checkpoint_on_resume(tmp_path):
    from rubric_rl.trainer import Trainer

    c = _config()
    c.train.steps = 3
    c.checkpoint.every = 2  # and the final step's
    c.optim.schedule = "constant"

    def run(workdir, resume=False):
        t = Trainer(c, str(workdir), extra_controllers=[_Scribe()], devices=one_device())
        serve_scripted(t, ScriptedEngine(t.tokenizer, short_words))  # no generation compiled
        try:
            t.run(resume=resume)
        finally:
            t.close()

    run(tmp_path / "full")
    # Killed after the checkpoint of step 2, while step 3 had written its files: the full run's
    # directory without checkpoint 3, as a SIGKILL before it was written would have left it.
    shutil.copytree(tmp_path / "full", tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "3")
    scribe = tmp_path / "killed" / "controllers" / "scribe"
    assert (scribe / "step_000003").exists()
    run(tmp_path / "killed", resume=True)
    want = _files(tmp_path / "full" / "controllers")
    got = _files(tmp_path / "killed" / "controllers")
    assert sorted(got) == sorted(want) and got == want
    rows = [json.loads(x) for x in open(scribe / "log.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_with_context_places_the_teacher_context():
    msgs = [{"role": "user", "content": "write 2 words"}]
    assert stages.with_context(msgs, "<m> x </m>", "system", "t")[0] == {
        "role": "system",
        "content": "<m> x </m>",
    }
    sys_msgs = [{"role": "system", "content": "be brief"}, *msgs]
    assert stages.with_context(sys_msgs, "<m>", "system", "t")[0]["content"] == "be brief <m>"
    assert stages.with_context(msgs, "<m>", "last_user", "t")[-1]["content"].endswith("<m>")
    with pytest.raises(ValueError, match="placement"):
        stages.with_context(msgs, "<m>", "middle", "t")


# ------------------------------------------------------------------------------ outcome reward


def test_outcome_reward_trains_the_task_verifier_and_reward_metrics_describe_it(run):
    from rubric_rl.envs.constraints import verify

    m, r, tb = _step_with(run, **{"loss.reward": "task_verifier"})
    want = np.array([[float(verify(g.task, x.response)) for x in g.trajectories] for g in r.groups])
    np.testing.assert_array_equal(r.rewards, want)
    assert all(stages.RUBRIC_SIGNAL not in x.signals for g in r.groups for x in g.trajectories)
    assert m["reward/mean"] == m["reward/task_verifier/mean"] == want.mean()
    # mean_only advantages of the pass/fail reward: A = r − mean_g r.
    np.testing.assert_allclose(r.advantages, want - want.mean(axis=1, keepdims=True), atol=1e-6)
    assert 0 < want.mean() < 1  # the scripted policy passes some tasks and fails others
    np.testing.assert_allclose(np.asarray(tb.advantages), r.advantages.reshape(-1), atol=1e-6)
