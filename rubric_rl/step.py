"""One training step as a pipeline of named stages (DESIGN §3) that a method owns.

    sample -> decorate -> generate -> judge -> reward -> advantage -> observe -> select
    -> teacher -> gate

A stage is ``fn(rollouts, ctx) -> rollouts``: it reads and fills the step's ``Rollouts``
(``rubric_rl/rollout/batch.py``); ``sample`` gets ``None`` and makes the record. The trainer runs
the pipeline, packs the selected trainable trajectories into a ``TrainBatch`` and updates; it
knows nothing else about the method. A method changes the step by replacing or inserting stages
(``Pipeline.replace`` / ``insert_before`` / ``insert_after``) in its ``Method.pipeline``
(``rubric_rl/methods/method.py``; or passed to ``Trainer(pipeline=...)``): RISED places
per-rollout teacher prompts, ARISE-RL inserts a generator round before the solver round. Each
default stage calls the controllers' hooks (``controllers/base.py``); stages that act on groups
(``decorate``, ``generate``, ``judge``) only touch groups that have not been through them yet, so
a stage inserted later in the pipeline can add groups and run them again.

How several controllers compose (documented order, never "first wins"):
- ``decorate``: each controller in turn transforms the prompts (controller order);
- ``generate``: a group's rollouts come from its prompt, or from per-sample behaviour prompts
  when one controller's ``sample_prompts`` gives them (two for one group is an error); the
  group's prompt is trained either way (RuscaRL: the scaffold is removed for the loss);
- ``reward``: the built-in signals (``rubric`` from ``loss.reward``'s rubric reward and
  ``task_verifier`` from the domain's verifier), then one signal per reward function
  (``rubric_rl/rubrics/reward_fns.py``, named by its name), then each controller's
  ``reward_signals`` adds new named signals (a name given twice is an error);
- ``advantage``: the trained mix is the union of the controllers' ``signal_weights`` (a signal
  weighted twice is an error), else ``loss.reward_weights``, else ``loss.reward`` alone (a rubric
  reward, the verifier or a reward function): A = Σ_k w_k · norm_g(r_k) with ``loss.advantage``
  as the normaliser; then each controller's ``shape_advantages`` in turn;
- ``select``: a group is trained iff every controller's ``select`` keeps it;
- ``teacher``: the controllers' contexts are joined by newlines; ``gate``: their gates multiply.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from rubric_rl.controllers.base import ControllerSet
from rubric_rl.core.advantages import ADVANTAGE_ESTIMATORS, multi_signal_advantages
from rubric_rl.rollout.batch import Group, Messages, Rollouts, score_matrices
from rubric_rl.rubrics.reward_fns import REWARD_FN_ERRORS, RewardFn, call_reward_fn, reward_fn_path
from rubric_rl.rubrics.rewards import REWARDS, batch_rewards
from rubric_rl.rubrics.types import append_to_last_user, append_to_system
from rubric_rl.services import TRAIN_STREAM, Services

RUBRIC_SIGNAL = "rubric"
VERIFIER_SIGNAL = "task_verifier"


@dataclasses.dataclass
class StepContext:
    """What every stage of one step may use. ``rng`` is the step's numpy Generator (a pure
    function of the saved JAX key: a resumed run replays it); ``metrics`` collects what stages
    report (logged under their own names)."""

    step: int
    config: Any
    rng: np.random.Generator
    services: Services
    controllers: ControllerSet
    domain: Any
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    signal_weights: dict[str, float] | None = None  # the trained mix (set by ``advantage``)
    reward_fns: Mapping[str, RewardFn] = dataclasses.field(default_factory=dict)  # name -> fn

    @property
    def needs_teacher(self) -> bool:
        return str(self.config.loss.sd_estimator) != "none"

    def rollout_mode(self) -> str:
        return self.services.rollout_mode()


Stage = Callable[[Rollouts | None, StepContext], Rollouts]


class Pipeline:
    """An ordered list of named stages."""

    def __init__(self, stages: Sequence[tuple[str, Stage]]):
        names = [n for n, _ in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"Pipeline: stage names must be unique, got {names}")
        self.stages = list(stages)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.stages)

    def _index(self, name: str) -> int:
        if name not in self.names:
            raise KeyError(f"Pipeline has no stage {name!r} (stages: {list(self.names)})")
        return self.names.index(name)

    def replace(self, name: str, stage: Stage) -> Pipeline:
        out = list(self.stages)
        out[self._index(name)] = (name, stage)
        return Pipeline(out)

    def insert_before(self, name: str, new: str, stage: Stage) -> Pipeline:
        out = list(self.stages)
        out.insert(self._index(name), (new, stage))
        return Pipeline(out)

    def insert_after(self, name: str, new: str, stage: Stage) -> Pipeline:
        out = list(self.stages)
        out.insert(self._index(name) + 1, (new, stage))
        return Pipeline(out)

    def remove(self, name: str) -> Pipeline:
        return Pipeline([s for s in self.stages if s[0] != name])

    def __call__(self, ctx: StepContext) -> Rollouts:
        rollouts = None
        for name, stage in self.stages:
            t0 = time.perf_counter()
            rollouts = stage(rollouts, ctx)
            if not isinstance(rollouts, Rollouts):
                raise TypeError(f"stage {name!r} returned {type(rollouts).__name__}, not Rollouts")
            ctx.seconds[name] = ctx.seconds.get(name, 0.0) + time.perf_counter() - t0
        return rollouts


# ------------------------------------------------------------------------------ default stages


def sample(rollouts: Rollouts | None, ctx: StepContext) -> Rollouts:
    """The sampler controller's tasks and importance weights u, one group per task."""
    batch = ctx.controllers.sample_tasks(ctx.step, ctx.rng)
    groups = [Group(t, float(w)) for t, w in zip(batch.tasks, batch.weights)]
    if rollouts is None:
        return Rollouts(ctx.step, groups)
    rollouts.groups.extend(groups)
    return rollouts


