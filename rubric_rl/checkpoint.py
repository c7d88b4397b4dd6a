"""Run checkpoints (DESIGN §2, §9): train state + every stateful Python object, in one orbax step.

One orbax step directory holds two items, and a third when the run has one:
- ``train_state``: the sharded ``TrainState`` (params, optimiser state, step), via
  ``rubric_rl.core.checkpointing`` (orbax StandardSave; restores onto any mesh);
- ``run_state``: a JSON document — controller ``state_dict()``s, data cursors, host RNG state,
  the trainer step, metadata — via orbax JsonSave;
- ``trees``: further array trees of the run (the sampler's held policies), saved as the train
  state is; restored when the caller says which structure to expect (``trees_like``).

Atomicity: orbax writes a step into a temporary directory and renames it into place only once
every item is finalised, so a process killed mid-write leaves at most a temporary directory that
``latest_step()`` ignores (and the next manager cleans up); the last complete step stays
restorable. ``keep`` bounds the number of complete steps kept.

A complete step can still be damaged afterwards (a full disk, a bad copy): ``restore`` raises
``CorruptCheckpointError`` naming the step, the file and the cause (the JSON files are parsed
here first, so a truncated one is named), ``restore_intact`` falls back to the newest step that
restores, and ``set_aside(step)`` moves a damaged step to ``<workdir>/checkpoints_corrupt/`` so the
resumed run saves that step afresh (nothing is deleted).

A save that fails (a full disk while writing, synchronously or in orbax's background writer) is
one ``CheckpointSaveError`` naming the step, the cause and the last complete step to resume
from; ``check()`` surfaces a background failure without waiting, so the trainer stops before
training past its last checkpoint, and the error is not raised anew by ``wait`` / ``close``.
What orbax's background threads print about the failure is held and dropped
(``_HeldSaveNoise``): the error is the one report.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from rubric_rl.core import checkpointing

RUN_STATE = "run_state"
# The item of further array trees, and the run-state key a restore returns them under.
TREES = "trees"
# The JSON files of a step that a restore reads (orbax's own error for a truncated one names none).
_JSON_FILES = (
    f"{RUN_STATE}/metadata",
    f"{checkpointing.ITEM}/_METADATA",
    f"{checkpointing.ITEM}/array_metadatas/*",
)
_LOCAL_FILE = re.compile(r'local file "([^"]+)"')


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step that cannot be restored: ``step``, ``path`` (the file, or the step's
    item directory when the cause names none) and ``reason``."""

    def __init__(self, step: int, path: str, reason: str):
        self.step, self.path, self.reason = step, path, reason
        super().__init__(f"checkpoint step {step} is unreadable: {path}: {reason}")


class CheckpointSaveError(RuntimeError):
    """A checkpoint step that could not be written (a full disk, a write error): the run stops
    at once with this one error, naming the step, the cause and the step to resume from."""

    def __init__(self, step: int | None, previous: int | None, cause: BaseException):
        self.step, self.previous = step, previous
        what = f"checkpoint step {step}" if step is not None else "a checkpoint"
        where = (
            f"resume from step {previous}, the last complete checkpoint, with --resume"
            if previous is not None
            else "no complete checkpoint exists yet: rerun without --resume"
        )
        super().__init__(
            f"{what} could not be saved ({type(cause).__name__}: {_first_line(cause)}); the run "
            f"stops here. Fix the cause (free disk space?), then {where}"
        )


class NoIntactCheckpointError(RuntimeError):
    """Every checkpoint step failed to restore; ``failed`` holds each step's error."""

    def __init__(self, directory: str, failed: list[CorruptCheckpointError]):
        self.failed = failed
        causes = "\n".join(f"  step {e.step}: {e.path}: {e.reason}" for e in failed)
        super().__init__(f"no intact checkpoint in {directory}:\n{causes}")


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return text if len(text) <= limit else text[:limit] + "..."


