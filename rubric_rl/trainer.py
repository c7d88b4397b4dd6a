"""The training loop (DESIGN §3). It owns no algorithm: the method's step pipeline (``step.py``)
produces the step's ``Rollouts``; the loop packs the selected trajectories into a ``TrainBatch``,
computes π_old, runs the updates, syncs the engine, and logs, evaluates and checkpoints.

Exact resume: every source of randomness is either a pure function of (seed, step) — engine seeds
(``sample_seed`` per stream), the stages' per-step numpy Generator from the saved JAX key — or
saved state (controllers' ``state_dict``, the key, the train state); files written after the
restored checkpoint (metrics, controller logs and directories) are rolled back.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from rubric_rl import async_rollouts, builders, evaluation, logs, run_dir, run_files, warmstart
from rubric_rl import reward_fns as reward_fns_lib
from rubric_rl.async_rollouts import Weights
from rubric_rl.checkpoint import RunCheckpointer, key_from_json, key_to_json
from rubric_rl.config_validation import validate_config
from rubric_rl.controllers.base import Controller
from rubric_rl.core import losses, sharding
from rubric_rl.core.train_step import TrainBatch, init_train_state, make_train_step
from rubric_rl.metrics import (
    ControllerLog,
    MetricsWriter,
    RolloutLogger,
    headline,
    logs_above,
    progress_bar,
)
from rubric_rl.metrics import summary_line as format_summary
from rubric_rl.reward_fns import RewardFn
from rubric_rl.services import ComponentError, Services
from rubric_rl.step import Pipeline, StepContext
from rubric_rl.step_metrics import oracle_diagnostics, rollout_rows, step_metrics
from rubric_rl.trainer_batch import rollouts_to_batch, update_batches


@dataclasses.dataclass
class _Produced:
    """One step's pipeline result with what it measured while it ran."""

    rollouts: Any
    ctx: StepContext
    controller_seconds: float
    service_seconds: dict[str, float]
    events: Mapping[str, Any]
    weight_version: int
    seconds: float


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps with a NaN/inf loss or gradient norm."""


class StepCallback(Protocol):
    """An object with ``on_step_end(step, metrics, state)`` (a plain function of those three
    arguments is accepted as well); see ``Trainer.add_callback``."""

    def on_step_end(self, step: int, metrics: Mapping[str, Any], state: Any) -> None: ...


class StepCallbackError(RuntimeError):
    """A step callback raised; the message names the callback and the step, the callback's own
    exception is the ``__cause__``."""

    def __init__(self, name: str, step: int, cause: BaseException):
        super().__init__(
            f"step callback {name} raised at step {step}: {type(cause).__name__}: {cause}"
        )
        self.callback, self.step = name, step


def callback_name(callback: Any) -> str:
    """``module.qualname`` of a function, or of an object's class."""
    target = callback if hasattr(callback, "__qualname__") else type(callback)
    return f"{getattr(target, '__module__', '?')}.{target.__qualname__}"


