"""The run's checkpointed state beside the train state (step, controllers, key, non-finite
streak, the controllers' file manifest, the sampler's held policies), and how a run begins:
restored from the latest intact checkpoint (``--resume``), or from the warm start, with the KL
reference set either way.

Functions of a ``Trainer``: they read and set its ``state``, ``step``, ``producer.rng`` and
``nonfinite_streak``, the parts of the loop a checkpoint holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from rubric_rl.checkpoint import TREES, key_from_json, key_to_json
from rubric_rl.core.train_step import init_train_state
from rubric_rl.pre_rl import warmstart
from rubric_rl.runs import run_dir, run_files

# The run-state key of the controllers' file manifest written with each checkpoint.
CONTROLLER_FILES = "controller_files"
# The run-state key (names, steps, versions) and trees key (parameters) of the held policies.
HELD_POLICIES = "held_policies"


def save(t: Any, wait: bool = False) -> None:
    """Checkpoints step ``t.step``: the train state and the run state; refused between sync
    points of asynchronous rollouts (the controllers have already seen later steps)."""
    if t.producer.prefetch.pending():
        raise RuntimeError(
            f"Trainer.save at step {t.step}: pipelines of later steps have already run "
            "(rollout.max_staleness > 0), so the controllers' state is not step "
            f"{t.step}'s and a resume would not be exact; save at a sync point (run() "
            "does: checkpoint.every)"
        )
    rs = {
        "step": int(t.step),
        "controllers": t.controllers.state_dict(),
        "rng": key_to_json(t.producer.rng),
        "nonfinite_streak": t.nonfinite_streak,
        CONTROLLER_FILES: run_files.manifest(t.controllers_dir, t.controllers.disk_records()),
    }
    held, params = t.services.sampler.held_state()
    if held:
        rs[HELD_POLICIES] = held
    t.ckpt.save(t.step, t.state, rs, trees={HELD_POLICIES: params} if held else None, wait=wait)


def restore_or_warmstart(t: Any, resume: bool, rebuild_controller_files: bool = False) -> None:
    """Restore the latest checkpoint (``resume``) or warm-start; then set the KL reference: the
    policy RL starts from (the warm start, or the initial checkpoint), rebuilt on resume from
    the warm start's cache, never checkpointed. Files written after the restored step (metrics,
    controller logs and directories) are rolled back."""
    kl = float(t.config.loss.kl_beta) > 0
    warm = int(t.config.warmstart.steps) > 0
    start = t.state.params  # the policy RL starts from when there is no warm start
    latest = t.ckpt.latest_step()
    if latest is not None and not resume:
        raise FileExistsError(
            f"--workdir {t.workdir} already holds checkpoints (latest step {latest}); "
            "pass --resume to continue it or choose a new --workdir"
        )
    if latest is None and resume:
        none = run_dir.writes_no_checkpoint(t.config.checkpoint)
        why = " (checkpoint.every=0 and checkpoint.final=False write none)" if none else ""
        raise FileNotFoundError(
            f"--resume: nothing to resume, {t.ckpt.directory} holds no checkpoint{why}; "
            "run without --resume to start a new run"
        )
    rs: dict[str, Any] = {}
    if latest is not None:
        if kl and warm:
            start = _warm_start_params(t)  # the run's cached warm start
        t.state, rs = _restore_intact(t)
        t.controllers.load_state_dict(rs["controllers"])
        held = rs.get(HELD_POLICIES, {})
        t.services.sampler.load_held(held, rs[TREES][HELD_POLICIES] if held else {})
        t.producer.rng = key_from_json(rs["rng"])
        t.step = int(rs["step"])
        t.nonfinite_streak = int(rs.get("nonfinite_streak", 0))
        logging.info("resumed from step %d (%s)", t.step, t.ckpt.directory)
    elif warm:
        start = _warm_start_params(t)
        model = nnx.merge(t.graphdef, start, t.state.rest)
        t.graphdef, t.state = init_train_state(model, t.tcfg, t.mesh)
        t.weights.graphdef = t.graphdef
    # The step watermark: whatever was written after the restored step is replayed.
    t.metrics.truncate_after(t.step if latest is not None else -1)
    for log in t.controller_logs:
        log.truncate_after(t.step)
    if t.primary:
        run_files.rollback(t.controllers_dir, t.step)
        t.controllers.rollback(t.step)
        if latest is not None:
            _verify_controller_files(t, rs.get(CONTROLLER_FILES), rebuild_controller_files)
    # A copy, taken before any update: the train step donates the state's buffers.
    t.ref_params = None
    if kl:
        ref_dtype = jnp.dtype(t.config.loss.kl_ref_dtype)
        t.ref_params = jax.tree.map(lambda x: jnp.copy(x).astype(ref_dtype), start)
    t.weights.sync(t.state, t.step)


def _restore_intact(t: Any) -> tuple[Any, dict[str, Any]]:
    """The newest checkpoint that restores; a newer damaged one is named in a warning and set
    aside (``checkpoints_corrupt/``), so this run saves that step afresh."""

    def trees_like(rs: dict[str, Any]) -> Any:
        held = rs.get(HELD_POLICIES)  # each held policy has the train state's parameter tree
        return {HELD_POLICIES: {name: t.state.params for name in held}} if held else None

    step, state, rs, failed = t.ckpt.restore_intact(t.state, trees_like=trees_like)
    for e in failed:
        moved = t.ckpt.set_aside(e.step, primary=t.primary)
        logging.warning(
            "checkpoint step %d is unreadable (%s: %s); resuming from step %d instead, the "
            "damaged step moved to %s", e.step, e.path, e.reason, step, moved,
        )  # fmt: skip
    return state, rs


def _verify_controller_files(t: Any, saved: Mapping[str, Any] | None, rebuild: bool) -> None:
    """The controllers' files against the restored checkpoint's manifest (after the rollback):
    refused with ``ControllerFilesError`` naming each missing or short file or store, or with
    ``rebuild`` (``--rebuild_controller_files``) one warning each and the run goes on with what
    is there. A checkpoint written before manifests existed has none to check."""
    if saved is None:
        logging.info("checkpoint step %d has no controller-file manifest to check", t.step)
        return
    problems = run_files.verify(t.controllers_dir, saved, t.controllers.disk_records())
    if not problems:
        return
    listed = "\n".join(f"  {p}" for p in problems)
    if rebuild:
        for p in problems:
            logging.warning("--rebuild_controller_files: continuing without %s", p)
        return
    raise run_files.ControllerFilesError(
        f"--resume: the controllers' files do not match checkpoint step {t.step} "
        f"({t.ckpt.step_dir(t.step)}):\n{listed}\nrestore them from a copy of the "
        "run directory, or resume with --rebuild_controller_files to continue from what is "
        "there (the controllers then differ from an uninterrupted run's)"
    )


def _warm_start_params(t: Any) -> Any:
    return warmstart.run_or_load(
        t.config, t.workdir, t.domain, t.tokenizer, t.graphdef, t.state, t.mesh
    )