def decorate(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Guidance fields / skills / anti-patterns on the prompts of groups not yet decorated."""
    todo = [g for g in rollouts.groups if g.prompt is None]
    if todo:
        prompts = ctx.controllers.decorate([g.task for g in todo], [g.task.messages for g in todo])
        for g, p in zip(todo, prompts, strict=True):
            g.prompt = p
    return rollouts


def generate(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Trajectories for every group that has none: agent episodes over the task's environment
    from the group's (decorated) prompt where the task is rolled out that way
    (``Services.is_episode``: ``rollout.mode``, and on a mixed domain the task's environment),
    else single-turn through the engine; seeds from the trained stream."""
    todo = [g for g in rollouts.groups if not g.trajectories]
    j_default = int(ctx.config.rollout.samples_per_task)
    by_n: dict[int, list[Group]] = {}
    for g in todo:
        by_n.setdefault(g.n or j_default, []).append(g)
    for n, all_groups in by_n.items():
        episodes = [g for g in all_groups if ctx.services.is_episode(g.task)]
        if episodes:
            ids, trajs = ctx.services.rollouts(
                [g.task for g in episodes], n, stream=TRAIN_STREAM,
                prompts=[g.messages for g in episodes],
            )  # fmt: skip
            for g, p, ts in zip(episodes, ids, trajs, strict=True):
                g.prompt_ids, g.trajectories = tuple(p), list(ts)
        groups = [g for g in all_groups if not ctx.services.is_episode(g.task)]
        if not groups:
            continue
        scaffolds = ctx.controllers.sample_prompts(
            ctx.step, [g.task for g in groups], [g.messages for g in groups], n
        )
        plain = [g for g, s in zip(groups, scaffolds, strict=True) if s is None]
        if plain:
            ids, trajs = ctx.services.generate(
                [g.messages for g in plain], n, stream=TRAIN_STREAM,
                names=[g.task.id for g in plain],
            )  # fmt: skip
            for g, p, ts in zip(plain, ids, trajs, strict=True):
                g.prompt_ids, g.trajectories = tuple(p), list(ts)
        scaffolded = [(g, s) for g, s in zip(groups, scaffolds, strict=True) if s is not None]
        if scaffolded:
            _generate_scaffolded(scaffolded, n, ctx)
    return rollouts


def _generate_scaffolded(scaffolded, n: int, ctx: StepContext) -> None:
    """One sample per behaviour prompt (one engine call for the step); the group keeps its own
    prompt's ids — the prompt the loss is taken on — and each trajectory records its behaviour
    prompt's ids in ``info["behaviour_prompt_ids"]`` (``info["scaffolded"]``: it differs)."""
    flat = [p for _, per in scaffolded for p in per]
    names = [g.task.id for g, per in scaffolded for _ in per]
    ids, trajs = ctx.services.generate(flat, 1, stream=TRAIN_STREAM, names=names)
    k = 0
    for g, _ in scaffolded:
        g.prompt_ids = ctx.services.encode_prompt(g.messages, f"task {g.task.id}")
        g.trajectories = []
        for j in range(n):
            (t,) = trajs[k]
            g.trajectories.append(mark_behaviour(t, j, ids[k], g.prompt_ids))
            k += 1


def mark_behaviour(t, j: int, behaviour_ids, prompt_ids):
    """Sample ``j`` of a group drawn from its own behaviour prompt (``sample_prompts``)."""
    t.sample_index = j
    t.info["behaviour_prompt_ids"] = tuple(behaviour_ids)
    t.info["scaffolded"] = tuple(behaviour_ids) != tuple(prompt_ids)
    return t


def judge(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Verdicts of every unjudged trajectory on its task's rubric; ``rollouts.scores``. A task
    without judged criteria (the ``plain`` format's) is not sent to the judge."""
    todo = [g for g in rollouts.groups if g.trajectories and not g.info.get("judged")]
    judged = [g for g in todo if len(g.task.rubric.evaluated())]
    if judged:
        verdicts = ctx.services.judge(
            [g.task for g in judged], [[t.response for t in g.trajectories] for g in judged]
        )
        for g, vs in zip(judged, verdicts, strict=True):
            for t, v in zip(g.trajectories, vs, strict=True):
                t.verdicts = tuple(v)
    for g in todo:
        g.info["judged"] = True
    rollouts.scores = score_matrices(rollouts)
    return rollouts


def rubric_reward_name(config: Any) -> str | None:
    """The rubric reward the ``rubric`` signal is computed with: ``loss.reward`` when it names
    one (``rubrics.rewards.REWARDS``); None when it names the verifier or a reward function."""
    name = str(config.loss.reward)
    return name if name in REWARDS else None


def reward(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Named reward signals: ``rubric`` (the rubric reward named by ``loss.reward``, when it
    names one), ``task_verifier`` (1 / 0 from the domain's verifier, when it has one; NaN where
    it raised), one per reward function (``reward_fn_signals``), then the controllers' own."""
    name = rubric_reward_name(ctx.config)
    if name is not None:
        values = batch_rewards(name, rollouts.scores).values.astype(np.float64)
        rollouts.set_signal(RUBRIC_SIGNAL, values)
    if ctx.domain.verify is not None:
        for g in rollouts.groups:
            for t in g.trajectories:
                if VERIFIER_SIGNAL not in t.signals:
                    t.signals[VERIFIER_SIGNAL] = ctx.services.task_verifier(g.task, t.response)
    ctx.metrics.update(reward_fn_signals(rollouts, ctx))
    for sig, values in ctx.controllers.reward_signals(rollouts).items():
        if sig in (RUBRIC_SIGNAL, VERIFIER_SIGNAL):
            raise ValueError(f"a controller's reward signal {sig!r} shadows a built-in signal")
        if sig in ctx.reward_fns:
            raise ValueError(
                f"a controller's reward signal {sig!r} has the name of a reward function "
                f"(config.reward_fns.{sig}); rename the reward function"
            )
        rollouts.set_signal(sig, np.asarray(values, np.float64))
    return rollouts


def reward_fn_signals(rollouts: Rollouts, ctx: StepContext) -> dict[str, float]:
    """Each reward function's signal on the trajectories that lack it, one batched call per
    function (``reward_fns.call_reward_fn``). A call that raised leaves NaN and its error in
    each trajectory's ``info["reward_fn_errors"][name]``. Returns, over the step's trajectories
    that have the signal, ``reward_fn/<name>/failed`` (share whose call raised) and
    ``reward_fn/<name>/undefined`` (share that is None / NaN otherwise: not applicable)."""
    out: dict[str, float] = {}
    for name, fn in ctx.reward_fns.items():
        todo = [(g, t) for g in rollouts.groups for t in g.trajectories if name not in t.signals]
        if todo:
            values, error = call_reward_fn(
                name, fn, [g.task for g, _ in todo], [t.response for _, t in todo],
                f"at step {ctx.step}",
            )  # fmt: skip
            for (_, t), v in zip(todo, values, strict=True):
                t.signals[name] = float(v)
                if error is not None:
                    t.info.setdefault(REWARD_FN_ERRORS, {})[name] = error
        trajs = [t for g in rollouts.groups for t in g.trajectories if name in t.signals]
        failed = [name in t.info.get(REWARD_FN_ERRORS, {}) for t in trajs]
        undefined = [np.isnan(t.signals[name]) and not f for t, f in zip(trajs, failed)]
        out[f"reward_fn/{name}/failed"] = float(np.mean(failed)) if trajs else 0.0
        out[f"reward_fn/{name}/undefined"] = float(np.mean(undefined)) if trajs else 0.0
    return out


def trained_signals(ctx: StepContext) -> dict[str, float]:
    """The trained mix: the controllers' ``signal_weights`` if any, else ``loss.reward_weights``
    when non-empty, else ``loss.reward`` alone (``rubric`` for a rubric reward, else the signal
    it names: ``task_verifier`` or a reward function)."""
    weights = ctx.controllers.signal_weights()
    mix = {str(k): float(w) for k, w in dict(ctx.config.loss.get("reward_weights") or {}).items()}
    if weights:
        if mix:
            raise ValueError(
                f"config.loss.reward_weights: {mix} given, but the controllers set the trained "
                f"mix themselves (signal_weights {weights}); leave loss.reward_weights empty"
            )
        return weights
    if mix:
        return mix
    name = str(ctx.config.loss.reward)
    return {RUBRIC_SIGNAL if name in REWARDS else name: 1.0}


def reward_fn_failed(rollouts: Rollouts, names: Sequence[str]) -> np.ndarray:
    """``[G, J_max]`` True where the call of a reward function in ``names`` raised."""
    out = np.zeros((len(rollouts.groups), rollouts.group_size), bool)
    for g, group in enumerate(rollouts.groups):
        for j, t in enumerate(group.trajectories):
            errors = t.info.get(REWARD_FN_ERRORS) or {}
            out[g, j] = any(n in errors for n in names)
    return out


class RewardMagnitudeError(ValueError):
    """A finite reward too large for the group statistics (its squared deviations overflow)."""


def reward_limit(group_size: int) -> float:
    """The largest |reward| whose group statistics stay finite: the estimators compute in
    float32, where a group of J members with |r| <= M has squared deviations summing to at most
    J·(2M)², so M = sqrt(float32 max / J) / 2 (4.6e18 for J = 4). Beyond it the variance is inf,
    every advantage 0 and the loss 0 — a run that silently stops learning."""
    return float(np.sqrt(np.finfo(np.float32).max / max(int(group_size), 1)) / 2)


def check_reward_magnitude(
    signals: Mapping[str, np.ndarray], exists: np.ndarray, rollouts: Rollouts, ctx: StepContext
) -> None:
    """Raises ``RewardMagnitudeError`` naming the signal (and its reward function), the task,
    the rollout and the value when a defined reward's magnitude exceeds ``reward_limit``."""
    limit = reward_limit(rollouts.group_size)
    for name, values in signals.items():
        v = np.asarray(values, np.float64)
        bad = exists & ~np.isnan(v) & ~(np.abs(v) <= limit)
        if not bad.any():
            continue
        g, j = (int(x) for x in np.argwhere(bad)[0])
        fn = ctx.reward_fns.get(name)
        source = f" (reward function {reward_fn_path(fn)})" if fn is not None else ""
        raise RewardMagnitudeError(
            f"step {ctx.step}: reward signal {name!r}{source} is {v[g, j]:.6g} for task "
            f"{rollouts.groups[g].task.id!r} rollout {j} ({int(bad.sum())} value(s) beyond "
            f"|r| <= {limit:.3g}): its group's variance would overflow and zero every "
            "advantage; scale the reward down"
        )


def warn_all_undefined(
    signals: Mapping[str, np.ndarray], exists: np.ndarray, ctx: StepContext
) -> bool:
    """Whether no trained signal has a single defined reward this step (every reward None or
    NaN: the judge or reward function gave nothing); warned, since the step trains nothing."""
    if any(np.any(~np.isnan(v) & exists) for v in signals.values()):
        return False
    logging.warning(
        "step %d: every reward of the trained signal(s) %s is undefined (None / NaN) for all "
        "%d rollouts; this step trains nothing (counted in reward/all_undefined)",
        ctx.step, sorted(signals), int(exists.sum()),
    )  # fmt: skip
    return True


def advantage(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Group-normalised advantages of the trained mix (``loss.advantage``), then the controllers'
    shaping. ``Trajectory.reward`` is the mix's first signal; a trajectory whose advantage is
    undefined (NaN) is not trained."""
    lo = ctx.config.loss
    weights = trained_signals(ctx)
    ctx.signal_weights = dict(weights)
    signals = {k: rollouts.signal(k) for k in weights}
    exists = rollouts.valid
    check_reward_magnitude(signals, exists, rollouts, ctx)
    all_undefined = warn_all_undefined(signals, exists, ctx)
    primary = next(iter(weights))
    rewards = signals[primary]
    kw = dict(eps=float(lo.adv_eps), zero_variance_tol=float(lo.zero_var_eps))
    if len(weights) == 1 and weights[primary] == 1.0:
        est = ADVANTAGE_ESTIMATORS.get(str(lo.advantage))
        adv, zero_var = est(np.nan_to_num(rewards), valid=~np.isnan(rewards) & exists, **kw)
        adv, zero_var = np.asarray(adv, np.float64), np.asarray(zero_var)
        trainable = ~np.isnan(adv) & ~np.isnan(rewards)
    else:
        # A signal defined nowhere this step (e.g. ARISE's rubric while its pool is empty) is
        # left out rather than contributing zeros.
        live = {k: v for k, v in signals.items() if np.any(~np.isnan(v))} or {primary: rewards}
        adv, zvs = multi_signal_advantages(
            {k: np.nan_to_num(v) for k, v in live.items()},
            {k: weights[k] for k in live},
            estimator=str(lo.advantage),
            valid={k: ~np.isnan(v) & exists for k, v in live.items()},
            **kw,
        )
        adv = np.asarray(adv, np.float64)
        zero_var = np.all(np.stack([np.asarray(z) for z in zvs.values()]), axis=0)
        trainable = ~np.isnan(adv)
    # A trajectory whose reward function raised is not trained, in a mix too (its reward is
    # unknown, not the other signals' alone); one that is None there (not applicable) is.
    trainable &= ~reward_fn_failed(rollouts, list(weights))
    adv = ctx.controllers.shape_advantages(rollouts, np.nan_to_num(adv), adv_trainable=trainable)
    rollouts.set_matrix("reward", rewards)
    for g, group in enumerate(rollouts.groups):
        for j, t in enumerate(group.trajectories):
            t.advantage = float(adv[g, j])
            t.trainable = t.trainable and bool(trainable[g, j])
    rollouts.metrics["reward/zero_variance_frac"] = float(np.mean(zero_var))
    rollouts.metrics["reward/all_undefined"] = float(all_undefined)  # 1 a step: sums to a count
    return rollouts


def observe(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Controllers update their pools / memory / harness; their metrics are logged."""
    ctx.metrics.update(ctx.controllers.observe(rollouts))
    return rollouts


def select(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Which groups are trained: every group a controller's ``select`` keeps (all by default)."""
    keep = ctx.controllers.select(rollouts)
    if keep is not None:
        for g, k in zip(rollouts.groups, keep, strict=True):
            g.selected = g.selected and bool(k)
        ctx.metrics["select/kept_frac"] = float(np.mean(keep))
    return rollouts


def with_context(messages: Messages, context: str, placement: str, what: str) -> Messages:
    """A teacher prompt: ``context`` appended to the last user message (``last_user``), or to
    the system message (``system``; one is prepended when the prompt has none)."""
    if placement == "last_user":
        return append_to_last_user(messages, context, what=what)
    if placement != "system":
        raise ValueError(
            f"{what}: teacher placement must be last_user or system, got {placement!r}"
        )
    return append_to_system(messages, context)


def teacher(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """Per-group privileged contexts from the controllers (``teacher_context``), placed as
    ``Trajectory.teacher_placement`` says (default: appended to the last user message). A stage
    that sets per-trajectory teacher prompts itself replaces this one."""
    if not ctx.needs_teacher:
        return rollouts
    for g in rollouts.groups:
        text = ctx.controllers.teacher_context(g.task, rollouts)
        if not text or not text.strip():
            continue
        for t in g.trajectories:
            t.teacher_prompt = with_context(
                g.messages, text.strip(), t.teacher_placement, f"teacher prompt of task {g.task.id}"
            )
    return rollouts


def gate(rollouts: Rollouts, ctx: StepContext) -> Rollouts:
    """λ per trajectory = ``loss.sd_coef`` × the controllers' per-group gate."""
    if not ctx.needs_teacher:
        return rollouts
    g_mult = ctx.controllers.sd_gate(rollouts)
    coef = float(ctx.config.loss.sd_coef) * (
        np.ones(len(rollouts.groups)) if g_mult is None else g_mult
    )
    for g, c in zip(rollouts.groups, coef, strict=True):
        for t in g.trajectories:
            t.sd_coef = float(c)
    ctx.metrics["sd/context_frac"] = float(
        np.mean(
            [any(t.teacher_prompt is not None for t in g.trajectories) for g in rollouts.groups]
        )
    )
    ctx.metrics["sd/coef_mean"] = float(np.mean(coef))
    return rollouts


DEFAULT_STAGES: tuple[tuple[str, Stage], ...] = (
    ("sample", sample),
    ("decorate", decorate),
    ("generate", generate),
    ("judge", judge),
    ("reward", reward),
    ("advantage", advantage),
    ("observe", observe),
    ("select", select),
    ("teacher", teacher),
    ("gate", gate),
)


def default_pipeline() -> Pipeline:
    return Pipeline(DEFAULT_STAGES)


__all__ = [
    "DEFAULT_STAGES",
    "RUBRIC_SIGNAL",
    "VERIFIER_SIGNAL",
    "Pipeline",
    "Stage",
    "StepContext",
    "default_pipeline",
    "reward_fn_signals",
    "rubric_reward_name",
    "trained_signals",
    "with_context",
]
