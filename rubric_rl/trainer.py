"""The training loop (DESIGN §3). It owns no algorithm: sampling, prompt decoration, observation and
teacher contexts come from controllers; losses, advantages and the update from ``core``; rewards
from ``rubrics``. One step:

    sample_tasks -> decorate -> generate J per task -> judge -> rewards, advantages
    -> controllers.observe -> TrainBatch -> train_step -> engine.update_weights
    -> metrics / eval / checkpoint

Exact resume: every source of randomness is either a pure function of (seed, step) — engine seeds
(``sample_seed``), the controllers' per-step numpy Generator from the saved JAX key — or saved state
(controllers' ``state_dict``, the key, the train state); a resumed run replays the same steps.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from configs.common import validate_config
from rubric_rl import builders, warmstart
from rubric_rl.checkpoint import RunCheckpointer, key_from_json, key_to_json
from rubric_rl.controllers.base import Controller, Evidence
from rubric_rl.core import sharding
from rubric_rl.core.advantages import ADVANTAGE_ESTIMATORS
from rubric_rl.core.train_step import TrainBatch, init_train_state, make_train_step
from rubric_rl.metrics import ControllerLog, MetricsWriter, RolloutLogger, progress_bar
from rubric_rl.metrics import summary_line as format_summary
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rollout.jax_engine import round_up_to_bucket
from rubric_rl.rubrics.judges import JudgeItem
from rubric_rl.rubrics.rewards import POINTS_SCALE, batch_rewards
from rubric_rl.rubrics.scores import failure_counts, pack_verdicts
from rubric_rl.rubrics.types import append_to_last_user
from rubric_rl.trainer_batch import build_train_batch, mini_batches


class ComponentError(RuntimeError):
    """A component (rollout engine, judge) failed after its retries; the message names it."""


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps with a NaN/inf loss."""


def _timed(acc: dict[str, float], key: str):
    class _T:
        def __enter__(self):
            self.t0 = time.perf_counter()

        def __exit__(self, *exc):
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - self.t0

    return _T()


