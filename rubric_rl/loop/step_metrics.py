"""A step's logged numbers from its ``Rollouts``: rewards, judge failures, criteria, rollout
lengths, times, the oracle diagnostics, and the sampled rollouts written for the colabs.

``reward/*`` describes the signal that is trained (``Trajectory.reward``: ``loss.reward``, or
the first signal of a controller's mix) over the selected groups; every named signal is logged
as ``reward/<signal>/mean``. ``task/pass_rate`` and ``task/all_fail_groups`` are over every
generated group (rollouts and groups that passed the task verifier). Analysis only: nothing
here is shown to a controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rubric_rl.analysis.pair_failures import failure_metrics
from rubric_rl.rollout.batch import Rollouts, score_matrices, task_outcome_metrics
from rubric_rl.rubrics.rewards import POINTS_SCALE, REWARDS, batch_rewards
from rubric_rl.rubrics.scores import ScoreMatrices, failure_counts


def criterion_pass_rates(scores: ScoreMatrices) -> dict[str, float]:
    """Per criterion id (pooled over the groups that have it): met / valid verdicts."""
    met: dict[str, float] = {}
    cnt: dict[str, float] = {}
    for g, ids in enumerate(scores.criterion_ids):
        for i, cid in enumerate(ids):
            v = scores.valid[g, i]
            met[cid] = met.get(cid, 0.0) + float(scores.met[g, i][v].sum())
            cnt[cid] = cnt.get(cid, 0.0) + float(v.sum())
    return {cid: met[cid] / cnt[cid] for cid in sorted(met) if cnt[cid] > 0}


def _selected(rollouts: Rollouts) -> Rollouts:
    if all(g.selected for g in rollouts.groups):
        return rollouts
    sub = Rollouts(rollouts.step, rollouts.selected())
    sub.scores = score_matrices(sub)
    return sub


def step_metrics(
    rollouts: Rollouts,
    train_m: Mapping[str, Any],
    seconds: Mapping[str, float],
    *,
    measured: bool,
) -> dict[str, Any]:
    sel = _selected(rollouts)
    rewards = sel.rewards
    d = rewards[~np.isnan(rewards)]
    m: dict[str, Any] = {
        "reward/mean": float(d.mean()) if d.size else float("nan"),
        "reward/std": float(d.std()) if d.size else float("nan"),
        "reward/points": float(POINTS_SCALE * d.mean()) if d.size else float("nan"),
        "reward/undefined": int(np.isnan(rewards[sel.valid]).sum()),
        "reward/zero_variance_frac": rollouts.metrics.get("reward/zero_variance_frac", 0.0),
        # 1 when no trained reward was defined this step (it trained nothing; warned).
        "reward/all_undefined": rollouts.metrics.get("reward/all_undefined", 0.0),
    }
    names = sorted({k for g in sel.groups for t in g.trajectories for k in t.signals})
    for name in names:
        s = sel.signal(name)[sel.valid]
        s = s[~np.isnan(s)]
        if s.size:
            m[f"reward/{name}/mean"] = float(s.mean())
    # Every method's all-failure groups (ARISE's analysis: skill guidance should lower them;
    # ARISE's own arise/task/* are the same numbers), over every generated group.
    m.update(task_outcome_metrics(rollouts.signal("task_verifier")))
    m.update(failure_counts(sel.scores))
    for cid, rate in criterion_pass_rates(sel.scores).items():
        m[f"criteria/{cid}/pass_rate"] = rate
    for k, v in train_m.items():
        if k.startswith("rollout_corr/") and not measured:
            continue  # not measured this step (loss.mismatch_every): no fake zeros
        m[k if k.startswith(("loss", "train/")) else f"train/{k}"] = float(np.asarray(v))
    trajs = [t for g in rollouts.groups for t in g.trajectories]
    lens = np.array([len(t.tokens) for t in trajs])
    m["rollout/len_mean"] = float(lens.mean())
    m["rollout/stop_frac"] = float(np.mean([t.finish_reason == "stop" for t in trajs]))
    if any(t.loss_mask is not None for t in trajs):  # agent rollouts: tool outputs masked
        model = sum(sum(t.model_mask()) for t in trajs)
        m["rollout/model_token_frac"] = float(model / max(lens.sum(), 1))
        m["rollout/turns_mean"] = float(np.mean([t.info.get("turns", 0) for t in trajs]))
        m["rollout/tool_calls_mean"] = float(np.mean([t.info.get("tool_calls", 0) for t in trajs]))
    m["perf/tokens_per_s"] = float(lens.sum() / max(seconds.get("rollout", 0.0), 1e-9))
    if len(sel.groups) != len(rollouts.groups):
        m["select/groups"] = float(len(sel.groups))
        m["select/generated_groups"] = float(len(rollouts.groups))
    for k, v in seconds.items():
        m[f"time/{k}"] = float(v)
    m["time/controllers_frac"] = seconds.get("controllers", 0.0) / max(seconds["step"], 1e-9)
    return m


def oracle_diagnostics(rollouts: Rollouts, ctx: Any, seed_by_id: Mapping[str, Any]) -> dict:
    """HarnessRL's pair failure classes (``failure/*``) of the trained reward against the
    domain's hidden oracle, for the selected groups; the seed rubric's classes under
    ``failure/seed/*`` (the same numbers when the run trains on the seed rubric). Sets
    ``Trajectory.oracle`` (after the controllers have observed the step: they never see it).
    ``ctx`` is the step's ``StepContext`` (its domain, services and config)."""
    domain, services, config = ctx.domain, ctx.services, ctx.config
    if domain.oracle is None:
        return {}
    sel = rollouts.selected()
    for g in sel:
        for t in g.trajectories:
            try:
                t.oracle = float(domain.oracle(g.task, t.response))
            except Exception:  # noqa: BLE001 - an oracle failure excludes the pair, never 0
                t.oracle = float("nan")
    oracle = [np.array([t.oracle for t in g.trajectories], np.float64) for g in sel]
    trained = [np.array([t.reward for t in g.trajectories], np.float64) for g in sel]
    out = failure_metrics(list(zip(trained, oracle)))
    seed = [seed_by_id.get(g.task.id, g.task) for g in sel]
    if all(s.rubric == g.task.rubric for s, g in zip(seed, sel)):
        out.update(failure_metrics(list(zip(trained, oracle)), prefix="failure/seed/"))
        return out
    name = str(config.loss.reward)
    name = name if name in REWARDS else "weighted"  # the verifier or a reward function is trained
    verdicts = services.judge(
        seed, [[t.response for t in g.trajectories] for g in sel], check_failure_rate=False
    )
    seed_rewards = []
    for s, vs in zip(seed, verdicts):
        sub = Rollouts.from_responses(0, [s], [[""] * len(vs)], [vs])
        seed_rewards.append(batch_rewards(name, sub.scores).values[0].astype(np.float64))
    out.update(failure_metrics(list(zip(seed_rewards, oracle)), prefix="failure/seed/"))
    return out


def rollout_rows(rollouts: Rollouts, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rollouts of the step (group-major), with verdicts, signals and oracle;
    ``reward_fn_errors`` ({function: exception}) on a rollout whose reward function raised (its
    signal is NaN there, as a failed verdict is None)."""
    rows = []
    for g in rollouts.groups:
        for t in g.trajectories:
            if len(rows) >= n:
                return rows
            rows.append(
                {
                    "step": rollouts.step,
                    "task_id": g.task.id,
                    "role": g.role,
                    "selected": g.selected,
                    "prompt": g.messages,
                    "response": t.response,
                    "reward": float(t.reward),
                    "advantage": float(t.advantage),
                    "signals": dict(t.signals),
                    "oracle": t.oracle,
                    "finish_reason": t.finish_reason,
                    "verdicts": {v.criterion_id: v.met for v in t.verdicts},
                }
            )
            if errors := t.info.get("reward_fn_errors"):
                rows[-1]["reward_fn_errors"] = dict(errors)
    return rows


__all__ = ["criterion_pass_rates", "oracle_diagnostics", "rollout_rows", "step_metrics"]
