"""The ``Rollouts`` record: what one training step produced, stage by stage (DESIGN §3).

A step's stages (``rubric_rl/step.py``) fill one ``Rollouts`` in place: ``sample`` makes the
groups (a task and its importance weight u each), ``decorate`` their prompts, ``generate`` the
trajectories, ``judge`` their verdicts, ``reward`` the named reward signals and the trained reward,
``advantage`` the advantages, ``select`` which groups are trained, ``teacher`` / ``gate`` the
self-distillation inputs. ``trainer_batch.build_train_batch`` packs the selected, trainable
trajectories into the jitted step's ``TrainBatch``.

Groups may have different sizes (ragged) and different roles (``solver``, ``generator``,
``probe``...): a two-round method (ARISE-RL: generator, then solver) puts both rounds' groups in
one record; probe rollouts made through ``Services.generate`` are never in it unless a stage
returns them as trainable.

Controllers read a ``Rollouts`` as their evidence: ``tasks``, ``prompts``, ``responses``,
``verdicts``, ``scores`` ``[G, C, J]``, ``rewards`` / ``advantages`` ``[G, J]`` (ragged groups are
padded with NaN) and ``signal(name)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.rubrics.scores import ScoreMatrices, pack_verdicts
from rubric_rl.rubrics.types import Task, Verdict

Messages = list[dict[str, str]]
ROLES = ("solver", "generator", "probe")
# Where a teacher's privileged context goes: appended to the last user message, or as (an
# addition to) the system message (ARISE-RL places its memory there).
TEACHER_PLACEMENTS = ("last_user", "system")


@dataclasses.dataclass
class Trajectory:
    """One rollout. Token fields are over the completion (everything after the prompt): for a
    multi-turn agent rollout that includes tool outputs, which ``loss_mask`` zeroes.

    ``loss_mask`` / ``sd_mask`` are per completion token; ``None`` means every token the engine
    sampled counts (single-turn) / every loss token is distilled."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # stop / length / abort (single-turn), + truncated (agent)
    weight_version: int
    response: str  # what the judge scores (decoded completion, or the env's response)
    loss_mask: tuple[int, ...] | None = None
    sample_index: int = 0
    seed: int | None = None
    verdicts: tuple[Verdict, ...] = ()
    signals: dict[str, float] = dataclasses.field(default_factory=dict)  # named rewards
    reward: float = math.nan  # the reward that is trained (NaN: undefined)
    advantage: float = math.nan
    trainable: bool = True
    teacher_prompt: Messages | None = None  # None: no privileged context, no SD term
    teacher_placement: str = "last_user"
    teacher_prompt_ids: tuple[int, ...] | None = None
    sd_mask: tuple[int, ...] | None = None
    sd_coef: float = 0.0
    oracle: float | None = None  # analysis only (diagnostics): never shown to a controller
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        n = len(self.tokens)
        if len(self.logprobs) != n:
            raise ValueError(f"Trajectory: {n} tokens but {len(self.logprobs)} log-probs")
        for name in ("loss_mask", "sd_mask"):
            m = getattr(self, name)
            if m is not None and len(m) != n:
                raise ValueError(f"Trajectory.{name}: {len(m)} entries for {n} tokens")
        if self.teacher_placement not in TEACHER_PLACEMENTS:
            raise ValueError(
                f"Trajectory.teacher_placement must be one of {TEACHER_PLACEMENTS}, got "
                f"{self.teacher_placement!r}"
            )

    def model_mask(self) -> tuple[int, ...]:
        return tuple(self.loss_mask) if self.loss_mask is not None else (1,) * len(self.tokens)


@dataclasses.dataclass
class Group:
    """The rollouts of one task under one prompt (a GRPO group) and what stages attach to it."""

    task: Task
    weight: float = 1.0  # importance weight u (HarnessRL §2.1: u = 1/(N p_i))
    role: str = "solver"
    n: int | None = None  # rollouts to generate (None: config.rollout.samples_per_task)
    prompt: Messages | None = None  # the decorated prompt (None until ``decorate``)
    prompt_ids: tuple[int, ...] = ()
    trajectories: list[Trajectory] = dataclasses.field(default_factory=list)
    selected: bool = True  # trained this step (``select``)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"Group.role must be one of {ROLES}, got {self.role!r}")
        w = float(self.weight)
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"Group.weight (u) must be finite and >= 0, got {self.weight}")
        self.weight = w

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def messages(self) -> Messages:
        return self.prompt if self.prompt is not None else self.task.messages