class Trainer:
    """``Trainer(config, workdir).run(resume=...)``: builds the run's parts and trains."""

    def __init__(
        self,
        config: Any,
        workdir: str,
        *,
        judge: Any = None,
        extra_controllers: Sequence[Controller] = (),
    ):
        validate_config(config, num_devices=jax.device_count())
        self.config = config
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.mesh = builders.build_mesh(config)
        self.domain = builders.build_domain(config)
        self.tokenizer = builders.build_tokenizer(config, self.domain, self.workdir)
        self.tcfg = builders.train_config(config)
        with jax.set_mesh(self.mesh):
            model = builders.build_model(config, self.tokenizer, self.mesh)
        self.graphdef, self.state = init_train_state(model, self.tcfg, self.mesh)
        self.train_step = make_train_step(self.tcfg, self.graphdef, self.mesh)
        self.engine = builders.build_engine(config, model, self.tokenizer, self.mesh)
        self.judge = judge if judge is not None else builders.build_judge(config, self.workdir)
        self.controllers = builders.build_controllers(config, self.domain, extra_controllers)
        self.rng = jax.random.key(int(config.train.seed))
        self.step = 0
        self.ckpt = RunCheckpointer(
            os.path.join(self.workdir, "checkpoints"), keep=int(config.checkpoint.keep)
        )
        lg = config.logging
        # Multi-host: every process runs the same loop; only process 0 writes the run directory's
        # logs (orbax coordinates the checkpoint writes itself).
        self.primary = jax.process_index() == 0
        self.metrics = MetricsWriter(
            self.workdir,
            tensorboard=bool(lg.tensorboard),
            wandb_config={
                "enabled": lg.wandb,
                "project": lg.wandb_project,
                "config": config.to_dict(),
            },
            primary=self.primary,
        )
        self.rollout_log = RolloutLogger(self.workdir, primary=self.primary)
        self.controller_logs = [
            ControllerLog(self.workdir, c.name, primary=self.primary)
            for c in self.controllers.controllers
        ]
        self._nonfinite_streak = 0
        self.ref_params = None  # the KL reference (loss.kl_beta > 0), set by _restore_or_warmstart
        self.weight_sync = None
        if config.rollout.engine == "sglang":
            from rubric_rl.rollout.weight_sync import WeightSync

            root = config.rollout.sglang.weight_sync_dir or os.path.join(self.workdir, "weights")
            self.weight_sync = WeightSync(root)

    # ------------------------------------------------------------------ setup / resume

    def _restore_or_warmstart(self, resume: bool) -> None:
        """Restore the latest checkpoint (``resume``) or warm-start; then set the KL reference.

        The reference policy (``loss.kl_beta > 0``) is the policy RL starts from: the warm-started
        parameters, or the initial ones (a checkpoint) without a warm start. It is rebuilt, never
        checkpointed: on resume the warm start's cached parameters (or the checkpoint the model
        was built from) give it back bit for bit."""
        kl = float(self.config.loss.kl_beta) > 0
        warm = int(self.config.warmstart.steps) > 0
        start = self.state.params  # the policy RL starts from when there is no warm start
        latest = self.ckpt.latest_step()
        if latest is not None and not resume:
            raise FileExistsError(
                f"--workdir {self.workdir} already holds checkpoints (latest step {latest}); "
                "pass --resume to continue it or choose a new --workdir"
            )
        if latest is not None:
            if kl and warm:
                start = self._warm_start_params()  # the run's cached warm start
            self.state, rs = self.ckpt.restore(self.state)
            self.controllers.load_state_dict(rs["controllers"])
            self.rng = key_from_json(rs["rng"])
            self.step = int(rs["step"])
            self._nonfinite_streak = int(rs.get("nonfinite_streak", 0))
            self.metrics.truncate_after(self.step)
            for log in self.controller_logs:
                log.truncate_after(self.step)
            logging.info("resumed from step %d (%s)", self.step, self.ckpt.directory)
        else:
            self.metrics.truncate_after(-1)
            if warm:
                start = self._warm_start_params()
                model = nnx.merge(self.graphdef, start, self.state.rest)
                self.graphdef, self.state = init_train_state(model, self.tcfg, self.mesh)
        # A copy, taken before any update: the train step donates the state's buffers.
        self.ref_params = jax.tree.map(jnp.copy, start) if kl else None
        self._sync_weights()

    def _warm_start_params(self):
        """The warm-started parameters: trained now, or the run's cached ones (warmstart.py)."""
        return warmstart.run_or_load(
            self.config,
            self.workdir,
            self.domain,
            self.tokenizer,
            self.graphdef,
            self.state,
            self.mesh,
        )

    def _sync_weights(self) -> None:
        version = int(self.step)
        if self.weight_sync is not None:
            model = nnx.merge(self.graphdef, self.state.params, self.state.rest)
            self.weight_sync.sync(self.engine, model, version)
        else:
            self.engine.update_weights(self.state, version)

    def run_state(self) -> dict[str, Any]:
        return {
            "step": int(self.step),
            "controllers": self.controllers.state_dict(),
            "rng": key_to_json(self.rng),
            "nonfinite_streak": self._nonfinite_streak,
        }

    def save(self, wait: bool = False) -> None:
        self.ckpt.save(self.step, self.state, self.run_state(), wait=wait)

    # ------------------------------------------------------------------ components

    def encode_prompt(
        self, messages: list[dict], what: str = "prompt", field: str = "max_prompt_len"
    ) -> tuple[int, ...]:
        """Chat-template token ids; longer than ``model.<field>`` is an error, never a silent
        truncation (cutting the start of a prompt drops its instruction)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        cap = int(self.config.model[field])
        if len(ids) > cap:
            raise ValueError(
                f"{what}: {len(ids)} tokens (chat template and guidance included) > "
                f"config.model.{field}={cap}; raise it (the prompt would lose its start)"
            )
        return tuple(ids)

    def prompt_len(self, lengths: Sequence[int], field: str = "max_prompt_len") -> int:
        """The padded prompt length of a batch: the smallest bucket that fits its longest."""
        buckets = builders.prompt_buckets(self.config, int(self.config.model[field]))
        return round_up_to_bucket(max(lengths), buckets)

    def generate(
        self,
        prompts: Sequence[list[dict]],
        params: SamplingParams,
        step: int,
        task_ids: Sequence[str] | None = None,
    ):
        requests = [
            GenerationRequest(
                self.encode_prompt(m, f"task {task_ids[g] if task_ids else g} at step {step}"),
                request_id=f"s{step}-t{g}",
                step=step,
                task_index=g,
            )
            for g, m in enumerate(prompts)
        ]
        retries = int(self.config.rollout.retries)
        for attempt in range(retries + 1):
            try:
                return requests, self.engine.generate(requests, params)
            except Exception as e:  # noqa: BLE001 - any engine failure is retried, then named
                err = e
                logging.warning("rollout engine attempt %d failed: %r", attempt + 1, e)
        raise ComponentError(
            f"rollout engine {type(self.engine).__name__} failed {retries + 1} times: {err!r}"
        ) from err

    def judge_groups(self, tasks, responses) -> list[list[list[Any]]]:
        """verdicts[g][j] = the judge's verdicts on responses[g][j]; a judge that raises on
        every attempt, or fails more than ``judge.max_failure_rate`` of the verdicts, is an
        error naming it (failed verdicts are never turned into zero rewards)."""
        items = [JudgeItem(t, r) for t, rs in zip(tasks, responses) for r in rs]
        name = type(self.judge).__name__
        retries = int(self.config.judge.retries)
        for attempt in range(retries + 1):
            try:
                flat = self.judge.score(items)
                break
            except Exception as e:  # noqa: BLE001
                err = e
                logging.warning("judge %s attempt %d failed: %r", name, attempt + 1, e)
        else:
            raise ComponentError(f"judge {name} failed {retries + 1} times: {err!r}") from err
        total = sum(len(v) for v in flat)
        failed = [x for v in flat for x in v if x.met is None]
        if total and len(failed) / total > float(self.config.judge.max_failure_rate):
            raise ComponentError(
                f"judge {name}: {len(failed)}/{total} verdicts failed (> judge.max_failure_rate="
                f"{self.config.judge.max_failure_rate}); first error: {failed[0].error!r}"
            )
        out, k = [], 0
        for rs in responses:
            out.append(flat[k : k + len(rs)])
            k += len(rs)
        return out

    def score(self, tasks, verdicts):
        groups = [[{v.criterion_id: v for v in vs} for vs in g] for g in verdicts]
        scores = pack_verdicts(groups, [t.rubric.evaluated() for t in tasks])
        rewards = batch_rewards(self.config.loss.reward, scores).values.astype(np.float64)
        return scores, rewards

    def teacher_inputs(self, tasks, prompts, requests, evidence: Evidence) -> dict[str, Any]:
        """Self-distillation inputs from the controllers (DESIGN §3–5): per group the teacher
        prompt's token ids (the decorated prompt with the controllers' privileged context appended
        to its last user message; None = no context, so no SD term) and λ = ``loss.sd_coef`` ×
        the controllers' gate."""
        contexts = [self.controllers.teacher_context(t_, evidence) for t_ in tasks]
        teacher_prompts = []
        for t_, msgs, ctx in zip(tasks, prompts, contexts):
            if not ctx or not ctx.strip():
                teacher_prompts.append(None)
                continue
            what = f"teacher prompt of task {t_.id}"
            msgs = append_to_last_user(msgs, ctx.strip(), what=what)
            teacher_prompts.append(self.encode_prompt(msgs, what, "max_teacher_prompt_len"))
        gate = self.controllers.sd_gate(evidence)
        coef = float(self.config.loss.sd_coef) * (np.ones(len(tasks)) if gate is None else gate)
        # Teacher rows are at least as long as the student's (a group without context uses the
        # student's prompt), in the same buckets up to model.max_teacher_prompt_len.
        lengths = [len(p) for p in teacher_prompts if p is not None]
        lengths += [len(r.prompt_ids) for r in requests]
        return {
            "teacher_prompts": teacher_prompts,
            "sd_coef": coef,
            "teacher_prompt_len": self.prompt_len(lengths, "max_teacher_prompt_len"),
        }

    # ------------------------------------------------------------------ one step

    def train_one_step(self) -> dict[str, Any]:
        cfg = self.config
        step = self.step + 1
        t: dict[str, float] = {}
        t_start = time.perf_counter()
        self.rng, key = jax.random.split(self.rng)
        np_rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).tolist())
        self.controllers.pop_seconds()
        batch = self.controllers.sample_tasks(step, np_rng)
        tasks = batch.tasks
        prompts = self.controllers.decorate(tasks, [t_.messages for t_ in tasks])
        j = int(cfg.rollout.samples_per_task)
        sp = SamplingParams(
            max_new_tokens=int(cfg.rollout.max_new_tokens),
            temperature=float(cfg.rollout.temperature),
            top_p=float(cfg.rollout.top_p),
            top_k=int(cfg.rollout.top_k) if cfg.rollout.top_k > 0 else -1,
            n=j,
        )
        with _timed(t, "rollout"):
            requests, gens = self.generate(prompts, sp, step, [t_.id for t_ in tasks])
        responses = [[self.tokenizer.decode(g.token_ids) for g in gs] for gs in gens]
        with _timed(t, "judge"):
            verdicts = self.judge_groups(tasks, responses)
            scores, rewards = self.score(tasks, verdicts)
        # Was hard-coded to "grpo", so config could not select Dr.GRPO's scale-keeping estimator
        # (configs/common.py explains why the embedded default needs it).
        est = ADVANTAGE_ESTIMATORS.get(str(cfg.loss.advantage))
        adv, zero_var = est(
            np.nan_to_num(rewards),
            eps=float(cfg.loss.adv_eps),
            zero_variance_tol=float(cfg.loss.zero_var_eps),
            valid=~np.isnan(rewards),
        )
        adv, zero_var = np.asarray(adv, np.float64), np.asarray(zero_var)
        shaped = self.controllers.advantages(tasks, responses, scores)
        if shaped is not None:  # a method's own reward shaping (e.g. ARISE) replaces GRPO's
            adv = shaped
        trainable = ~np.isnan(adv) & (~np.isnan(rewards) if shaped is None else True)
        adv = np.nan_to_num(adv)
        evidence = Evidence(
            step=step,
            tasks=tasks,
            prompts=tuple(prompts),
            responses=tuple(tuple(r) for r in responses),
            verdicts=tuple(tuple(tuple(v) for v in g) for g in verdicts),
            scores=scores,
            rewards=rewards,
            advantages=adv,
        )
        ctrl_metrics = self.controllers.observe(evidence)
        teacher = (
            self.teacher_inputs(tasks, prompts, requests, evidence)
            if self.tcfg.needs_teacher
            else {}
        )
        if teacher:
            ctrl_metrics["sd/context_frac"] = float(
                np.mean([p is not None for p in teacher["teacher_prompts"]])
            )
            ctrl_metrics["sd/coef_mean"] = float(np.mean(teacher["sd_coef"]))
        tb = build_train_batch(
            requests,
            gens,
            adv,
            batch.weights,
            trainable,
            prompt_len=self.prompt_len([len(r.prompt_ids) for r in requests]),
            buckets=tuple(cfg.rollout.buckets),
            pad_id=int(self.tokenizer.pad_id or 0),
            mesh=self.mesh,
            teacher_prompts=teacher.get("teacher_prompts"),
            sd_coef=teacher.get("sd_coef"),
            teacher_prompt_len=teacher.get("teacher_prompt_len", 0),
        )
        with _timed(t, "train"):
            every = int(cfg.loss.mismatch_every)
            measured = every > 0 and step % every == 0
            # On a CPU mesh of several devices each program here finishes before the next is
            # dispatched (sharding.settle): the π_old forward, the mini-batch gathers and the
            # updates are independent programs with collectives, which XLA:CPU can deadlock on.
            settle = functools.partial(sharding.settle, mesh=self.mesh)
            if not self.tcfg.decoupled:
                # Bypass: π_old := π_rollout. On measured steps the step-start forward replaces
                # it for diagnostics only; elsewhere the same array keeps the jitted shapes.
                old = settle(self.train_step.compute_logps(self.state, tb)) if measured else None
                tb = tb.replace(old_logps=tb.rollout_logps if old is None else old)
            else:
                # Decoupled: π_old is the step-start policy for every update (optim.mini_batches
                # x epochs), so it is computed here once, not by each update from the live state.
                tb = tb.replace(old_logps=settle(self.train_step.compute_logps(self.state, tb)))
            # With train.max_nonfinite_skips > 0 the jitted step itself keeps the old state on
            # a NaN/inf loss (TrainConfig.skip_nonfinite): no copy of the state is held here.
            per_update = []
            for sub in self.update_batches(tb, step):
                self.state, m_ = settle(self.train_step(self.state, settle(sub), self.ref_params))
                per_update.append(m_)
            per_update = jax.device_get(per_update)
            # Means over the step's updates; train/skipped is the share of updates skipped.
            train_m = {k: float(np.mean([u[k] for u in per_update])) for k in per_update[0]}
            train_m["train/updates"] = float(len(per_update))
            loss = float(train_m["loss"])
            if float(train_m.get("train/skipped", 0.0)) > 0:
                self._nonfinite_streak += 1
            else:
                self._nonfinite_streak = 0
        self.step = step
        # Sync first, even on a skipped step: the train step donated the state the engine was
        # serving, so the engine must get the live one before anything else (an error included).
        with _timed(t, "sync"):
            self._sync_weights()
        skipped = self._nonfinite_streak > 0
        if skipped:
            logging.warning(
                "step %d: non-finite loss %r, update skipped (%d in a row)",
                step,
                loss,
                self._nonfinite_streak,
            )
            if self._nonfinite_streak >= int(cfg.train.max_nonfinite_skips):
                raise NonFiniteLossError(
                    f"{self._nonfinite_streak} consecutive steps with a non-finite loss (last: "
                    f"step {step}, loss {loss}); stopping (train.max_nonfinite_skips)"
                )
        t["controllers"] = self.controllers.pop_seconds()
        t["step"] = time.perf_counter() - t_start
        m = self._step_metrics(scores, rewards, zero_var, gens, train_m, t, measured)
        m.update(ctrl_metrics)
        for log, events in zip(self.controller_logs, self.controllers.pop_events().values()):
            for e in events:
                e = dict(e)
                e.pop("step", None)
                log.log(step, str(e.pop("event", "event")), **e)
        m["train/skipped"] = float(skipped)
        self._log_rollouts(step, tasks, prompts, responses, verdicts, rewards, adv, gens)
        return m

    def update_batches(self, tb: TrainBatch, step: int) -> Iterator[TrainBatch]:
        """The optimizer updates of one RL step: ``optim.epochs`` passes over the batch, each
        dealt into ``optim.mini_batches`` mini-batches by a permutation seeded with (train.seed,
        step, epoch), so a resumed run replays the same updates."""
        o = self.config.optim
        for epoch in range(int(o.epochs)):
            rng = np.random.default_rng([int(self.config.train.seed), step, epoch])
            yield from mini_batches(tb, int(o.mini_batches), rng, self.mesh)

    def _step_metrics(
        self, scores, rewards, zero_var, gens, train_m, t, measured: bool
    ) -> dict[str, Any]:
        d = rewards[~np.isnan(rewards)]
        m: dict[str, Any] = {
            "reward/mean": float(d.mean()) if d.size else float("nan"),
            "reward/std": float(d.std()) if d.size else float("nan"),
            "reward/points": float(POINTS_SCALE * d.mean()) if d.size else float("nan"),
            "reward/undefined": int(np.isnan(rewards).sum()),
            "reward/zero_variance_frac": float(np.mean(zero_var)),
        }
        m.update(failure_counts(scores))
        for cid, rate in criterion_pass_rates(scores).items():
            m[f"criteria/{cid}/pass_rate"] = rate
        for k, v in train_m.items():
            if k.startswith("rollout_corr/") and not measured:
                continue  # not measured this step (loss.mismatch_every): no fake zeros
            m[k if k.startswith(("loss", "train/")) else f"train/{k}"] = float(np.asarray(v))
        lens = np.array([len(g.token_ids) for gs in gens for g in gs])
        fin = [g.finish_reason for gs in gens for g in gs]
        m["rollout/len_mean"] = float(lens.mean())
        m["rollout/stop_frac"] = float(np.mean([f == "stop" for f in fin]))
        m["perf/tokens_per_s"] = float(lens.sum() / max(t["rollout"], 1e-9))
        for k, v in t.items():
            m[f"time/{k}"] = float(v)
        m["time/controllers_frac"] = t["controllers"] / max(t["step"], 1e-9)
        return m

    def _log_rollouts(self, step, tasks, prompts, responses, verdicts, rewards, adv, gens):
        n = int(self.config.logging.rollouts_per_step)
        if n <= 0:
            return
        rows = []
        j = len(responses[0]) if responses else 0
        for k in range(min(n, len(tasks) * j)):
            g, i = divmod(k, j)
            rows.append(
                {
                    "step": step,
                    "task_id": tasks[g].id,
                    "prompt": prompts[g],
                    "response": responses[g][i],
                    "reward": float(rewards[g, i]),
                    "advantage": float(adv[g, i]),
                    "finish_reason": gens[g][i].finish_reason,
                    "verdicts": {v.criterion_id: v.met for v in verdicts[g][i]},
                }
            )
        self.rollout_log.write(step, rows)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self) -> dict[str, float]:
        """HarnessRL §3 protocol: greedy, no guidance, seed rubrics, the frozen judge."""
        out: dict[str, float] = {}
        n = int(self.config.eval.n)
        temp = 0.0 if self.config.eval.greedy else float(self.config.rollout.temperature)
        sp = SamplingParams(
            max_new_tokens=int(self.config.rollout.max_new_tokens), temperature=temp, n=1
        )
        for split in ("heldout", "ood"):
            tasks = list(getattr(self.domain, split))[:n]
            if not tasks:
                continue
            _, gens = self.generate(
                [t_.messages for t_ in tasks], sp, self.step, [t_.id for t_ in tasks]
            )
            responses = [[self.tokenizer.decode(gs[0].token_ids)] for gs in gens]
            verdicts = self.judge_groups(tasks, responses)
            scores, rewards = self.score(tasks, verdicts)
            for cid, rate in criterion_pass_rates(scores).items():
                out[f"eval/{split}/criteria/{cid}"] = rate
            r = rewards[:, 0]
            out[f"eval/{split}/score"] = (
                float(POINTS_SCALE * np.nanmean(r)) if np.any(~np.isnan(r)) else float("nan")
            )
            if self.domain.verify is not None:
                out[f"eval/{split}/pass_rate"] = float(
                    np.mean([self.domain.verify(t_, rs[0]) for t_, rs in zip(tasks, responses)])
                )
            if self.domain.oracle is not None:
                out[f"eval/{split}/oracle"] = float(
                    np.mean([self.domain.oracle(t_, rs[0]) for t_, rs in zip(tasks, responses)])
                )
        return out

    # ------------------------------------------------------------------ the loop

    def run(self, resume: bool = False) -> list[dict[str, Any]]:
        cfg = self.config
        self._restore_or_warmstart(resume)
        total = int(cfg.train.steps)
        every = int(cfg.eval.every)
        rows = []
        if self.step == 0 and cfg.eval.at_start and every > 0:
            t0 = time.perf_counter()
            m = self.evaluate()
            m["time/eval"] = time.perf_counter() - t0
            rows.append(self.metrics.write(0, m))
            logging.info(format_summary(0, m))
        bar = progress_bar(
            total, self.step, enabled=bool(cfg.logging.progress_bar) and self.primary
        )
        try:
            while self.step < total:
                m = self.train_one_step()
                if every > 0 and (self.step % every == 0 or self.step == total):
                    t0 = time.perf_counter()
                    m.update(self.evaluate())
                    m["time/eval"] = time.perf_counter() - t0
                # Row first, then the checkpoint: a kill in between replays this step on resume
                # (rows after the restored step are dropped), so no row is ever lost.
                rows.append(self.metrics.write(self.step, m))
                if self.step % int(cfg.checkpoint.every) == 0 or self.step == total:
                    self.save()
                bar.update(1)
                bar.set_postfix(_short(m), refresh=False)
                if self.step % int(cfg.logging.every) == 0:
                    logging.info(format_summary(self.step, m))
        finally:
            bar.close()
            self.ckpt.wait()
        return rows

    def close(self) -> None:
        self.ckpt.close()
        self.metrics.close()
        self.engine.close()


def _short(m: dict[str, Any]) -> dict[str, str]:
    from rubric_rl.metrics import headline

    return headline(m)


def criterion_pass_rates(scores) -> dict[str, float]:
    """Per criterion id (pooled over the groups that have it): met / valid verdicts."""
    met: dict[str, float] = {}
    cnt: dict[str, float] = {}
    for g, ids in enumerate(scores.criterion_ids):
        for i, cid in enumerate(ids):
            v = scores.valid[g, i]
            met[cid] = met.get(cid, 0.0) + float(scores.met[g, i][v].sum())
            cnt[cid] = cnt.get(cid, 0.0) + float(v.sum())
    return {cid: met[cid] / cnt[cid] for cid in sorted(met) if cnt[cid] > 0}


__all__ = ["ComponentError", "NonFiniteLossError", "Trainer", "criterion_pass_rates"]