class StepTimer:
    """A step callback that times whole steps, as a benchmark of the training loop needs them.

    After each step it waits for the step's parameters (``jax.block_until_ready``: the update
    has run, not just been dispatched), then records the time and the step's metrics row
    (``rows``). A step's time is from the previous step's end to its own, so everything the loop
    does between two parameter sets counts (rollouts, rewards, update, weight sync, metrics,
    logging); the first step has no start and is never timed. ``summary(warmup)`` gives the
    medians over the steps after the first ``warmup`` (at least 1): ``step_s_median``,
    ``gen_s_median`` (the metrics' ``time/rollout``: generation) and ``train_s_median`` (each
    timed step's time less its generation), with ``steps`` (all recorded) and ``timed``."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.rows: list[dict[str, Any]] = []

    def on_step_end(self, step: int, metrics: Mapping[str, Any], state: Any) -> None:
        jax.block_until_ready(state.params)
        self.ends.append(time.perf_counter())
        self.rows.append(dict(metrics))

    def summary(self, warmup: int = 1) -> dict[str, float]:
        if warmup < 1:
            raise ValueError(f"StepTimer.summary: warmup={warmup}; the first step has no start")
        if len(self.ends) <= warmup:
            raise ValueError(
                f"StepTimer.summary: {len(self.ends)} step(s) recorded, none after the "
                f"{warmup} warm-up step(s)"
            )
        step_s = [b - a for a, b in zip(self.ends[warmup - 1 :], self.ends[warmup:])]
        gen_s = [float(r["time/rollout"]) for r in self.rows[warmup:]]
        return dict(
            steps=len(self.rows),
            timed=len(step_s),
            step_s_median=float(np.median(step_s)),
            gen_s_median=float(np.median(gen_s)),
            train_s_median=float(np.median([s - g for s, g in zip(step_s, gen_s)])),
        )


# The quantities of an update that make it non-finite (the jitted step skips on either).
# The run-state key of the controllers' file manifest written with each checkpoint.
CONTROLLER_FILES = "controller_files"
NONFINITE_CHECKED = (("loss", "loss"), ("grad_norm", "gradient norm"))


def nonfinite_updates(per_update: Sequence[Mapping[str, Any]]) -> list[str]:
    """One description per update whose loss or gradient norm is NaN/inf, naming the non-finite
    quantities and quoting the others: ``update 2 of 2: gradient norm inf (loss 0.0123)``."""
    out = []
    for i, u in enumerate(per_update):
        values = {name: float(u[k]) for k, name in NONFINITE_CHECKED if k in u}
        bad = [f"{n} {v}" for n, v in values.items() if not math.isfinite(v)]
        if bad:
            good = [f"{n} {v:.6g}" for n, v in values.items() if math.isfinite(v)]
            rest = f" ({', '.join(good)})" if good else ""
            out.append(f"update {i + 1} of {len(per_update)}: {', '.join(bad)}{rest}")
    return out


class Trainer:
    """``Trainer(config, workdir).run(resume=...)``: builds the run's parts and trains.

    ``callbacks``: step callbacks (``add_callback``), called in order after each step of ``run``.

    ``reward_fns``: plain Python reward functions (``rubric_rl/reward_fns.py``), a dict name ->
    callable or a list of callables named by ``__name__``, next to those ``config.reward_fns``
    names by import path; each is recorded in ``config.reward_fns`` (and the run's
    ``config.json``) as its "module:qualname". Train one with ``loss.reward=<name>`` or
    ``loss.reward_weights``.

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
        callbacks: Sequence[StepCallback | Callable[[int, Mapping[str, Any], Any], Any]] = (),
        reward_fns: Mapping[str, RewardFn] | Sequence[RewardFn] = (),
        tasks: Mapping[str, Sequence[Any]] | None = None,
        domain: builders.Domain | None = None,
    ):
        # Before the validation: it checks loss.reward / loss.reward_weights against the names.
        self._given_reward_fns = bool(reward_fns)
        self.reward_fns = reward_fns_lib.resolve_reward_fns(config, reward_fns)
        validate_config(config, num_devices=jax.device_count())
        # orbax / optax INFO lines dropped unless config.logging.library_info (the launcher too).
        logs.set_library_info(bool(config.logging.get("library_info", False)))
        self.callbacks: list[Any] = []
        for cb in callbacks:
            self.add_callback(cb)
        self.config = config
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.mesh = builders.build_mesh(config)
        self.domain = self._domain(config, tasks, domain)
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
        self._check_mix_owner()
        self.pipeline = pipeline if pipeline is not None else method_pipeline
        self.rng = jax.random.key(int(config.train.seed))
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
        self._nonfinite_streak = 0
        self._rebuild_controller_files = False  # run(rebuild_controller_files=...)
        self._nonfinite: list[str] = []  # the last step's non-finite updates, described
        self.ref_params = None  # the KL reference (loss.kl_beta > 0), set by _restore_or_warmstart
        self.weight_sync = None
        if config.rollout.engine == "sglang":
            from rubric_rl.rollout.weight_sync import WeightSync

            self.weight_sync = WeightSync(
                builders.weight_sync_root(config, self.workdir),
                dtype=str(config.rollout.sglang.get("export_dtype", "")),
            )
        # bypass mode feeds π_old = π_rollout to the rejection bands unless the step-start
        # log-probs are computed: a preset that rejects gets them every step.
        self._rejects = losses.rejects(str(config.loss.rollout_correction))
        # Asynchronous rollouts (rollout.max_staleness > 0): the pipelines run ahead of the update.
        self._prefetch = async_rollouts.Prefetcher(
            self._produce, overlap=bool(config.rollout.get("async_overlap", True))
        )

    # ------------------------------------------------------------------ tasks, rewards

    @staticmethod
    def _domain(config: Any, tasks: Any, domain: builders.Domain | None) -> builders.Domain:
        """``domain``, or one of ``tasks`` given in Python, or ``config.domain``'s."""
        if tasks is not None and domain is not None:
            raise ValueError("Trainer: give tasks= or domain=, not both")
        if tasks is None and domain is None:
            return builders.build_domain(config)
        out = domain if domain is not None else builders.tasks_domain(tasks)
        if int(config.warmstart.steps) > 0 and out.corpus is None:
            raise ValueError(
                f"config.warmstart.steps: {config.warmstart.steps}, but the tasks given to the "
                "Trainer have no warm-start corpus; set warmstart.steps=0"
            )
        return out

    def _check_mix_owner(self) -> None:
        """``loss.reward_weights`` is not for controllers that set the mix themselves."""
        mix = dict(self.config.loss.get("reward_weights") or {})
        own = self.controllers.signal_weights()
        if mix and own:
            raise ValueError(
                f"config.loss.reward_weights: {mix} given, but controllers set the trained mix "
                f"themselves (signal_weights {own}); leave loss.reward_weights empty"
            )

    # ------------------------------------------------------------------ callbacks

    def add_callback(
        self, callback: StepCallback | Callable[[int, Mapping[str, Any], Any], Any]
    ) -> None:
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
        if not callable(getattr(callback, "on_step_end", None)) and not callable(callback):
            raise TypeError(
                f"Trainer.add_callback: {callback!r} has no on_step_end(step, metrics, state) "
                "and is not callable"
            )
        self.callbacks.append(callback)

    def _step_end(self, metrics: Mapping[str, Any]) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, "on_step_end", None)
            fn = fn if callable(fn) else cb
            try:
                fn(self.step, dict(metrics), self.state)
            except Exception as e:
                raise StepCallbackError(callback_name(cb), self.step, e) from e

    # ------------------------------------------------------------------ setup / resume

    def _restore_or_warmstart(self, resume: bool) -> None:
        """Restore the latest checkpoint (``resume``) or warm-start; then set the KL reference:
        the policy RL starts from (the warm start, or the initial checkpoint), rebuilt on resume
        from the warm start's cache, never checkpointed."""
        kl = float(self.config.loss.kl_beta) > 0
        warm = int(self.config.warmstart.steps) > 0
        start = self.state.params  # the policy RL starts from when there is no warm start
        latest = self.ckpt.latest_step()
        if latest is not None and not resume:
            raise FileExistsError(
                f"--workdir {self.workdir} already holds checkpoints (latest step {latest}); "
                "pass --resume to continue it or choose a new --workdir"
            )
        if latest is None and resume:
            none = run_dir.writes_no_checkpoint(self.config.checkpoint)
            why = " (checkpoint.every=0 and checkpoint.final=False write none)" if none else ""
            raise FileNotFoundError(
                f"--resume: nothing to resume, {self.ckpt.directory} holds no checkpoint{why}; "
                "run without --resume to start a new run"
            )
        rs: dict[str, Any] = {}
        if latest is not None:
            if kl and warm:
                start = self._warm_start_params()  # the run's cached warm start
            self.state, rs = self._restore_intact()
            self.controllers.load_state_dict(rs["controllers"])
            self.rng = key_from_json(rs["rng"])
            self.step = int(rs["step"])
            self._nonfinite_streak = int(rs.get("nonfinite_streak", 0))
            logging.info("resumed from step %d (%s)", self.step, self.ckpt.directory)
        elif warm:
            start = self._warm_start_params()
            model = nnx.merge(self.graphdef, start, self.state.rest)
            self.graphdef, self.state = init_train_state(model, self.tcfg, self.mesh)
        # The step watermark: whatever was written after the restored step is replayed.
        self.metrics.truncate_after(self.step if latest is not None else -1)
        for log in self.controller_logs:
            log.truncate_after(self.step)
        if self.primary:
            run_files.rollback(self.controllers_dir, self.step)
            self.controllers.rollback(self.step)
            if latest is not None:
                self._verify_controller_files(rs.get(CONTROLLER_FILES))
        # A copy, taken before any update: the train step donates the state's buffers.
        self.ref_params = None
        if kl:
            ref_dtype = jnp.dtype(self.config.loss.get("kl_ref_dtype", "float32"))
            self.ref_params = jax.tree.map(lambda x: jnp.copy(x).astype(ref_dtype), start)
        self._sync_weights()

    def _restore_intact(self) -> tuple[Any, dict[str, Any]]:
        """The newest checkpoint that restores; a newer damaged one is named in a warning and set
        aside (``checkpoints_corrupt/``), so this run saves that step afresh."""
        step, state, rs, failed = self.ckpt.restore_intact(self.state)
        for e in failed:
            moved = self.ckpt.set_aside(e.step, primary=self.primary)
            logging.warning(
                "checkpoint step %d is unreadable (%s: %s); resuming from step %d instead, the "
                "damaged step moved to %s", e.step, e.path, e.reason, step, moved,
            )  # fmt: skip
        return state, rs

    def _verify_controller_files(self, saved: Mapping[str, Any] | None) -> None:
        """The controllers' files against the restored checkpoint's manifest (after the
        rollback): refused with ``ControllerFilesError`` naming each missing or short file or
        store, or with ``rebuild_controller_files`` one warning each and the run goes on with
        what is there. A checkpoint written before manifests existed has none to check."""
        if saved is None:
            logging.info("checkpoint step %d has no controller-file manifest to check", self.step)
            return
        problems = run_files.verify(self.controllers_dir, saved, self.controllers.disk_records())
        if not problems:
            return
        listed = "\n".join(f"  {p}" for p in problems)
        if self._rebuild_controller_files:
            for p in problems:
                logging.warning("--rebuild_controller_files: continuing without %s", p)
            return
        raise run_files.ControllerFilesError(
            f"--resume: the controllers' files do not match checkpoint step {self.step} "
            f"({self.ckpt.step_dir(self.step)}):\n{listed}\nrestore them from a copy of the "
            "run directory, or resume with --rebuild_controller_files to continue from what is "
            "there (the controllers then differ from an uninterrupted run's)"
        )

    def _warm_start_params(self):
        return warmstart.run_or_load(
            self.config, self.workdir, self.domain, self.tokenizer, self.graphdef, self.state,
            self.mesh,
        )  # fmt: skip

    def _sync_weights(self) -> None:
        if self.weight_sync is not None:
            model = nnx.merge(self.graphdef, self.state.params, self.state.rest)
            self.weight_sync.sync(self.engine, model, int(self.step))
        else:
            self.engine.update_weights(self.state, int(self.step))

    def load_policy(self, step: int, checkpoint_dir: str | None = None) -> None:
        """Trains and serves the policy of checkpoint ``step`` from now on: this run's
        (``<workdir>/checkpoints``) or another run's (``checkpoint_dir``, a run's
        ``checkpoints`` directory of the same model and optimiser). The train state (parameters,
        optimiser) and ``self.step`` are restored and the engine serves the parameters; the
        controllers' state and the RNG are not (that is ``run(resume=True)``): for analyses of a
        run's checkpoints (``rised_transfer``) and notebooks."""
        if checkpoint_dir is None:
            self.state, _ = self.ckpt.restore(self.state, int(step))
        else:
            other = RunCheckpointer(checkpoint_dir, keep=None, async_save=False)
            try:
                self.state, _ = other.restore(self.state, int(step))
            finally:
                other.close()
        self.step = int(step)
        self._sync_weights()

    def save(self, wait: bool = False) -> None:
        if self._prefetch.pending():
            raise RuntimeError(
                f"Trainer.save at step {self.step}: pipelines of later steps have already run "
                "(rollout.max_staleness > 0), so the controllers' state is not step "
                f"{self.step}'s and a resume would not be exact; save at a sync point (run() "
                "does: checkpoint.every)"
            )
        run_state = {
            "step": int(self.step),
            "controllers": self.controllers.state_dict(),
            "rng": key_to_json(self.rng),
            "nonfinite_streak": self._nonfinite_streak,
            CONTROLLER_FILES: run_files.manifest(
                self.controllers_dir, self.controllers.disk_records()
            ),
        }
        self.ckpt.save(self.step, self.state, run_state, wait=wait)

    # ------------------------------------------------------------------ one step

    def _produce(self, step: int, weights: Weights | None = None) -> _Produced:
        """Step ``step``'s pipeline (everything before the update) on the engine; with
        ``weights`` (asynchronous rollouts) the engine serves that copy first. Runs on the
        prefetch thread when rollouts overlap the update: it touches the engine, the services,
        the controllers and the key, which nothing on the trainer's thread uses meanwhile."""
        t0 = time.perf_counter()
        if weights is not None:
            self._serve(weights)
        self.rng, key = jax.random.split(self.rng)
        np_rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).tolist())
        self.controllers.pop_seconds()
        self.services.pop_seconds()
        self.services.begin_step(step)
        ctx = StepContext(
            step, self.config, np_rng, self.services, self.controllers, self.domain,
            reward_fns=self.reward_fns,
        )  # fmt: skip
        rollouts = self.pipeline(ctx)
        return _Produced(
            rollouts=rollouts,
            ctx=ctx,
            controller_seconds=self.controllers.pop_seconds(),
            service_seconds=self.services.pop_seconds(),
            events=self.controllers.pop_events(),
            weight_version=int(self.engine.weight_version),
            seconds=time.perf_counter() - t0,
        )

    def _serve(self, weights: Weights) -> None:
        """The engine serves ``weights`` (a copy, see ``_weights_copy``) from now on."""
        if self.weight_sync is not None:
            if self.engine.weight_version == weights.version:
                return  # the server already holds this version (its own copy, on disk)
            model = nnx.merge(self.graphdef, weights.params, weights.rest)
            self.weight_sync.sync(self.engine, model, weights.version)
        else:
            self.engine.update_weights(weights, weights.version)

    def _weights_copy(self) -> Weights:
        """The live policy copied (the next update donates its buffers), complete before the
        update is dispatched."""
        params = jax.tree.map(jnp.copy, self.state.params)
        rest = jax.tree.map(jnp.copy, self.state.rest)
        jax.block_until_ready((params, rest))
        return Weights(params, rest, int(self.step))

    def _rollouts_for(self, step: int, k: int) -> tuple[_Produced, float]:
        """Step ``step``'s pipeline result and the seconds the trainer waited for it; with
        ``rollout.max_staleness`` = k > 0, first starts the pipelines k steps ahead."""
        if k == 0:
            return self._produce(step), 0.0
        t0 = time.perf_counter()
        p = self._prefetch.take(step) if self._prefetch.has(step) else self._produce(step)
        waited = time.perf_counter() - t0
        ahead = async_rollouts.prefetch_steps(
            step, k, async_rollouts.next_sync_point(self.config, step), self._prefetch.submitted
        )
        if ahead:
            weights = self._weights_copy()  # version step - 1 = w(s) for every s ahead
            for s in ahead:
                self._prefetch.submit(s, weights)
        return p, waited

    def train_one_step(self) -> dict[str, Any]:
        step = self.step + 1
        t_start = time.perf_counter()
        async_k = int(self.config.rollout.get("max_staleness", 0))
        p, waited = self._rollouts_for(step, async_k)
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
            self._sync_weights()
        t["sync"] = time.perf_counter() - t0
        self._check_nonfinite(step)
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
        self._nonfinite_streak = self._nonfinite_streak + 1 if self._nonfinite else 0
        return train_m, measured

    def _check_nonfinite(self, step: int) -> None:
        if (n := self._nonfinite_streak) == 0:
            return
        limit = int(self.config.train.max_nonfinite_skips)
        what = "; ".join(self._nonfinite)
        done = "skipped" if limit > 0 else "APPLIED (train.max_nonfinite_skips = 0)"
        logging.warning("step %d, non-finite %s: %s (%d steps in a row)", step, what, done, n)
        if n >= limit:
            raise NonFiniteLossError(
                f"{n} consecutive steps with a non-finite update (last: step {step}, {what}); "
                f"stopping (train.max_nonfinite_skips = {limit})"
            )

    def evaluate(self, splits: Sequence[str] = evaluation.EVAL_SPLITS) -> dict[str, float]:
        if self._prefetch.pending():
            # Called between sync points (run() never does): let the running pipeline finish,
            # then evaluate the live policy (the pipelines still pending install their own).
            self._prefetch.wait()
            self._sync_weights()
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

    def _checkpoint_due(self, total: int) -> bool:
        return run_dir.checkpoint_due(self.config.checkpoint, self.step, total)

    def run(
        self, resume: bool = False, rebuild_controller_files: bool = False
    ) -> list[dict[str, Any]]:
        """Trains to ``train.steps``; ``resume`` continues the latest intact checkpoint, whose
        controllers' files must match its manifest unless ``rebuild_controller_files``."""
        cfg = self.config
        self._rebuild_controller_files = bool(rebuild_controller_files)
        if self._given_reward_fns and self.primary:
            reward_fns_lib.record_in_run_dir(self.workdir, self.config, resume)
        self._restore_or_warmstart(resume)
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
                    if self._checkpoint_due(total):
                        self.save()
                    self._step_end(rows[-1])
                    bar.update(1)
                    bar.set_postfix(headline(m), refresh=False)
                    if self.step % int(cfg.logging.every) == 0:
                        logging.info(format_summary(self.step, m))
        finally:
            bar.close()
            self._prefetch.drain()
            if not self.ckpt.failed:  # else its error is the one already on its way out
                self.ckpt.wait()
        return rows

    def close(self) -> None:
        self._prefetch.close()
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