def publish_dir(tmp: str, dst: str) -> None:
    """Moves the finished directory ``tmp`` to ``dst`` in one rename, so ``dst`` appears complete
    or not at all. When another process or run got there first (the same, deterministic content)
    its copy is kept and ``tmp`` dropped; any other failure is raised."""
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    try:
        os.rename(tmp, dst)
    except OSError:
        if not os.path.isdir(dst):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def key_to_json(key: jax.Array) -> dict[str, Any]:
    """A JAX PRNG key (typed or raw uint32) as JSON-able data; inverse: ``key_from_json``."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    raw = jax.random.key_data(key) if typed else key
    return {"typed": bool(typed), "data": np.asarray(raw).astype(np.uint32).tolist()}


def key_from_json(d: dict[str, Any]) -> jax.Array:
    raw = jax.numpy.asarray(np.asarray(d["data"], dtype=np.uint32))
    return jax.random.wrap_key_data(raw) if d["typed"] else raw


def _check_jsonable(state: dict[str, Any]) -> None:
    try:
        json.dumps(state)
    except TypeError as e:
        raise TypeError(
            f"run state must be JSON-able (state_dict()s of plain Python data): {e}"
        ) from None


def _abstract(target: Any) -> Any:
    """``jax.ShapeDtypeStruct`` leaves with the target's shardings (abstract leaves kept)."""
    return jax.tree.map(
        lambda x: (
            x
            if isinstance(x, jax.ShapeDtypeStruct)
            else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
        ),
        target,
    )


def _corrupt(step_dir: str, step: int, item: str, e: BaseException) -> CorruptCheckpointError:
    """orbax / tensorstore's error as a ``CorruptCheckpointError``: the cause names the file
    when it knows it, else the item's directory is named."""
    text = _first_line(e, limit=10_000)
    files = list(_LOCAL_FILE.finditer(text))
    if files:  # tensorstore chains its contexts: the cause follows the last file named
        path, cause = files[-1].group(1), text[files[-1].end() :].lstrip(": ")
        cause = cause.split(" [tensorstore_spec")[0]
    else:
        path, cause = os.path.join(step_dir, item), text
    return CorruptCheckpointError(step, path, cause[:300] or text[:300])


class _HeldSaveNoise:
    """What orbax's background threads print about a failed save, held until the save's outcome
    is known. One failed write is reported by every thread it passes through (ERROR records with
    the same traceback from orbax's futures, its async checkpointer and its manager), as
    unraisable ``RuntimeError: Event loop is closed`` from tensorstore's callbacks when other
    writes finish after orbax's event loop has closed, and as asyncio's "Task (or Future)
    exception was never retrieved" for each such write when the garbage collector frees it: a
    full disk printed dozens of tracebacks. While a save is in flight these are held; when it
    completes they are passed on unchanged (nothing is hidden from a save that succeeds); when it
    fails they are dropped, and so is what its threads and writes report later in this process
    (orbax's threads log after the error is raised; asyncio's and the closed loop's echoes),
    since the save's ``CheckpointSaveError`` (its cause chained) is the one report and the run
    stops on it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0  # saves started and not yet resolved, over every RunCheckpointer
        self.failed = False  # a save has failed in this process: its echoes are dropped
        self.held: list[tuple[str, Any]] = []
        self.previous_hook: Any = None

    @staticmethod
    def _from_orbax(record: logging.LogRecord) -> bool:
        """Logged by orbax's code, or about one of its writes: asyncio's "Future exception was
        never retrieved" for a tensorstore write has no orbax frame, only the write's path in
        orbax's temporary checkpoint directory (``<step>.orbax-checkpoint-tmp``)."""
        marker, message = f"{os.sep}orbax{os.sep}", record.getMessage()
        if marker in record.pathname or marker in message or ".orbax-checkpoint-tmp" in message:
            return True
        tb = record.exc_info[2] if record.exc_info else None
        while tb is not None:
            if marker in tb.tb_frame.f_code.co_filename:
                return True
            tb = tb.tb_next
        return False

    def filter(self, record: logging.LogRecord) -> bool:
        """The ``logging.Filter`` protocol, on the ``absl`` (orbax's) and ``asyncio`` loggers."""
        if record.levelno < logging.ERROR or not self._from_orbax(record):
            return True
        with self.lock:
            if self.in_flight:
                self.held.append(("log", record))
                return False
            if self.failed:  # a failed save's late reports: its threads outlive its error,
                return False  # and asyncio reports its writes' tasks when they are freed
        return True

    def unraisable(self, args: Any) -> None:
        closed_loop = isinstance(args.exc_value, RuntimeError) and (
            str(args.exc_value) == "Event loop is closed"
        )
        with self.lock:
            if closed_loop and self.failed:
                return
            if closed_loop and self.in_flight:
                self.held.append(("unraisable", args))
                return
        self.previous_hook(args)

    def begin(self) -> None:
        with self.lock:
            self.in_flight += 1
            # Installed by an earlier begin (a failed save leaves it installed), unless the
            # process's hook was replaced since (a test's, a library's): then again, over it.
            if sys.unraisablehook != self.unraisable:
                self.previous_hook = sys.unraisablehook
                sys.unraisablehook = self.unraisable
            for name in ("absl", "asyncio"):
                logging.getLogger(name).addFilter(self)  # a filter it holds is not added again

    def end(self, failed: bool) -> None:
        with self.lock:
            self.in_flight -= 1
            self.failed = self.failed or failed
            if self.failed:
                self.held = []  # and the filter stays, for the failed save's later echoes
                return
            if self.in_flight:
                return
            held, self.held = self.held, []
            for name in ("absl", "asyncio"):
                logging.getLogger(name).removeFilter(self)
            previous = self.previous_hook
            if sys.unraisablehook == self.unraisable:
                sys.unraisablehook = previous
        for kind, item in held:  # a save that completed: what its threads said, as they said it
            if kind == "log":
                logging.getLogger(item.name).handle(item)
            else:
                previous(item)


