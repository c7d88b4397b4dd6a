"""Plain Python reward functions as a reward source, TRL's signature:

    def my_reward(prompts: list[str], completions: list[str], **fields) -> Sequence[float | None]

Called batched, once per step over every trajectory that needs it (``prompts``: each task's
question text, ``Task.question``; ``completions``: the decoded responses; ``fields``: every other
column of the task's source row, ``Task.raw`` minus its prompt and id columns, as a list aligned
with the completions (None where a row lacks the column), plus ``task_id``). Functions should
take ``**kwargs``. Each function's values are the reward signal named by its name
(``Trajectory.signals[name]``, logged as ``reward/<name>/mean``); ``loss.reward`` or
``loss.reward_weights`` put it into the trained mix (``rubric_rl/step.py``).

Failures are kept apart from rewards, as judge failures are (``Verdict(met=None)``):

- ``None`` (or NaN) in the result: not applicable, the value is NaN (undefined, never trained
  as a number).
- An exception inside the function: that call's values are all NaN (its trajectories are not
  trained, nothing becomes 0), counted (``reward_fn/<name>/failed``: the share of the step's
  trajectories whose call raised), logged once per call with the exception, and kept with each
  trajectory (``Trajectory.info["reward_fn_errors"]``, written to the rollouts files).
- A result that cannot be a reward (another length than the completions, a value that is not a
  number, ±inf) is a programming error: ``RewardFnError`` naming the function, where it was
  called and what it returned. Ours: ±inf is an error, not "undefined": an infinite reward makes
  every advantage of its group infinite or NaN, and "not applicable" is ``None``.

Functions come from ``Trainer(reward_fns=...)`` (a dict name -> callable, or a list of callables
named by their ``__name__``) or from ``config.reward_fns`` (name -> "package.module:function",
imported when the Trainer is built); callables given to the Trainer are recorded in the config as
their "module:qualname".
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from rubric_rl.rubrics.types import Task

RewardFn = Callable[..., Sequence[float | None]]

# The names a function may not take: the built-in signals (step.RUBRIC_SIGNAL, VERIFIER_SIGNAL;
# not imported: step imports this module).
BUILTIN_SIGNALS = ("rubric", "task_verifier")
# A signal name is a metric key component (reward/<name>/mean, reward_fn/<name>/failed).
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
# Source-row columns that are not given as fields: the ones the loaders make the prompt or the id
# from (plain / rubrichub "prompt" or "messages", rar "question", openrubrics "instruction",
# "id" / healthbench "prompt_id"), and the two argument names a function takes positionally.
PROMPT_ID_COLUMNS = frozenset(
    {"prompt", "messages", "question", "instruction", "id", "prompt_id", "prompts", "completions"}
)
TASK_ID_FIELD = "task_id"
# Trajectory.info key: {function name: its exception} for each call that raised on it.
REWARD_FN_ERRORS = "reward_fn_errors"


class RewardFnError(ValueError):
    """A reward function returned something that is not one reward per completion."""


# ------------------------------------------------------------------------------ naming, import


def reward_fn_path(fn: Callable) -> str:
    """``"module:qualname"`` of a callable (of its class for a callable object): how a function
    given to the Trainer is recorded in ``config.reward_fns``."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}:{target.__qualname__}"