@dataclasses.dataclass
class Rollouts:
    """Groups of trajectories of one step; ``scores`` is set by the judge stage."""

    step: int
    groups: list[Group]
    scores: ScoreMatrices | None = None
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    # --- evidence view (what controllers read) ---------------------------------------------

    @property
    def tasks(self) -> tuple[Task, ...]:
        return tuple(g.task for g in self.groups)

    @property
    def prompts(self) -> tuple[Messages, ...]:
        return tuple(g.messages for g in self.groups)

    @property
    def responses(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(t.response for t in g.trajectories) for g in self.groups)

    @property
    def verdicts(self) -> tuple[tuple[tuple[Verdict, ...], ...], ...]:
        return tuple(tuple(tuple(t.verdicts) for t in g.trajectories) for g in self.groups)

    @property
    def group_size(self) -> int:
        return max((len(g) for g in self.groups), default=0)

    def matrix(self, field: str) -> np.ndarray:
        """``[G, J_max]`` float64 of a trajectory field (``reward``, ``advantage``), NaN-padded."""
        out = np.full((len(self.groups), self.group_size), np.nan)
        for g, group in enumerate(self.groups):
            for j, t in enumerate(group.trajectories):
                out[g, j] = getattr(t, field)
        return out

    def signal(self, name: str) -> np.ndarray:
        """``[G, J_max]`` values of a named reward signal (NaN where undefined or absent)."""
        out = np.full((len(self.groups), self.group_size), np.nan)
        for g, group in enumerate(self.groups):
            for j, t in enumerate(group.trajectories):
                out[g, j] = t.signals.get(name, np.nan)
        return out

    def set_matrix(self, field: str, values: np.ndarray) -> None:
        for g, group in enumerate(self.groups):
            for j, t in enumerate(group.trajectories):
                setattr(t, field, float(values[g, j]))

    def set_signal(self, name: str, values: np.ndarray) -> None:
        for g, group in enumerate(self.groups):
            for j, t in enumerate(group.trajectories):
                t.signals[name] = float(values[g, j])

    @property
    def rewards(self) -> np.ndarray:
        return self.matrix("reward")

    @property
    def advantages(self) -> np.ndarray:
        return self.matrix("advantage")

    @property
    def valid(self) -> np.ndarray:
        """``[G, J_max]`` True where a trajectory exists (False on ragged padding)."""
        out = np.zeros((len(self.groups), self.group_size), bool)
        for g, group in enumerate(self.groups):
            out[g, : len(group)] = True
        return out

    def selected(self) -> list[Group]:
        return [g for g in self.groups if g.selected]

    def __len__(self) -> int:
        return len(self.groups)

    # --- construction helpers --------------------------------------------------------------

    @classmethod
    def from_responses(
        cls,
        step: int,
        tasks: Sequence[Task],
        responses: Sequence[Sequence[str]],
        verdicts: Sequence[Sequence[Sequence[Verdict]]] | None = None,
        *,
        prompts: Sequence[Messages] | None = None,
        rewards: np.ndarray | None = None,
        advantages: np.ndarray | None = None,
        signals: Mapping[str, np.ndarray] | None = None,
    ) -> Rollouts:
        """A record from plain Python data (controllers' tests, scripted stand-in policies):
        no tokens; verdicts packed into ``scores`` when given. Without responses, one empty
        response per reward (a rewards-only record)."""
        if not responses and rewards is not None:
            r = np.asarray(rewards)
            responses = [[""] * r.shape[1] for _ in range(r.shape[0])]
        if verdicts is not None and not any(len(v) for v in verdicts):
            verdicts = None
        groups = []
        for g, (task, rs) in enumerate(zip(tasks, responses, strict=True)):
            trajs = []
            for j, text in enumerate(rs):
                t = Trajectory((), (), "stop", 0, text, sample_index=j)
                if verdicts is not None:
                    t.verdicts = tuple(verdicts[g][j])
                if rewards is not None:
                    t.reward = float(np.asarray(rewards)[g, j])
                if advantages is not None:
                    t.advantage = float(np.asarray(advantages)[g, j])
                for name, v in (signals or {}).items():
                    t.signals[name] = float(np.asarray(v)[g, j])
                trajs.append(t)
            prompt = list(prompts[g]) if prompts is not None else None
            groups.append(Group(task, prompt=prompt, trajectories=trajs))
        out = cls(int(step), groups)
        if verdicts is not None:
            out.scores = score_matrices(out)
        return out


def score_matrices(rollouts: Rollouts) -> ScoreMatrices:
    """``[G, C_max, J_max]`` verdicts of every group on its task's evaluated rubric. Ragged
    groups are padded with missing responses (invalid everywhere, so they count nowhere)."""
    j_max = rollouts.group_size
    groups, criteria = [], []
    for g in rollouts.groups:
        rows = [{v.criterion_id: v for v in t.verdicts} for t in g.trajectories]
        rows += [{} for _ in range(j_max - len(rows))]
        groups.append(rows)
        criteria.append(g.task.rubric.evaluated())
    ragged = any(len(g) != j_max for g in rollouts.groups)
    return pack_verdicts(groups, criteria, allow_missing=ragged)


def task_outcome_metrics(success: np.ndarray, threshold: float = 1.0) -> dict[str, float]:
    """``task/pass_rate`` (rollouts) and ``task/all_fail_groups`` (groups no rollout solved) of a
    ``[G, J]`` task-verifier matrix, a rollout solved at ``>= threshold``; NaN (the verifier
    failed) is left out, and a matrix with no defined entry gives no numbers, never a 0."""
    defined = ~np.isnan(success)
    if not defined.any():
        return {}
    solved = defined & (np.nan_to_num(success) >= threshold)
    return {
        "task/pass_rate": float(solved.sum() / defined.sum()),
        "task/all_fail_groups": float(np.mean(~solved.any(axis=1)[defined.any(axis=1)])),
    }


__all__ = [
    "ROLES",
    "TEACHER_PLACEMENTS",
    "Group",
    "Messages",
    "Rollouts",
    "Trajectory",
    "score_matrices",
    "task_outcome_metrics",
]
