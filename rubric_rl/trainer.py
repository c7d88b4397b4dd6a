"""The training loop (DESIGN §3). It owns no algorithm: the method's step pipeline (``step.py``,
run by ``step_producer``) produces the step's ``Rollouts``; the loop packs the selected
trajectories into a ``TrainBatch``, computes π_old, runs the updates, syncs the engine, and logs,
evaluates and checkpoints (``run_state``).

Exact resume: every source of randomness is either a pure function of (seed, step) — engine seeds
(``sample_seed`` per stream), the stages' per-step numpy Generator from the saved JAX key — or
saved state (controllers' ``state_dict``, the key, the train state); files written after the
restored checkpoint (metrics, controller logs and directories) are rolled back.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from rubric_rl.checkpoint import RunCheckpointer
from rubric_rl.config import builders
from rubric_rl.config.config_validation import validate_config
from rubric_rl.controllers.base import Controller
from rubric_rl.core import losses, sharding
from rubric_rl.core.train_step import TrainBatch, init_train_state, make_train_step
from rubric_rl.loop import async_rollouts, evaluation, run_state
from rubric_rl.loop.nonfinite import NonFiniteLossError, check_streak, nonfinite_updates
from rubric_rl.loop.step_callbacks import (
    AnyStepCallback,
    StepCallback,
    StepCallbackError,
    StepTimer,
    call_step_end,
    callback_name,
    check_callback,
)
from rubric_rl.loop.step_metrics import oracle_diagnostics, rollout_rows, step_metrics
from rubric_rl.loop.step_producer import StepProducer
from rubric_rl.loop.trainer_batch import rollouts_to_batch, update_batches
from rubric_rl.loop.weight_serving import WeightServer
from rubric_rl.metrics import (
    ControllerLog,
    MetricsWriter,
    RolloutLogger,
    headline,
    logs_above,
    progress_bar,
)
from rubric_rl.metrics import summary_line as format_summary
from rubric_rl.rubrics import reward_fns as reward_fns_lib
from rubric_rl.runs import run_dir
from rubric_rl.services import ComponentError, Services
from rubric_rl.step import Pipeline
from rubric_rl.util import logs


class Trainer:
    """``Trainer(config, workdir).run(resume=...)``: builds the run's parts and trains.

    ``callbacks``: step callbacks (``add_callback``), called in order after each step of ``run``.
    ``devices``: the devices ``config.mesh`` spans (default: every device, ``jax.devices()``).

    ``reward_fns``: plain Python reward functions (``rubrics/reward_fns.py``), a dict name ->
    callable or a list of callables named by ``__name__``, next to those ``config.reward_fns``
    names by import path; each is recorded in ``config.reward_fns`` (and ``config.json``) as its
    "module:qualname". Train one with ``loss.reward=<name>`` or ``loss.reward_weights``.

    ``tasks``: the tasks in Python instead of ``config.domain``: ``dict(train=[...],
    heldout=[...], ood=[...])`` of ``plain``-format rows (``{"prompt": str | messages, "id":
    optional, **fields}``) or ``Task`` objects (``builders.tasks_domain``); ``domain``: a
    ``builders.Domain`` instead. Neither has a warm-start corpus: ``warmstart.steps=0``.
    """

    def __init__(
        self,
        config: Any,
        workdir: str,
        *,
        judge: Any = None,
        extra_controllers: Sequence[Controller] = (),
        pipeline: Pipeline | None = None,
        callbacks: Sequence[AnyStepCallback] = (),
        reward_fns: Mapping[str, reward_fns_lib.RewardFn] | Sequence[reward_fns_lib.RewardFn] = (),
        tasks: Mapping[str, Sequence[Any]] | None = None,
        domain: builders.Domain | None = None,
        devices: Sequence[Any] | None = None,
    ):
        # Before the validation: it checks loss.reward / loss.reward_weights against the names.
        self._given_reward_fns = bool(reward_fns)
        self.reward_fns = reward_fns_lib.resolve_reward_fns(config, reward_fns)
        validate_config(config, num_devices=len(jax.devices() if devices is None else devices))
        logs.set_library_info(bool(config.logging.library_info))
        self.callbacks = [check_callback(cb) for cb in callbacks]
        self.config = config
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.mesh = builders.build_mesh(config, devices)
        self.domain = builders.given_or_configured_domain(config, tasks, domain)
        reward_fns_lib.check_rubric_trainable(config, self.domain.train, self.reward_fns)
        self.seed_by_id = {t.id: t for t in self.domain.train}
        self.tokenizer = builders.build_tokenizer(config, self.domain, self.workdir)
        self.tcfg = builders.train_config(config)
        with jax.set_mesh(self.mesh):
            model = builders.build_model(config, self.tokenizer, self.mesh)
        self.graphdef, self.state = init_train_state(model, self.tcfg, self.mesh)
        # An external teacher (config.teacher: OPCD / GKD), a frozen parameter set of its own.
        with jax.set_mesh(self.mesh):
            teacher_graphdef, self.teacher = builders.build_external_teacher(
                config, self.tokenizer, self.mesh
            )
        self.train_step = make_train_step(
            self.tcfg, self.graphdef, self.mesh, teacher_graphdef=teacher_graphdef
        )
        self.engine = builders.build_engine(config, model, self.tokenizer, self.mesh, self.workdir)
        judge = judge if judge is not None else builders.build_judge(config, self.workdir)
        buckets = functools.partial(builders.prompt_buckets, config)
        self.services = Services(
            config, self.engine, self.tokenizer, judge, self.domain, self.workdir, buckets
        )
        self.controllers, method_pipeline = builders.build_method(
            config, self.domain, extra_controllers
        )
        self.controllers_dir = os.path.join(self.workdir, "controllers")
        self.controllers.bind(self.services, self.controllers_dir)
        reward_fns_lib.check_mix_owner(config, self.controllers.signal_weights())
        self.weights = WeightServer(config, self.engine, self.graphdef, self.workdir)
        self.producer = StepProducer(
            config, pipeline if pipeline is not None else method_pipeline, self.services,
            self.controllers, self.domain, self.reward_fns, self.weights,
        )  # fmt: skip
        self.step = 0
        self.ckpt = RunCheckpointer(
            os.path.join(self.workdir, "checkpoints"), keep=int(config.checkpoint.keep)
        )
        lg = config.logging
        # Multi-host: every process runs the same loop; only process 0 writes the run directory's
        # logs (orbax coordinates the checkpoint writes itself).
        self.primary = jax.process_index() == 0
        wandb = {"enabled": lg.wandb, "project": lg.wandb_project, "config": config.to_dict()}
        self.metrics = MetricsWriter(
            self.workdir, tensorboard=bool(lg.tensorboard), wandb_config=wandb, primary=self.primary
        )
        self.rollout_log = RolloutLogger(self.workdir, primary=self.primary)
        self.controller_logs = [
            ControllerLog(self.workdir, c.name, primary=self.primary)
            for c in self.controllers.controllers
        ]
        self.nonfinite_streak = 0
        self._nonfinite: list[str] = []  # the last step's non-finite updates, described
        self.ref_params = None  # the KL reference (loss.kl_beta > 0), set by _restore_or_warmstart
        # bypass mode feeds π_old = π_rollout to the rejection bands unless the step-start
        # log-probs are computed: a preset that rejects gets them every step.
        self._rejects = losses.rejects(str(config.loss.rollout_correction))

    @property
    def pipeline(self) -> Pipeline:
        return self.producer.pipeline

    @pipeline.setter
    def pipeline(self, pipeline: Pipeline) -> None:
        self.producer.pipeline = pipeline

    def add_callback(self, callback: AnyStepCallback) -> None:
        """Registers ``callback``: an object with ``on_step_end(step, metrics, state)`` or a
        function of ``(step, metrics, state)``. ``run`` calls it after every step, once that
        step's metrics are final: ``metrics`` is a copy of the step's ``metrics.jsonl`` row
        (evaluation included, ``"step"`` key, JSON types), written before the call, and the
        step's checkpoint (if due) has been started. ``state`` is the live
        ``core.train_step.TrainState`` after the step's updates (``.params``, ``.opt_state``,
        ``.step``, ``.rest``), as sharded in training: read it, never modify it, and copy what
        you keep (``jax.device_get``), since the next step donates its buffers. An exception
        raised by a callback stops the run as a ``StepCallbackError`` naming it and the step.
        Called by ``run`` only, not by ``train_one_step``; on every process of a multi-host run.
        """
        self.callbacks.append(check_callback(callback))

    def _restore_or_warmstart(self, resume: bool, rebuild_controller_files: bool = False) -> None:
        run_state.restore_or_warmstart(self, resume, rebuild_controller_files)

    def save(self, wait: bool = False) -> None:
        run_state.save(self, wait)

    # ------------------------------------------------------------------ one step

    def train_one_step(self) -> dict[str, Any]:
        step = self.step + 1
        t_start = time.perf_counter()
        async_k = self.producer.max_staleness
        p, waited = self.producer.rollouts_for(step, self.state)
        rollouts, ctx = p.rollouts, p.ctx
        tb = rollouts_to_batch(rollouts, self.services, self.tcfg.needs_teacher, self.mesh)
        t0 = time.perf_counter()
        train_m, measured = self._update(tb, step)
        t = {"train": time.perf_counter() - t0}
        self.step = step
        # Sync first, even on a skipped step: the train step donated the state the engine was
        # serving, so the engine must get the live one before anything else (an error included).
        # Asynchronous rollouts: the engine serves copies, and gets the live state only at a sync
        # point (the next pipeline then runs here, with the newest weights).
        t0 = time.perf_counter()
        if async_k == 0 or async_rollouts.is_sync_point(self.config, step):
            self.weights.sync(self.state, self.step)
        t["sync"] = time.perf_counter() - t0
        limit = int(self.config.train.max_nonfinite_skips)
        check_streak(step, self.nonfinite_streak, self._nonfinite, limit)
        oracle = oracle_diagnostics(rollouts, ctx, self.seed_by_id)
        t.update({"rollout": ctx.seconds.get("generate", 0.0), **ctx.seconds})
        t["judge"] = ctx.seconds.get("judge", 0.0) + ctx.seconds.get("reward", 0.0)
        t["controllers"] = p.controller_seconds
        t.update({f"services/{k}": v for k, v in p.service_seconds.items()})
        if async_k:
            t["rollout_wait"] = waited  # the trainer's wait for this step's pipeline
            t["pipeline"] = p.seconds  # the pipeline itself, wherever it ran
        t["step"] = time.perf_counter() - t_start
        m = step_metrics(rollouts, train_m, t, measured=measured)
        m.update(ctx.metrics)
        m.update(oracle)
        if async_k:
            m["rollout/weight_version"] = float(p.weight_version)
            m["rollout/staleness"] = float(step - 1 - p.weight_version)
        for log, events in zip(self.controller_logs, p.events.values()):
            for e in map(dict, events):
                e.pop("step", None)
                log.log(step, str(e.pop("event", "event")), **e)
        n = int(self.config.logging.rollouts_per_step)
        if n > 0:
            self.rollout_log.write(step, rollout_rows(rollouts, n))
        return m

    def _update(self, tb: TrainBatch, step: int) -> tuple[dict[str, float], bool]:
        every = int(self.config.loss.mismatch_every)
        measured = (every > 0 and step % every == 0) or self._rejects
        # On a CPU mesh of several devices each program here finishes before the next is
        # dispatched (sharding.settle): the π_old forward, the mini-batch gathers and the
        # updates are independent programs with collectives, which XLA:CPU can deadlock on.
        settle = functools.partial(sharding.settle, mesh=self.mesh)
        if not self.tcfg.decoupled:
            # Bypass: π_old := π_rollout. On measured steps the step-start forward replaces it
            # (diagnostics, and rejection statistics); elsewhere the same array keeps the shapes.
            old = settle(self.train_step.compute_logps(self.state, tb)) if measured else None
            tb = tb.replace(old_logps=tb.rollout_logps if old is None else old)
        else:
            # Decoupled: π_old is the step-start policy for every update (mini-batches x epochs).
            tb = tb.replace(old_logps=settle(self.train_step.compute_logps(self.state, tb)))
        # With train.max_nonfinite_skips > 0 the jitted step itself keeps the old state on a
        # NaN/inf loss (TrainConfig.skip_nonfinite): no copy of the state is held here.
        per_update = []
        o = self.config.optim
        seed = int(self.config.train.seed)
        for sub in update_batches(tb, step, seed, int(o.epochs), int(o.mini_batches), self.mesh):
            kw = {} if self.teacher is None else {"teacher": self.teacher}
            self.state, m_ = settle(self.train_step(self.state, settle(sub), self.ref_params, **kw))
            per_update.append(m_)
        per_update = jax.device_get(per_update)
        # Means over the step's updates, except train/skipped: the NUMBER of the step's updates
        # that the jitted step skipped (with several mini-batches one can be skipped and the next
        # applied), out of train/updates.
        train_m = {k: float(np.mean([u[k] for u in per_update])) for k in per_update[0]}
        train_m["train/updates"] = float(len(per_update))
        train_m["train/skipped"] = float(sum(float(u.get("train/skipped", 0)) for u in per_update))
        # A step with any non-finite update counts towards the streak, skipped or (with
        # train.max_nonfinite_skips = 0, no skipping) applied.
        self._nonfinite = nonfinite_updates(per_update)
        self.nonfinite_streak = self.nonfinite_streak + 1 if self._nonfinite else 0
        return train_m, measured

    def evaluate(self, splits: Sequence[str] = evaluation.EVAL_SPLITS) -> dict[str, float]:
        if self.producer.prefetch.pending():
            # Called between sync points (run() never does): let the running pipeline finish,
            # then evaluate the live policy (the pipelines still pending install their own).
            self.producer.prefetch.wait()
            self.weights.sync(self.state, self.step)
        return evaluation.evaluate(
            self.services, self.domain, self.config, splits,
            reward_fns=self.reward_fns, step=self.step,
        )  # fmt: skip

    def _evaluate_due(self, final: bool) -> dict[str, float]:
        splits = evaluation.due_splits(self.config, self.step, final)
        if not splits:
            return {}
        t0 = time.perf_counter()
        m = self.evaluate(splits)
        m["time/eval"] = time.perf_counter() - t0
        return m

    def run(
        self, resume: bool = False, rebuild_controller_files: bool = False
    ) -> list[dict[str, Any]]:
        """Trains to ``train.steps``; ``resume`` continues the latest intact checkpoint, whose
        controllers' files must match its manifest unless ``rebuild_controller_files``."""
        cfg = self.config
        if self._given_reward_fns and self.primary:
            reward_fns_lib.record_in_run_dir(self.workdir, self.config, resume)
        self._restore_or_warmstart(resume, bool(rebuild_controller_files))
        total = int(cfg.train.steps)
        rows = []
        if self.step == 0:
            m = self._evaluate_due(final=False)
            if m:
                rows.append(self.metrics.write(0, m))
                logging.info(format_summary(0, m))
        show = bool(cfg.logging.progress_bar) and self.primary
        bar = progress_bar(total, self.step, enabled=show)
        try:
            with logs_above(bar):
                while self.step < total:
                    self.ckpt.check()  # a failed asynchronous save stops the run here
                    m = self.train_one_step()
                    m.update(self._evaluate_due(final=self.step == total))
                    # The previous step's save runs while this step trains: one that failed
                    # meanwhile stops the run before this step is recorded as trained.
                    self.ckpt.check()
                    # Row first, then the checkpoint: a kill in between replays this step on resume
                    # (rows after the restored step are dropped), so no row is ever lost.
                    rows.append(self.metrics.write(self.step, m))
                    if run_dir.checkpoint_due(cfg.checkpoint, self.step, total):
                        self.save()
                    call_step_end(self.callbacks, self.step, rows[-1], self.state)
                    bar.update(1)
                    bar.set_postfix(headline(m), refresh=False)
                    if self.step % int(cfg.logging.every) == 0:
                        logging.info(format_summary(self.step, m))
        finally:
            bar.close()
            self.producer.prefetch.drain()
            if not self.ckpt.failed:  # else its error is the one already on its way out
                self.ckpt.wait()
        return rows

    def close(self) -> None:
        self.producer.prefetch.close()
        self.ckpt.close()
        self.metrics.close()
        self.engine.close()


__all__ = [
    "ComponentError",
    "NonFiniteLossError",
    "StepCallback",
    "StepCallbackError",
    "StepTimer",
    "Trainer",
    "callback_name",
]
