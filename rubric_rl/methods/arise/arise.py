"""ARISE: the rubric–skill pool that co-evolves with the policy (seed 000; DESIGN §5, §6).

Each pool entry pairs a rubric (evaluates observable progress) with a skill (actionable guidance)
and a capability tag. The pool starts empty, so early training uses the task reward alone. A
``Reflection`` (``controllers/reflection.py``) reads the recent window of rollouts and adds pairs
up to ``pool_cap``; the lifecycle (add, activate, refine, hide, retire) and its thresholds are in
``controllers/arise_pool.py``. ``AriseController`` wires pool, reflection and a task sampler
(``controllers/capability_sampler.py``, or an ablation's) into the step of DESIGN §3.

Reward (ARISE "Training strategy"; DESIGN §5): ``A = norm_g(r_task) + w_rubric·norm_g(r_rubric)``,
``r_task`` the task verifier, ``r_rubric`` the weighted rubric reward over the pool criteria
judged on the task; with no pool criterion on a task only the task term exists
(``arise_advantages``). The loss mask (model tokens only) is the trainer's TrainBatch contract.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, Messages, TaskBatch
from rubric_rl.core.advantages import multi_signal_advantages
from rubric_rl.envs.base import GENERIC_STYLE, DomainContract, Style
from rubric_rl.methods.arise.arise_pool import (
    ACTIVE,
    ADDED,
    HIDDEN,
    RETIRED,
    STATES,
    AriseConfig,
    PoolEntry,
    RubricSkillPool,
)
from rubric_rl.methods.arise.reflection import Reflection, RolloutRecord, satisfied
from rubric_rl.methods.arise.reflection_base import CriteriaBank, seed_rubric_bank
from rubric_rl.rollout.batch import Rollouts, task_outcome_metrics
from rubric_rl.rubrics.rewards import batch_rewards
from rubric_rl.rubrics.scores import ScoreMatrices
from rubric_rl.rubrics.types import Rubric, Task

__all__ = [
    "ACTIVE",
    "ADDED",
    "HIDDEN",
    "RETIRED",
    "STATES",
    "AriseConfig",
    "AriseController",
    "PoolEntry",
    "RubricSkillPool",
    "arise_advantages",
    "make_arise_controller",
]

TaskVerifier = Callable[[Task, str], "bool | float | None"]
FROZEN_POOL_ENTRIES = ("lifecycle", "final")  # what load_pool installs (frozen-rubrics ablation)
# How load_pool freezes the installed pool. "rubrics" (the seed's ablation keeps "the full
# lifecycle rubric pool" fixed; ours, how the skills start): every pair starts in the "added"
# state with its domain's base skill text and no evidence, and the skills keep their lifecycle
# (activate, hide, refine; AriseConfig.fixed_rubrics) while no pair is added or retired.
# "frozen_pool_and_skills": every pair keeps its end-of-run state and skill text, with no
# transition at all (AriseConfig.evolve=False): the arm before, whose skills arrive refined and
# always on.
FROZEN_MODES = ("rubrics", "frozen_pool_and_skills")


# --- reward --------------------------------------------------------------------------------------


def arise_advantages(
    task_rewards: np.ndarray,
    rubric_rewards: np.ndarray | None = None,
    *,
    w_rubric: float = 1.0,
    estimator: str = "grpo",
    eps: float = 1e-6,
    zero_variance_tol: float = 1e-6,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """ARISE: ``A = norm_g(r_task) + w_rubric·norm_g(r_rubric)`` over ``[G, J]`` rewards.

    NaN marks an undefined reward (verifier / every judge failed, or no pool criterion on the
    task): excluded from its signal's group statistics, contributing 0. With no rubric reward
    defined anywhere (empty pool) only the task term exists.
    """
    task = np.asarray(task_rewards, np.float64)
    signals = {"task": task}
    weights = {"task": 1.0}
    valid = {"task": ~np.isnan(task)}
    if rubric_rewards is not None:
        rubric = np.asarray(rubric_rewards, np.float64)
        if rubric.shape != task.shape:
            raise ValueError(f"rubric_rewards {rubric.shape} must match task_rewards {task.shape}")
        if np.any(~np.isnan(rubric)):
            signals["rubric"], weights["rubric"] = rubric, float(w_rubric)
            valid["rubric"] = ~np.isnan(rubric)
    adv, zero_variance = multi_signal_advantages(
        {k: np.nan_to_num(v) for k, v in signals.items()},
        weights,
        estimator=estimator,
        eps=eps,
        zero_variance_tol=zero_variance_tol,
        valid=valid,
    )
    return np.asarray(adv), {k: np.asarray(v) for k, v in zero_variance.items()}


# --- the controller ------------------------------------------------------------------------------


class AriseController(Controller):
    """The ARISE controller, also the step's sampler: it wraps a task sampler (the capability
    sampler, or an ablation's), gives each drawn task the pool's rubric, injects active skills,
    and observes evidence to evolve the pool.

    The ARISE reward is the trained mix ``signal_weights`` = {task verifier: 1, pool rubric:
    w_rubric}, each normalised in its group by ``loss.advantage`` (``rubric_rl/step.py``); the
    signals are the step's built-in ``task_verifier`` and ``rubric`` (the pool rubric is the task's
    rubric). ``pop_events`` (lifecycle events for ``controllers/arise.jsonl``).
    """

    name = "arise"

    def __init__(
        self,
        tasks: Sequence[Task],
        sampler: Controller,
        reflection: Reflection | None,
        config: AriseConfig | None = None,
        *,
        task_verifier: TaskVerifier | None,
        bank: CriteriaBank = seed_rubric_bank,
        style: Style = GENERIC_STYLE,
    ):
        config = config or AriseConfig()
        if task_verifier is None:
            raise ValueError(
                "AriseController: the task verifier (the domain's Domain.verify) is required: "
                "ARISE trains the verifier's outcome reward; this domain has none"
            )
        self.tasks_by_id = {t.id: t for t in tasks}
        self.sampler = sampler
        self.reflection = reflection
        self.config = config
        self.pool = RubricSkillPool(config, bank)
        self.task_verifier = task_verifier
        self.style = style  # how the skills block is written (the domain's Style)
        self.window: collections.deque = collections.deque(maxlen=config.reflection_window_steps)
        # Skills left out of prompts since the last observe (logged there, then reset).
        self._dropped: collections.Counter = collections.Counter()
        if config.evolve and reflection is None:
            raise ValueError("AriseController: evolve=True needs a reflection")

    def base_task(self, task: Task) -> Task:
        return self.tasks_by_id.get(task.id, task)

    # --- step hooks ---------------------------------------------------------------------------

    def with_pool_rubric(self, task: Task) -> Task:
        base = self.base_task(task)
        return dataclasses.replace(base, rubric=Rubric(self.pool.rubric_for(base), "weighted"))

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch:
        batch = self.sampler.sample_tasks(step, rng)
        if batch is None:
            raise ValueError(
                f"AriseController: inner controller {self.sampler.name!r} is no sampler"
            )
        return TaskBatch(tuple(self.with_pool_rubric(t) for t in batch.tasks), batch.weights)

    def decorate(self, tasks: Sequence[Task], prompts: Sequence[Messages]) -> list[Messages]:
        """Each task's prompt with its active skills (``max_skills`` at most, pool order); skills
        are dropped from the end until the prompt fits ``model.max_prompt_len`` (counted)."""
        out = [[dict(m) for m in p] for p in prompts]
        if not self.config.inject_skills:
            return out
        cap = int(self.config.max_skills)
        for g, task in enumerate(tasks):
            skills = self.pool.skills_for(self.base_task(task))
            if cap and len(skills) > cap:
                self._dropped["cap"] += len(skills) - cap
                skills = skills[:cap]
            while skills:
                decorated = self.style.add_block(task, out[g], "skills", skills)
                if self._fits(decorated):
                    out[g] = decorated
                    break
                self._dropped["length"] += 1
                skills = skills[:-1]
        return out

    def _fits(self, messages: Messages) -> bool:
        """The prompt is within ``model.max_prompt_len`` (the check generation makes); True
        without services (a controller used on its own)."""
        if self.services is None:
            return True
        try:
            self.services.encode_prompt(messages)
        except ValueError:
            return False
        return True

    def task_rewards(self, tasks: Sequence[Task], responses: Sequence[Sequence[str]]) -> np.ndarray:
        """``[G, J]`` task verifier rewards (NaN where the verifier failed)."""
        out = np.full((len(tasks), max((len(r) for r in responses), default=0)), np.nan)
        for g, (task, group) in enumerate(zip(tasks, responses)):
            for j, response in enumerate(group):
                try:
                    r = self.task_verifier(self.base_task(task), response)
                except Exception as e:  # a verifier failure is undefined, never a 0 reward
                    logging.warning("ARISE task verifier failed on task %r: %r", task.id, e)
                    r = None
                out[g, j] = np.nan if r is None else float(r)
        return out

    def arise_signals(
        self, tasks: Sequence[Task], responses: Sequence[Sequence[str]], scores: ScoreMatrices
    ) -> dict[str, np.ndarray]:
        """``{"task": r_task [G, J], "rubric": r_rubric [G, J]}`` outside a training step (the
        trainer's reward stage computes the same two signals once per step); r_rubric is the
        weighted rubric reward over the pool criteria judged (NaN where a task has none)."""
        task = self.task_rewards(tasks, responses)
        if scores.max_criteria == 0:
            return {"task": task, "rubric": np.full(task.shape, np.nan)}
        return {"task": task, "rubric": batch_rewards("weighted", scores).values.astype(float)}

    def signal_weights(self) -> dict[str, float]:
        """ARISE: A = norm_g(r_task) + w_rubric · norm_g(r_rubric)."""
        return {"task_verifier": 1.0, "rubric": float(self.config.w_rubric)}

    def observe(self, evidence: Rollouts) -> dict[str, float]:
        cfg = self.config
        metrics = {f"sampler/{k}": v for k, v in (self.sampler.observe(evidence) or {}).items()}
        if self.config.inject_skills:
            for why in ("cap", "length"):
                metrics[f"skills_dropped_{why}"] = float(self._dropped[why])
            self._dropped.clear()
        computed = any(
            "task_verifier" in t.signals for g in evidence.groups for t in g.trajectories
        )
        if computed:  # the step's reward stage ran the verifier: not again
            success = evidence.signal("task_verifier")
        else:
            success = self.task_rewards(evidence.tasks, evidence.responses)
        records, passed, judged = [], collections.Counter(), collections.Counter()
        for g, task in enumerate(evidence.tasks):
            weights = {c.id: c.weight for c in task.rubric.criteria}
            for j, response in enumerate(evidence.responses[g]):
                verdicts = {v.criterion_id: v.met for v in evidence.verdicts[g][j]}
                for cid, met in verdicts.items():
                    if met is not None and cid in self.pool.entries:
                        judged[cid] += 1
                        passed[cid] += satisfied(met, weights[cid])
                r = success[g, j]
                ok = None if math.isnan(r) else bool(r >= cfg.success_threshold)
                records.append([task.id, response, ok, verdicts])
        self.window.append({"step": int(evidence.step), "records": records})
        if cfg.evolve:
            for cid in sorted(judged):
                self.pool.record(cid, passed[cid], judged[cid])
            self._evolve(int(evidence.step))
        # ARISE analysis: skill injection should lower the rate of all-failure groups
        # (undefined, every verifier call failed, is omitted, never logged as 0).
        metrics.update(task_outcome_metrics(success, cfg.success_threshold))
        total = sum(judged.values())
        if total:  # undefined with an empty pool: omitted rather than logged as NaN or 0
            metrics["rubric/pass_rate"] = sum(passed.values()) / total
        for cid in sorted(judged):  # per-criterion trajectories for the lifecycle plots
            metrics[f"rubric/{cid}/pass_rate"] = passed[cid] / judged[cid]
        return {**metrics, **self.pool_metrics()}

    def _records(self) -> list[RolloutRecord]:
        out = []
        for block in self.window:
            for task_id, response, ok, verdicts in block["records"]:
                task = self.tasks_by_id.get(task_id)
                if task is not None:
                    out.append(RolloutRecord(block["step"], task, response, ok, verdicts))
        return out

    def _evolve(self, step: int) -> None:
        cfg = self.config
        records = self._records()

        def refine(entry: PoolEntry) -> str | None:
            return self.reflection.refine(entry, records, step=step)

        if cfg.fixed_rubrics:  # the frozen-rubrics ablation: skills move, rubrics stay
            self.pool.advance(step, refine, retire=False)
            return
        retired = self.pool.advance(step, refine)
        if retired and hasattr(self.sampler, "forget"):
            self.sampler.forget([e.id for e in retired])  # retired rubrics' evidence is dropped
        room = min(cfg.pool_cap - len(self.pool.live()), cfg.max_add_per_reflection)
        due = step >= cfg.reflect_start_step and step % cfg.reflect_every == 0
        if room <= 0 or not due or len(records) < cfg.min_reflection_rollouts:
            return
        proposals = self.reflection.propose(
            records,
            self.pool.live(),
            max_new=room,
            step=step,
            exclude_keys=self.pool.excluded_keys(),
        )
        for p in proposals[:room]:
            if p.key not in self.pool.excluded_keys():
                self.pool.add(p, step)

    def pool_metrics(self) -> dict[str, float]:
        live = self.pool.live()
        out = {
            "pool/live": float(len(live)),
            "pool/dormant": float(len(self.pool.in_state(ADDED))),
            "pool/skill_active": float(len(self.pool.in_state(ACTIVE))),
            "pool/skill_hidden": float(len(self.pool.in_state(HIDDEN))),
            "pool/added_total": float(self.pool.totals["added"]),
            "pool/retired_total": float(self.pool.totals["retired"]),
            "pool/refined_total": float(self.pool.totals["refined"]),
            "pool/retired_unlearnable_total": float(self.pool.totals["retired_unlearnable"]),
        }
        if self.reflection is not None:
            out.update(self.reflection.stats())
        return out

    def pop_events(self) -> list[dict[str, Any]]:
        """Lifecycle events since the last call, for ``<workdir>/controllers/arise.jsonl``."""
        return self.pool.pop_events()

    def write_events(self, path: str | os.PathLike) -> int:
        """Appends the pending events to a JSONL file (one event per line); returns how many."""
        events = self.pop_events()
        if events:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                for ev in events:
                    f.write(json.dumps(ev, sort_keys=True) + "\n")
        return len(events)

    # --- checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.config),
            "pool": self.pool.state_dict(),
            "window": [
                {
                    "step": b["step"],
                    "records": [[t, r, ok, dict(v)] for t, r, ok, v in b["records"]],
                }
                for b in self.window
            ],
            "sampler": self.sampler.state_dict(),
            "reflection": self.reflection.state_dict() if self.reflection is not None else {},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])
        self.window.clear()
        for b in state["window"]:
            self.window.append(
                {
                    "step": int(b["step"]),
                    "records": [[t, r, ok, dict(v)] for t, r, ok, v in b["records"]],
                }
            )
        self.sampler.load_state_dict(state["sampler"])
        if self.reflection is not None:
            self.reflection.load_state_dict(state["reflection"])

    def load_pool(
        self,
        pool_state: Mapping[str, Any],
        entries: str = "lifecycle",
        mode: str = "frozen_pool_and_skills",
    ) -> None:
        """Installs another run's pool (e.g. its final checkpoint's ``state["pool"]``) — the
        frozen-rubrics ablation.

        ``entries="lifecycle"``: every pair the run ever added is judged — ARISE's "even the full
        lifecycle rubric pool, when kept fixed, does not replace dynamic evolution";
        ``"final"``: the final pool as it stood (retired pairs neither judged nor shown).
        ``mode`` (``FROZEN_MODES``): ``"rubrics"`` (with ``AriseConfig(fixed_rubrics=True)``):
        every installed pair starts "added" with its capability's base skill text, no evidence
        and no refinement; ``"frozen_pool_and_skills"`` (with ``AriseConfig(evolve=False)``):
        a retired pair comes back hidden, the others keep their final state and skill text."""
        if entries not in FROZEN_POOL_ENTRIES:
            raise ValueError(
                f"load_pool: entries must be one of {FROZEN_POOL_ENTRIES}, got {entries!r}"
            )
        if mode not in FROZEN_MODES:
            raise ValueError(f"load_pool: mode must be one of {FROZEN_MODES}, got {mode!r}")
        self.pool.load_state_dict({**pool_state, "events": []})
        if mode == "rubrics":
            if not self.config.fixed_rubrics:
                raise ValueError("load_pool: mode 'rubrics' needs AriseConfig(fixed_rubrics=True)")
            if entries == "final":
                self.pool.entries = {k: e for k, e in self.pool.entries.items() if e.live}
            for e in self.pool.entries.values():
                e.skill = self._base_skill(e)
                e.state, e.obs, e.skill_version, e.parent_id, e.refinements = ADDED, [], 1, None, 0
            n = len(self.pool.entries)
            self.pool.totals = {"added": n, "retired": 0, "refined": 0, "retired_unlearnable": 0}
            return
        if entries == "lifecycle":
            for e in self.pool.entries.values():
                if e.state == RETIRED:
                    e.state, e.obs = HIDDEN, []

    def _base_skill(self, entry: PoolEntry) -> str:
        """The skill text a pair starts with: the reflection's base text for its capability (the
        domain's, e.g. the embedded domain's SKILL_TEXTS), else the text it was added with."""
        base = getattr(self.reflection, "base_skill", None)
        if base is not None:
            return base(entry.capability)
        if entry.skill_version > 1:
            raise ValueError(
                f"load_pool: pair {entry.id} has a refined skill (version {entry.skill_version}) "
                "and the reflection has no base text to reset it to"
            )
        return entry.skill


def make_arise_controller(
    tasks: Sequence[Task],
    batch_size: int,
    *,
    seed: int = 0,
    sampler: str = "capability",
    sampler_options: Mapping[str, Any] | None = None,
    reflection: str = "programmatic",
    reflection_options: Mapping[str, Any] | None = None,
    llm_client: Any = None,
    task_verifier: TaskVerifier | None = None,
    criteria_library: CriteriaBank | None = None,
    style: Style = GENERIC_STYLE,
    skill_texts: Mapping[str, str] | None = None,
    **arise_options: Any,
) -> AriseController:
    """Builds the ARISE controller from config values: the inner sampler by its ``SAMPLERS`` name
    (``capability``; ``uniform`` for the alternative-sampling ablation), the reflection by its
    ``REFLECTIONS`` name (``llm`` needs ``llm_client``), and ``AriseConfig`` fields as keywords.
    ``task_verifier``, ``criteria_library`` (``AriseConfig.bank``), ``style`` (how skills reach
    the prompt) and ``skill_texts`` (the programmatic reflection's base skills) are the domain's
    (``Domain.verify``, ``criteria_library``, ``style``, ``skill_texts``)."""
    from rubric_rl.controllers.sampling import SAMPLERS
    from rubric_rl.methods.arise import capability_sampler  # noqa: F401  (registers "capability")
    from rubric_rl.methods.arise.reflection import REFLECTIONS

    config = AriseConfig(**arise_options)
    bank = resolve_bank(config.bank, criteria_library)
    inner = SAMPLERS.get(sampler)(tasks, batch_size, seed=seed, **dict(sampler_options or {}))
    refl = None
    if config.evolve:
        cls = REFLECTIONS.get(reflection)
        options = dict(reflection_options or {})
        if reflection == "llm":
            if llm_client is None:
                raise ValueError("make_arise_controller: reflection='llm' needs an llm_client")
            refl = cls(llm_client, **options)
        else:
            refl = cls(skill_texts=dict(skill_texts or {}), bank=bank, **options)
    return AriseController(
        tasks, inner, refl, config, task_verifier=task_verifier, bank=bank, style=style
    )


def domain_kwargs(domain: DomainContract) -> dict[str, Any]:
    """What ``make_arise_controller`` reads of the Domain contract: its verifier, checker
    library, style and skill texts."""
    return {
        "task_verifier": domain.verify,
        "criteria_library": domain.criteria_library,
        "style": domain.style,
        "skill_texts": domain.skill_texts,
    }


def resolve_bank(name: str, criteria_library: CriteriaBank | None) -> CriteriaBank:
    """``AriseConfig.bank`` as a function: the domain's library, or the task's own rubric."""
    if name == "seed_rubric" or (name == "auto" and criteria_library is None):
        return seed_rubric_bank
    if criteria_library is None:
        raise ValueError(
            "config.arise.bank='library': the domain has no checker library (only the embedded "
            "constraints domain has one); use 'seed_rubric' or 'auto'"
        )
    return criteria_library
