"""Evaluation sets, their cadence, and their metrics per environment (DESIGN.md §7).

HarnessRL §3's protocol (greedy, no guidance, seed rubrics, the frozen judge) runs on the
domain's evaluation sets ``EVAL_SPLITS``. This module is the bookkeeping around it, pure Python
and numpy, so the trainer and the analysis read one definition:

- ``due_splits(config, step, final)``: which sets are evaluated at ``step``.
  ``config.eval.splits.<split>`` is that set's period in steps: -1 = ``eval.every``, 0 = never.
  A set with a positive period is evaluated at step 0 when ``eval.at_start``, at every multiple of
  its period, and at the final step; with the defaults (every split -1) this is exactly the old
  schedule: step 0 if ``at_start and every > 0``, every ``every`` steps, and the last step.
- ``split_metrics(...)``: the numbers logged for one set, from its per-task results:
  ``eval/<split>/score`` (Λ·mean reward, Λ = ``POINTS_SCALE``, NaN rewards left out),
  ``/pass_rate`` (task verifier), ``/oracle`` (hidden quality), ``/criteria/<id>``, and per
  environment (``Task.env_name``; None counts as ``DEFAULT_ENV``) ``/env/<env>/{score,pass_rate}``
  with their unweighted mean over environments ``/env_mean/{score,pass_rate}``: a large
  environment cannot hide a weak small one (RISED's multi-environment view). A set whose tasks
  have no criteria (the ``plain`` format) has no ``score`` keys.
- ``reward_fn_metrics(...)``: each reward function's mean over the set's responses,
  ``eval/<split>/reward_fn/<name>`` (None / NaN values left out), and ``.../failed`` (the share
  of responses whose call raised).
- ``evaluate(services, domain, config, splits)``: runs the protocol on the first ``eval.n``
  tasks of each set through the step's ``Services`` (generate, judge) and the domain's
  analysis-only verifier and oracle, and returns ``split_metrics`` of each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.loop.step_metrics import criterion_pass_rates
from rubric_rl.rollout.engine import SamplingParams
from rubric_rl.rubrics.reward_fns import call_reward_fn
from rubric_rl.rubrics.rewards import POINTS_SCALE, REWARDS, batch_rewards
from rubric_rl.rubrics.scores import pack_verdicts
from rubric_rl.rubrics.types import Task

# The test set first; "validation" exists where the domain has one (config.domain.n_validation):
# any choice (checkpoint, hyperparameter) is made there, never on the held-out set.
EVAL_SPLITS = ("heldout", "validation", "ood")
DEFAULT_ENV = "default"  # the environment of a task whose env_name is None

__all__ = [
    "DEFAULT_ENV",
    "EVAL_SPLITS",
    "due_splits",
    "env_of",
    "evaluate",
    "reward_fn_metrics",
    "split_every",
    "split_metrics",
]


def split_every(config: Any, split: str) -> int:
    """The evaluation period of ``split`` in steps (0 = never): ``eval.splits.<split>``, with
    -1 (or a split not listed) meaning ``eval.every``."""
    every = int(config.eval.every)
    splits = config.eval.get("splits") or {}
    n = int(splits[split]) if split in splits else -1
    if n < -1:
        raise ValueError(f"config.eval.splits.{split}: must be >= -1, got {n}")
    return every if n == -1 else n


def due_splits(config: Any, step: int, final: bool) -> list[str]:
    """The evaluation sets due at ``step`` (in ``EVAL_SPLITS`` order).

    Step 0 is the evaluation before training (``eval.at_start``); a training step is due when it
    is a multiple of the set's period or ``final`` (the run's last step). A period of 0 is never
    due, not even at the start or the end.
    """
    out = []
    for split in EVAL_SPLITS:
        every = split_every(config, split)
        if every <= 0:
            continue
        if step == 0:
            due = bool(config.eval.at_start)
        else:
            due = step % every == 0 or bool(final)
        if due:
            out.append(split)
    return out


def env_of(task: Task) -> str:
    """The environment a task's results are reported under."""
    return task.env_name if task.env_name is not None else DEFAULT_ENV