def check_name(name: Any, what: str) -> str:
    """A reward function's signal name: a metric-key word, not a built-in signal's."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{what}: a reward function's name must match {NAME_PATTERN.pattern} (it names its "
            f"signal and metrics), got {name!r}"
        )
    if name in BUILTIN_SIGNALS:
        raise ValueError(
            f"{what}: {name!r} is a built-in signal ({', '.join(BUILTIN_SIGNALS)}); name the "
            "reward function otherwise"
        )
    return name


def as_reward_fns(reward_fns: Mapping[str, RewardFn] | Sequence[RewardFn] | None) -> dict:
    """``Trainer(reward_fns=...)``: a dict name -> callable, or a list of callables named by
    their ``__name__`` (two of one name, or a lambda, is an error: give a dict)."""
    if not reward_fns:
        return {}
    if isinstance(reward_fns, Mapping):
        items = list(reward_fns.items())
    else:
        items = []
        for i, fn in enumerate(reward_fns):
            name = getattr(fn, "__name__", None)
            if name is None or name == "<lambda>":
                raise ValueError(
                    f"Trainer(reward_fns=[...]): item {i} ({fn!r}) has no usable __name__; "
                    "give a dict {name: fn}"
                )
            items.append((name, fn))
    out: dict[str, RewardFn] = {}
    for name, fn in items:
        check_name(name, f"Trainer(reward_fns=...)[{name!r}]")
        if name in out:
            raise ValueError(f"Trainer(reward_fns=...): two reward functions named {name!r}")
        if not callable(fn):
            raise TypeError(f"Trainer(reward_fns=...)[{name!r}]: {fn!r} is not callable")
        out[name] = fn
    return out


def import_reward_fn(path: Any, key: str) -> RewardFn:
    """The callable an import path ``"package.module:function"`` (``function`` may be dotted:
    ``Class.method``) names; errors name ``key`` (``config.reward_fns.<name>``)."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ValueError(f"{key}: expected 'package.module:function', got {path!r}")
    module_name, attr = path.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the config's, named
        raise ValueError(
            f"{key}: cannot import module {module_name!r} of {path!r}: {type(e).__name__}: {e}"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}: {path!r}: {obj!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{key}: {path!r} is not callable ({type(obj).__name__})")
    return obj


def resolve_reward_fns(config: Any, given: Mapping[str, RewardFn] | Sequence[RewardFn] | None):
    """The run's reward functions, name -> callable: ``config.reward_fns`` imported, and the
    callables ``given`` (``Trainer(reward_fns=...)``), each recorded in ``config.reward_fns`` as
    its ``"module:qualname"`` (the config is changed in place, unlocked for it). A name both in
    the config and given must be the same function."""
    given = as_reward_fns(given)
    section = config.get("reward_fns") or {}
    out: dict[str, RewardFn] = {}
    for name, path in dict(section).items():
        key = f"config.reward_fns.{name}"
        check_name(name, key)
        if name in given:
            if reward_fn_path(given[name]) != path:
                raise ValueError(
                    f"{key}: {path!r} in the config, but Trainer(reward_fns=...) gives "
                    f"{reward_fn_path(given[name])!r} under that name"
                )
            continue
        out[name] = import_reward_fn(path, key)
    if given:
        with config.unlocked():
            if config.get("reward_fns") is None:
                config.reward_fns = {}
            for name, fn in given.items():
                config.reward_fns[name] = reward_fn_path(fn)
                out[name] = fn
    return out


def check_rubric_trainable(config: Any, train: Sequence[Task], fns: Mapping[str, Any]) -> None:
    """A trained ``rubric`` (``loss.reward`` a rubric reward, or ``loss.reward_weights.rubric``)
    needs training tasks with criteria: an error naming the field when none has any (tasks in
    Python, the ``plain`` format). Not checked for methods whose controllers set their own mix."""
    from rubric_rl.rubrics.rewards import REWARDS

    if str(config.get("method", "grpo")) != "grpo" or any(len(t.rubric.evaluated()) for t in train):
        return
    lo = config.loss
    mix = dict(lo.get("reward_weights") or {})
    if ("rubric" in mix) if mix else (lo.reward in REWARDS.names()):
        field = "loss.reward_weights.rubric" if mix else "loss.reward"
        raise ValueError(
            f"config.{field}: trains the rubric, but no training task has criteria; train a "
            f"reward function ({sorted(fns) or 'none given'}) through loss.reward or "
            "loss.reward_weights"
        )


def check_mix_owner(config: Any, signal_weights: Mapping[str, float] | None) -> None:
    """``loss.reward_weights`` is not for controllers that set the mix themselves
    (``signal_weights``: the controllers' own mix, empty when they set none)."""
    mix = dict(config.loss.get("reward_weights") or {})
    if mix and signal_weights:
        raise ValueError(
            f"config.loss.reward_weights: {mix} given, but controllers set the trained mix "
            f"themselves (signal_weights {signal_weights}); leave loss.reward_weights empty"
        )


def record_in_run_dir(workdir: str, config: Any, resume: bool) -> str:
    """``config.reward_fns`` (the functions given to the Trainer, by "module:qualname") in
    ``<workdir>/config.json``: the launcher's record updated, or the config recorded when there
    is none. On ``resume``, a name the record gives another function is an error naming both
    (the record is left as it was). Returns the path."""
    from rubric_rl.runs import run_dir

    path = os.path.join(workdir, run_dir.CONFIG)
    record = run_dir.config_record(config)
    ours = record.get("reward_fns") or {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        before = old.get("reward_fns") or {}
        changed = [f"reward_fns.{k}: {before[k]!r} -> {v!r}" for k, v in ours.items()
                   if k in before and before[k] != v]  # fmt: skip
        if resume and changed:
            raise ValueError(
                f"--resume: the reward functions differ from the run's record {path}: "
                + "; ".join(changed)
            )
        record = {**old, "reward_fns": {**before, **ours}}
    run_dir.record_config(workdir, record)
    return path


# ------------------------------------------------------------------------------ calling


def fields_of(tasks: Sequence[Task]) -> dict[str, list[Any]]:
    """The ``**fields`` of one call: per source-row column (``PROMPT_ID_COLUMNS`` left out) a
    list aligned with ``tasks`` (None where a task's row lacks it), then ``task_id``. Ours: a
    row column named ``task_id`` is replaced by the task's id."""
    keys: dict[str, None] = {}
    for t in tasks:
        for k in t.raw or {}:
            if k not in PROMPT_ID_COLUMNS and k != TASK_ID_FIELD:
                keys.setdefault(str(k), None)
    out = {k: [(t.raw or {}).get(k) for t in tasks] for k in keys}
    out[TASK_ID_FIELD] = [t.id for t in tasks]
    return out


def _short(value: Any, n: int = 120) -> str:
    s = repr(value)
    return s if len(s) <= n else s[: n - 3] + "..."


def _bad(name: str, fn: RewardFn, where: str, msg: str) -> RewardFnError:
    return RewardFnError(f"reward function {name!r} ({reward_fn_path(fn)}) {where}: {msg}")


def check_values(name: str, fn: RewardFn, out: Any, n: int, where: str) -> np.ndarray:
    """``out`` as ``[n]`` float64 (None -> NaN), or ``RewardFnError`` naming the function,
    ``where`` and what it returned."""
    if out is None or isinstance(out, str | bytes | Mapping) or not hasattr(out, "__iter__"):
        raise _bad(name, fn, where, f"returned {_short(out)}; expected a sequence of {n} floats "
                                    "(None: not applicable)")  # fmt: skip
    values = list(out)
    if len(values) != n:
        raise _bad(name, fn, where, f"returned {len(values)} values for {n} completions: "
                                    f"{_short(values)}")  # fmt: skip
    x = np.empty(n, np.float64)
    for i, v in enumerate(values):
        if v is None:
            x[i] = math.nan
            continue
        try:
            if isinstance(v, str | bytes):
                raise TypeError
            x[i] = float(v)
        except (TypeError, ValueError):
            raise _bad(name, fn, where, f"value {i} is {type(v).__name__} {_short(v)}, not a "
                                        "number or None") from None  # fmt: skip
        if math.isinf(x[i]):
            raise _bad(name, fn, where, f"value {i} is {x[i]}; a reward must be finite (None "
                                        "or NaN: not applicable)")  # fmt: skip
    return x


def call_reward_fn(
    name: str,
    fn: RewardFn,
    tasks: Sequence[Task],
    completions: Sequence[str],
    where: str,
) -> tuple[np.ndarray, str | None]:
    """One batched call: ``([n] float64 values, None)``, or ``([n] NaN, error text)`` when the
    function raised (logged here with the exception's type, message and innermost frame)."""
    n = len(completions)
    prompts = [t.question for t in tasks]
    try:
        out = fn(prompts, list(completions), **fields_of(tasks))
    except SystemExit as e:
        # sys.exit() in user code would end the run with the exit's status — 0 reads as a
        # finished run (a sweep marks it done): an error naming the function instead.
        raise RewardFnError(
            f"reward function {name!r} ({reward_fn_path(fn)}) {where} called sys.exit"
            f"({e.code!r}); a reward function returns rewards, it does not end the run"
        ) from e
    except Exception as e:  # noqa: BLE001 - a user function's failure is recorded, not trained
        frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        at = f" at {frame.filename}:{frame.lineno}" if frame else ""
        error = f"{type(e).__name__}: {e}"
        logging.warning(
            "reward function %r %s raised on %d completions%s (their values are NaN, not "
            "trained): %s", name, where, n, at, error,
        )  # fmt: skip
        return np.full(n, math.nan), error
    return check_values(name, fn, out, n, where), None


__all__ = [
    "BUILTIN_SIGNALS",
    "PROMPT_ID_COLUMNS",
    "REWARD_FN_ERRORS",
    "RewardFn",
    "RewardFnError",
    "as_reward_fns",
    "call_reward_fn",
    "check_name",
    "check_rubric_trainable",
    "check_values",
    "fields_of",
    "import_reward_fn",
    "record_in_run_dir",
    "reward_fn_path",
    "resolve_reward_fns",
]
