"""Step callbacks: what ``Trainer.run`` calls after every step (``Trainer.add_callback``), and
``StepTimer``, the callback a benchmark of the training loop times whole steps with."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np


class StepCallback(Protocol):
    """An object with ``on_step_end(step, metrics, state)`` (a plain function of those three
    arguments is accepted as well); see ``Trainer.add_callback``."""

    def on_step_end(self, step: int, metrics: Mapping[str, Any], state: Any) -> None: ...


AnyStepCallback = StepCallback | Callable[[int, Mapping[str, Any], Any], Any]


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


def check_callback(callback: Any) -> AnyStepCallback:
    """``callback`` if it has ``on_step_end`` or is callable, else a ``TypeError`` naming it."""
    if not callable(getattr(callback, "on_step_end", None)) and not callable(callback):
        raise TypeError(
            f"Trainer.add_callback: {callback!r} has no on_step_end(step, metrics, state) "
            "and is not callable"
        )
    return callback


def call_step_end(
    callbacks: Sequence[AnyStepCallback], step: int, metrics: Mapping[str, Any], state: Any
) -> None:
    """Calls each callback in order with a copy of ``metrics``; the first that raises stops the
    run as a ``StepCallbackError`` naming it and the step."""
    for cb in callbacks:
        fn = getattr(cb, "on_step_end", None)
        fn = fn if callable(fn) else cb
        try:
            fn(step, dict(metrics), state)
        except Exception as e:
            raise StepCallbackError(callback_name(cb), step, e) from e


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