def _mean_defined(values: Sequence[float | bool | None]) -> float:
    """Mean over the defined values (None / NaN = undefined); NaN when none is defined."""
    x = np.array([math.nan if v is None else float(v) for v in values], np.float64)
    x = x[~np.isnan(x)]
    return float(np.mean(x)) if x.size else math.nan


def _score(rewards: np.ndarray) -> float:
    # Λ·mean over the defined rewards (a failed judgement is NaN: left out, never a 0).
    return float(POINTS_SCALE * np.nanmean(rewards)) if np.any(~np.isnan(rewards)) else math.nan


def judge_failure_metrics(split: str, verdicts: Sequence[Sequence[Sequence[Any]]]) -> dict:
    """``eval/<split>/judge/failed``: the share of the set's verdicts that failed (a checker that
    raised, a judge call that failed), and ``eval/<split>/judge/failed/<criterion>`` for each
    criterion with a failed verdict. A failed verdict leaves the score (never counted as unmet),
    so without these a criterion that always raises would drop out of it unseen."""
    flat = [v for group in verdicts for row in group for v in row]
    if not flat:
        return {}
    out = {f"eval/{split}/judge/failed": sum(v.met is None for v in flat) / len(flat)}
    by_criterion: dict[str, list[bool]] = {}
    for v in flat:
        by_criterion.setdefault(v.criterion_id, []).append(v.met is None)
    for cid, failed in sorted(by_criterion.items()):
        if any(failed):
            out[f"eval/{split}/judge/failed/{cid}"] = sum(failed) / len(failed)
    return out


def split_metrics(
    split: str,
    tasks: Sequence[Task],
    responses: Sequence[str],
    rewards: np.ndarray | None,
    passed: Sequence[bool | None] | None,
    oracle: Sequence[float | None] | None,
    criterion_rates: Mapping[str, float],
) -> dict[str, float]:
    """The metrics of one evaluation set, one response per task.

    ``rewards`` [N]: each response's reward on the [0, 1] scale, NaN where undefined; None when
    no task of the set has criteria (no ``score`` keys then).
    ``passed`` [N]: the task verifier's verdict (None = it failed), or None when the domain has
    no verifier (then no ``pass_rate`` keys). ``oracle`` [N]: the hidden quality in [0, 1]
    (None = undefined), or None when the domain has none (no ``oracle`` key).
    ``criterion_rates``: per criterion id, its met rate over the set's valid verdicts.
    Undefined entries are left out of every mean; a mean over nothing is NaN.
    """
    n = len(tasks)
    scored = rewards is not None
    rewards = np.asarray(rewards if scored else np.full(n, np.nan), np.float64).reshape(-1)
    for name, seq in (("responses", responses), ("rewards", rewards), ("passed", passed)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"split_metrics({split!r}): {len(seq)} {name} for {n} tasks")
    if oracle is not None and len(oracle) != n:
        raise ValueError(f"split_metrics({split!r}): {len(oracle)} oracle values for {n} tasks")

    p = f"eval/{split}"
    out: dict[str, float] = {f"{p}/criteria/{cid}": float(r) for cid, r in criterion_rates.items()}
    if scored:
        out[f"{p}/score"] = _score(rewards)
    if passed is not None:
        out[f"{p}/pass_rate"] = _mean_defined(passed)
    if oracle is not None:
        out[f"{p}/oracle"] = _mean_defined(oracle)

    envs: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        envs.setdefault(env_of(t), []).append(i)
    env_scores, env_pass = [], []
    for env in sorted(envs):
        idx = envs[env]
        if scored:
            s = _score(rewards[idx])
            out[f"{p}/env/{env}/score"] = s
            env_scores.append(s)
        if passed is not None:
            r = _mean_defined([passed[i] for i in idx])
            out[f"{p}/env/{env}/pass_rate"] = r
            env_pass.append(r)
    # Unweighted over environments (each counts once, whatever its size); an environment whose
    # value is undefined is left out.
    if envs and scored:
        out[f"{p}/env_mean/score"] = _mean_defined(env_scores)
    if envs and passed is not None:
        out[f"{p}/env_mean/pass_rate"] = _mean_defined(env_pass)
    return out


