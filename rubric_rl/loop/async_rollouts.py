"""Asynchronous rollouts with a staleness bound (``rollout.max_staleness = k``; 0 = synchronous).

With k > 0 the pipelines of the next steps (sample → generate → judge → reward → advantage →
… , everything before the update) run on a background thread while the current update runs; the
trainer then trains step s on rollouts sampled by an older policy. Which one is fixed in advance,
not by timing, so a run is reproducible and resumes exactly:

    w(s) = max(s − 1 − k, c(s))

where w(s) is the weight version (the number of updates applied) that samples step s's rollouts,
s − 1 the version step s's update starts from, and c(s) the last **sync point** before step s:
step 0, and every step after which the engine must be idle and the controllers quiescent — an
evaluation, a checkpoint, the run's last step. A pipeline never runs across a sync point, so a
checkpoint holds exactly the controllers' state after its step's pipeline, and a resumed run
replays the same schedule; step c + 1 is always generated synchronously with the newest weights.
The staleness s − 1 − w(s) is therefore at most k, and 0 right after a sync point.

How the gap is handled in the loss is the rollout-correction preset's business, as for any
mismatch between the sampling policy and π_old (``loss.rollout_correction``): ``bypass`` takes
the sampling policy's log-probs as π_old (PPO's ratio against the behaviour policy), the
decoupled presets recompute π_old with the step-start policy and importance-weight the gap
(AReaL's decoupled objective). The engine receives a **copy** of the weights each pipeline
samples with (the update donates the live state's buffers): up to k + 1 parameter sets are held.

``rollout.async_overlap = False`` runs the same schedule on the calling thread (no overlap, the
same numbers): the reference the overlapped run is tested against, and a debugging aid.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any

from rubric_rl.loop import evaluation
from rubric_rl.runs import run_dir


def is_sync_point(config: Any, step: int) -> bool:
    """After ``step`` the engine must be idle and the controllers quiescent: an evaluation, a
    checkpoint or the run's last step follows."""
    total = int(config.train.steps)
    if step >= total:
        return True
    return bool(evaluation.due_splits(config, step, final=False)) or run_dir.checkpoint_due(
        config.checkpoint, step, total
    )


def next_sync_point(config: Any, step: int) -> int:
    """The first sync point >= ``step``."""
    while not is_sync_point(config, step):
        step += 1
    return step


def weight_version(step: int, max_staleness: int, last_sync: int) -> int:
    """w(s) = max(s − 1 − k, c): the weight version that samples step ``step``'s rollouts."""
    if step < 1 or max_staleness < 0 or not 0 <= last_sync < step:
        raise ValueError(
            f"weight_version: need step >= 1, max_staleness >= 0 and 0 <= last_sync < step; got "
            f"step={step}, max_staleness={max_staleness}, last_sync={last_sync}"
        )
    return max(step - 1 - max_staleness, last_sync)


def prefetch_steps(step: int, max_staleness: int, next_sync: int, submitted: int) -> range:
    """The pipelines to start at the beginning of step ``step`` (whose update starts from
    version ``step − 1``): every step s in (``submitted``, min(step + k, ``next_sync``)], where
    ``next_sync`` is the first sync point >= ``step`` and ``submitted`` the last step whose
    pipeline is started or done. Each of them samples with version ``step − 1``, which is w(s):
    s = step + k is the newest one k allows, and the earlier ones are only ever pending right
    after a sync point c = step − 1 (then w(s) = c for every s up to c + 1 + k)."""
    return range(max(submitted, step) + 1, min(step + max_staleness, next_sync) + 1)


@dataclasses.dataclass(frozen=True)
class Weights:
    """A copy of the policy's parameters at ``version`` (what ``TrainState`` holds: ``params``
    and ``rest``), given to the engine for one pipeline."""

    params: Any
    rest: Any
    version: int


class Prefetcher:
    """Runs step pipelines ahead of the update, one at a time and in step order.

    ``overlap=True``: on one background thread (the engine and the controllers are used by one
    pipeline at a time, never by the trainer's thread meanwhile); ``False``: when a step asks
    for its rollouts, on the calling thread, with the weights recorded at submission."""

    def __init__(self, produce: Callable[[int, Weights], Any], overlap: bool):
        self._produce = produce
        self._overlap = overlap
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollouts")
            if overlap
            else None
        )
        self._pending: dict[int, Any] = {}  # step -> Future (overlap) or Weights (inline)
        self.submitted = 0  # the last step whose pipeline was submitted

    def submit(self, step: int, weights: Weights) -> None:
        if step in self._pending:
            raise RuntimeError(f"Prefetcher: step {step}'s pipeline was already submitted")
        if self._pool is not None:
            self._pending[step] = self._pool.submit(self._produce, step, weights)
        else:
            self._pending[step] = weights
        self.submitted = max(self.submitted, step)

    def has(self, step: int) -> bool:
        return step in self._pending

    def pending(self) -> bool:
        """Whether any submitted pipeline has not been taken yet."""
        return bool(self._pending)

    def wait(self) -> None:
        """Waits until no submitted pipeline is running (results are kept for ``take``; an
        error stays with its step)."""
        if self._pool is not None:
            concurrent.futures.wait(list(self._pending.values()))

    def take(self, step: int) -> Any:
        """Step ``step``'s pipeline result (waits for it; re-raises its error)."""
        item = self._pending.pop(step)
        if self._pool is not None:
            return item.result()
        return self._produce(step, item)

    def drain(self) -> None:
        """Waits for every started pipeline and drops their results (a stopped run: they are
        regenerated on resume, which restores the controllers from before them)."""
        for step in sorted(self._pending):
            item = self._pending.pop(step)
            if self._pool is not None and not item.cancel():
                try:
                    item.result()
                except BaseException:  # noqa: BLE001 - the run is stopping for another reason
                    pass

    def close(self) -> None:
        self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