_SAVE_NOISE = _HeldSaveNoise()


class RunCheckpointer:
    """``save(step, train_state, run_state)`` / ``restore(target)`` over ``<workdir>/checkpoints``.

    ``run_state`` is a JSON-able dict (e.g. ``{"controllers": {...}, "rng": key_to_json(k)}``).
    Saves are asynchronous unless ``async_save=False``; ``wait()`` blocks until finalised.
    """

    def __init__(self, directory: str, *, keep: int | None = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.manager = checkpointing.make_checkpoint_manager(
            self.directory, max_to_keep=keep, async_save=async_save
        )
        self._saving: int | None = None  # the step of the last save started
        self._failed: CheckpointSaveError | None = None  # raised once; close() does not again
        self._noise_held = False  # whether _SAVE_NOISE holds for this checkpointer's save

    def _resolved(self, failed: bool) -> None:
        """The save in flight has completed or failed: its held background reports are passed
        on or dropped (``_HeldSaveNoise``)."""
        if self._noise_held:
            self._noise_held = False
            _SAVE_NOISE.end(failed)

    def _save_error(self, cause: BaseException) -> CheckpointSaveError:
        done = sorted(
            int(n)
            for n in os.listdir(self.directory)
            if n.isdigit() and os.path.isdir(os.path.join(self.directory, n))
        )
        previous = max((s for s in done if s != self._saving), default=None)
        self._failed = CheckpointSaveError(self._saving, previous, cause)
        self._resolved(failed=True)
        return self._failed

    def _finish_saves(self) -> None:
        """Waits for the save in flight; its failure is a ``CheckpointSaveError``."""
        if self._failed is not None:
            raise self._failed
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # orbax re-raises the background writer's error here
            raise self._save_error(e) from e
        self._resolved(failed=False)

    @property
    def failed(self) -> bool:
        """Whether a save has failed (its ``CheckpointSaveError`` already raised)."""
        return self._failed is not None

    def check(self) -> None:
        """Raises ``CheckpointSaveError`` when an asynchronous save has failed (without waiting
        for one in flight): the trainer calls it before each step and before recording one, so
        a failed save stops the run before it trains on, or records a step, past its last
        checkpoint."""
        if self._failed is not None:
            raise self._failed
        try:
            self.manager.check_for_errors()
        except Exception as e:
            raise self._save_error(e) from e

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(int(step)))

    def check_json(self, step: int) -> None:
        """Parses the step's JSON files; raises ``CorruptCheckpointError`` naming a bad one."""
        for pattern in _JSON_FILES:
            for path in sorted(glob.glob(os.path.join(self.step_dir(step), pattern))):
                try:
                    with open(path, encoding="utf-8") as f:
                        json.load(f)
                except (ValueError, OSError) as e:  # JSONDecodeError, UnicodeDecodeError
                    raise CorruptCheckpointError(step, path, f"not valid JSON ({e})") from None

    def latest_step(self) -> int | None:
        """The newest COMPLETE step (temporary / interrupted writes are never listed)."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(
        self,
        step: int,
        train_state: Any,
        run_state: dict[str, Any],
        *,
        trees: Any = None,
        wait: bool = False,
    ) -> bool:
        """Saves the items as step ``step`` (``trees``: the ``trees`` item, none when None or
        empty); a step that already exists is left untouched (returns False) — on resume the
        first save may hit the restored step."""
        _check_jsonable(run_state)
        if TREES in run_state:
            raise ValueError(f"run_state: the key {TREES!r} is reserved for the trees item")
        self._finish_saves()
        if step in self.manager.all_steps():
            return False
        self._saving = int(step)
        _SAVE_NOISE.begin()
        self._noise_held = True
        try:
            saved = checkpointing.save_train_state(
                self.manager,
                step,
                train_state,
                extra={
                    RUN_STATE: ocp.args.JsonSave(run_state),
                    **({TREES: ocp.args.StandardSave(trees)} if trees else {}),
                },
                wait=wait,
            )
        except Exception as e:  # a write error of this step (synchronous part or wait=True)
            raise self._save_error(e) from e
        if wait:
            self._resolved(failed=False)
        return bool(saved)

    def restore(
        self,
        train_state_target: Any,
        step: int | None = None,
        *,
        trees_like: Callable[[dict[str, Any]], Any] | None = None,
    ) -> tuple[Any, dict]:
        """(train_state, run_state) of ``step`` (default latest). ``train_state_target`` is an
        abstract tree with shardings (``core.checkpointing.abstract_train_state``) or a concrete
        state of the right structure. ``trees_like(run_state)``: the ``trees`` item's target
        (as ``train_state_target``), or None when the step has none; the restored tree is then
        the run state's ``TREES`` entry."""
        self.manager.wait_until_finished()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        self.check_json(step)
        items = {
            checkpointing.ITEM: ocp.args.StandardRestore(_abstract(train_state_target)),
            RUN_STATE: ocp.args.JsonRestore(),
        }
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:
            raise _corrupt(self.step_dir(step), step, checkpointing.ITEM, e) from e
        run_state = dict(restored[RUN_STATE])
        trees = None if trees_like is None else trees_like(run_state)
        if trees is not None:
            args = ocp.args.Composite(**{TREES: ocp.args.StandardRestore(_abstract(trees))})
            try:
                run_state[TREES] = self.manager.restore(step, args=args)[TREES]
            except Exception as e:
                raise _corrupt(self.step_dir(step), step, TREES, e) from e
        return restored[checkpointing.ITEM], run_state

    def restore_intact(
        self,
        train_state_target: Any,
        *,
        trees_like: Callable[[dict[str, Any]], Any] | None = None,
    ) -> tuple[int, Any, dict, list[CorruptCheckpointError]]:
        """(step, train_state, run_state, the newer steps that failed) of the newest step that
        restores (``trees_like``: as ``restore``'s). Raises ``NoIntactCheckpointError`` (each
        step's file and cause) when none does, ``FileNotFoundError`` when there is no step."""
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        failed: list[CorruptCheckpointError] = []
        for step in steps:
            try:
                train_state, run_state = self.restore(
                    train_state_target, step, trees_like=trees_like
                )
            except CorruptCheckpointError as e:
                failed.append(e)
                continue
            return step, train_state, run_state, failed
        raise NoIntactCheckpointError(self.directory, failed)

    def set_aside(self, step: int, *, primary: bool = True) -> str:
        """Moves step ``step`` out of the manager's sight to ``<directory>_corrupt/<step>[-n]``
        (kept for inspection); returns the new path. Multi-host: every process calls it, the
        primary moves the directory, and every manager forgets the step once it has."""
        self.manager.wait_until_finished()
        root = self.directory + "_corrupt"
        dst, n = os.path.join(root, str(int(step))), 1
        while primary and os.path.exists(dst):
            n += 1
            dst = os.path.join(root, f"{int(step)}-{n}")
        if primary:
            os.makedirs(root, exist_ok=True)
            os.rename(self.step_dir(step), dst)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"rubric_rl set_aside {int(step)}")
        self.manager.reload()
        return dst

    def wait(self) -> None:
        self._finish_saves()

    def close(self) -> None:
        """Waits for the save in flight and closes; a save failure already raised is not
        raised again (the run has stopped on it), a new one is."""
        try:
            if self._failed is None:
                self._finish_saves()
        finally:
            try:
                self.manager.close()
            except Exception:  # noqa: BLE001 - the failed save was reported; closing is best effort
                if self._failed is None:
                    raise
            finally:
                self._resolved(failed=self._failed is not None)