def reward_fn_metrics(
    split: str,
    reward_fns: Mapping[str, Callable],
    tasks: Sequence[Task],
    responses: Sequence[str],
    step: int | None = None,
) -> dict[str, float]:
    """``eval/<split>/reward_fn/<name>``: each reward function's mean over the set's responses
    (one batched call; None / NaN values left out, NaN when none is defined), and
    ``eval/<split>/reward_fn/<name>/failed``: the share of responses whose call raised (1 or 0).
    A result that is no reward per response raises ``RewardFnError`` as in training."""
    out: dict[str, float] = {}
    at = f"in the evaluation of {split!r}" + (f" at step {step}" if step is not None else "")
    for name, fn in reward_fns.items():
        values, error = call_reward_fn(name, fn, tasks, responses, at)
        out[f"eval/{split}/reward_fn/{name}"] = _mean_defined(list(values))
        out[f"eval/{split}/reward_fn/{name}/failed"] = 0.0 if error is None else 1.0
    return out


def evaluate(
    services: Any,
    domain: Any,
    config: Any,
    splits: Sequence[str] = EVAL_SPLITS,
    *,
    reward_fns: Mapping[str, Callable] | None = None,
    step: int | None = None,
) -> dict[str, float]:
    """HarnessRL §3 protocol on each of ``splits``: one response per task (greedy when
    ``eval.greedy``), no guidance, the tasks' seed rubrics, the frozen judge, and each of
    ``reward_fns`` (``reward_fn_metrics``). A set the domain does not have, or that is empty, is
    skipped; tasks without criteria are not judged, and a set with none has no rubric score.

    ``services``: ``generate(prompts, n, stream=, params=, names=)`` and ``judge(tasks,
    responses)`` (rubric_rl/services/); ``domain``: the splits as attributes, ``verify`` and
    ``oracle`` (None when absent).
    """
    out: dict[str, float] = {}
    n = int(config.eval.n)
    temperature = 0.0 if config.eval.greedy else float(config.rollout.temperature)
    params = SamplingParams(
        max_new_tokens=int(config.rollout.max_new_tokens), temperature=temperature, n=1
    )
    # The seed rubric's score; an outcome-only run (loss.reward="task_verifier") or one trained
    # on a reward function is scored with the weighted rubric reward.
    rubric_reward = config.loss.reward if config.loss.reward in REWARDS else "weighted"
    for split in splits:
        tasks = list(getattr(domain, split, None) or ())[:n]
        if not tasks:
            continue
        # one response per task: a greedy episode for a tool environment's task
        _, trajs = services.rollouts(tasks, 1, stream=f"eval/{split}", params=params)
        responses = [g[0].response for g in trajs]
        judged = [i for i, t in enumerate(tasks) if len(t.rubric.evaluated())]
        verdicts = services.judge([tasks[i] for i in judged], [[responses[i]] for i in judged])
        out.update(judge_failure_metrics(split, verdicts))
        groups = [[{v.criterion_id: v for v in vs} for vs in g] for g in verdicts]
        scores = pack_verdicts(groups, [tasks[i].rubric.evaluated() for i in judged])
        rewards = None
        if judged:  # NaN (left out of every mean) for a task without criteria
            rewards = np.full(len(tasks), np.nan)
            rewards[judged] = batch_rewards(rubric_reward, scores).values.astype(np.float64)[:, 0]
        passed = None
        if domain.verify is not None:
            passed = [bool(domain.verify(t, r)) for t, r in zip(tasks, responses)]
        oracle = None
        if domain.oracle is not None:
            oracle = [float(domain.oracle(t, r)) for t, r in zip(tasks, responses)]
        rates = criterion_pass_rates(scores)
        out.update(split_metrics(split, tasks, responses, rewards, passed, oracle, rates))
        out.update(reward_fn_metrics(split, reward_fns or {}, tasks, responses, step))
    return out
