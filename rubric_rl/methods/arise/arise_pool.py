"""The ARISE rubric–skill pool and its lifecycle (seed 000; DESIGN §6).

Each pool entry pairs a rubric (evaluates observable progress) with a skill (actionable guidance)
and a capability tag. The pool starts empty, so early training uses the task reward alone. A
``Reflection`` (``controllers/reflection.py``) reads the recent window of rollouts and adds pairs
up to ``pool_cap``. The lifecycle of an entry (``AriseConfig`` holds every threshold and window):

==========  =====================================================================  ==========
from        rule (rate = Σ passed / Σ judged over the last W observations)         to
==========  =====================================================================  ==========
(none)      reflection proposes it (pool below ``pool_cap``)                        added
added       W = retire_window observations, rate ≥ retire_above (mastered already)  retired
added       W = activate_window, rate < activate_below (low pass rate)              active
active      W = hide_window, rate ≥ hide_above (rising pass rate)                   hidden
active      W = refine_window, rate < refine_below, < max_refinements so far        active
            (persistent failure with the skill shown: the reflection rewrites the
            skill, the rubric id is kept and the previous skill recorded as parent)
active      W = refine_window, rate < refine_below, max_refinements reached         retired
            (``retire_unlearnable``: still failing after its last rewrite, the pair
            is unlearnable for this policy and frees its slot; ARISE "making room
            for new learning needs". Without it such a pair holds a slot for good)
hidden      W = retire_window, rate ≥ retire_above (consistent mastery)             retired
hidden      W = activate_window, rate < activate_below (regressed without skill)   active
==========  =====================================================================  ==========

Rules are checked in that order, at most one transition per entry per step. An observation is
one step's verdicts on the entry's rubric, kept only with at least ``min_evals`` valid verdicts;
only observations since the entry's last transition count (each decision is about the current
regime: the skill shown, hidden, or just rewritten). "added" and "active" rubrics are judged
(criterion status ACTIVE), "hidden" ones too (status HIDDEN: evaluated, skill not shown), retired
ones are neither. Every transition is an event ``{step, entry, event, from, to, evidence}``
collected for ``<workdir>/controllers/arise.jsonl`` (``pop_events``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rubric_rl.methods.arise.reflection_base import (
    CriteriaBank,
    Proposal,
    fill_skill,
    seed_rubric_bank,
)
from rubric_rl.rubrics.types import Criterion, CriterionStatus, Task, Verifier

ADDED, ACTIVE, HIDDEN, RETIRED = "added", "active", "hidden", "retired"
BANKS = ("auto", "library", "seed_rubric")
STATES = (ADDED, ACTIVE, HIDDEN, RETIRED)


@dataclasses.dataclass(frozen=True)
class AriseConfig:
    """Pool, lifecycle and reward settings (see the module docstring for the rules)."""

    # Set on the scripted-policy check before any RL run
    # (benchmarks/arise_controller_check.py): room for 16 pairs, at most one new pair every 3 steps
    # (~0.3 adds a step, the seed's 36 over 150 steps is 0.24), consistent mastery judged over 8
    # steps before a pair retires. The check then gives 37 added / 29 retired / 8 live over 150
    # steps (seed: 36 / 21 / 15), no stuck slot. The previous 8 / 2 a step / every step / 4 filled
    # the pool by step 4.
    pool_cap: int = 16
    max_add_per_reflection: int = 1
    reflect_every: int = 3
    reflect_start_step: int = 0
    reflection_window_steps: int = 4
    min_reflection_rollouts: int = 16
    readd_retired: bool = False
    min_evals: int = 4
    activate_below: float = 0.5
    activate_window: int = 2
    refine_below: float = 0.25
    refine_window: int = 4
    max_refinements: int = 2
    # Ours (the seed names no exit for a pair that never improves): an active pair still below
    # refine_below over refine_window after max_refinements rewrites retires. False keeps it.
    retire_unlearnable: bool = True
    hide_above: float = 0.75
    hide_window: int = 3
    retire_above: float = 0.9
    retire_window: int = 8
    evolve: bool = True  # False: the pool is frozen (no reflection, no transitions)
    # True: the rubric set is fixed (the frozen-rubrics ablation): no pair is added or retired,
    # while every pair's skill keeps its lifecycle (activate, hide, refine). Needs evolve=True.
    fixed_rubrics: bool = False
    inject_skills: bool = True  # False: the "no skill injection" ablation
    # Ours (the seed states no limit; ARISE shows every active pair's skill for the task): at
    # most this many skills in one prompt, in pool order (0 = all). Whatever the cap, skills are
    # dropped from the end of the block until the prompt fits model.max_prompt_len, counted as
    # arise/skills_dropped_length (before, such a prompt stopped the run with an error).
    max_skills: int = 0
    w_rubric: float = 1.0
    success_threshold: float = 1.0  # a rollout succeeds when its task reward reaches this
    # Where candidate rubrics and bound entries' criteria come from (BANKS): "library" = the
    # domain's checker library read from each prompt (criteria the seed rubric lacks included;
    # ours), "seed_rubric" = the task's own rubric (the earlier default, kept as an ablation),
    # "auto" = the library when the domain has one.
    bank: str = "auto"

    def __post_init__(self):
        if self.fixed_rubrics and not self.evolve:
            raise ValueError(
                "AriseConfig.fixed_rubrics keeps the skills' lifecycle and needs evolve=True"
            )
        if self.bank not in BANKS:
            raise ValueError(f"AriseConfig.bank must be one of {BANKS}, got {self.bank!r}")
        for name in ("activate_window", "refine_window", "hide_window", "retire_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"AriseConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "pool_cap",
            "max_add_per_reflection",
            "min_evals",
            "max_refinements",
            "max_skills",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"AriseConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.reflect_every < 1 or self.reflection_window_steps < 1:
            raise ValueError("AriseConfig.reflect_every and reflection_window_steps must be >= 1")
        if not (
            0.0 <= self.refine_below <= self.activate_below < self.hide_above <= self.retire_above
        ):
            raise ValueError(
                "AriseConfig thresholds must satisfy 0 <= refine_below <= activate_below < "
                f"hide_above <= retire_above; got {self.refine_below}, {self.activate_below}, "
                f"{self.hide_above}, {self.retire_above}"
            )


@dataclasses.dataclass
class PoolEntry:
    """One rubric–skill pair (mutable pool state; ``to_dict``/``from_dict`` are exact)."""

    id: str
    key: str
    text: str
    weight: float
    capability: str
    task_types: tuple[str, ...]
    skill: str
    source_id: str | None = None  # bound to the task's own criterion of this id
    state: str = ADDED
    created_step: int = 0
    skill_version: int = 1
    parent_id: str | None = None  # the skill this one was refined from ("<id>@s<version>")
    refinements: int = 0
    obs: list[list[float]] = dataclasses.field(default_factory=list)  # since last transition
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def skill_id(self) -> str:
        return f"{self.id}@s{self.skill_version}"

    @property
    def live(self) -> bool:
        return self.state != RETIRED

    def source(self, task: Task, bank: Sequence[Criterion] | None = None) -> Criterion | None:
        """The task's criterion this entry is bound to, among ``bank`` (the pool's criteria bank
        for the task; default its own rubric), or None if unbound or absent."""
        if self.source_id is None:
            return None
        for c in task.rubric.criteria if bank is None else bank:
            # The same criterion id can carry another capability on another task (e.g. the
            # answer of a counting vs a verification question): the entry targets its own cell.
            if c.id == self.source_id and (c.capability or "") == self.capability:
                return c
        return None

    def applies(self, task: Task, bank: Sequence[Criterion] | None = None) -> bool:
        """Targets the task: its type, and its capability (bound: the task has the criterion)."""
        if self.task_types and task.task_type not in self.task_types:
            return False
        if self.source_id is not None:
            return self.source(task, bank) is not None
        return not task.capabilities or self.capability in task.capabilities

    def criterion(self, task: Task, bank: Sequence[Criterion] | None = None) -> Criterion | None:
        """The rubric instantiated for ``task`` (id = entry id), or None if it does not apply."""
        if not self.live or not self.applies(task, bank):
            return None
        status = CriterionStatus.HIDDEN if self.state == HIDDEN else CriterionStatus.ACTIVE
        common = dict(
            id=self.id,
            status=status,
            origin="arise",
            created_step=self.created_step,
            parent_id=self.parent_id,
            capability=self.capability,
        )
        src = self.source(task, bank)
        if src is not None:
            skill = fill_skill(self.skill, src)
            return Criterion(
                text=src.text,
                weight=src.weight,
                title=src.title,
                verifier=src.verifier,
                choices=src.choices,
                skill=skill,
                **common,
            )
        return Criterion(
            text=self.text, weight=self.weight, verifier=Verifier(), skill=self.skill, **common
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["task_types"] = list(self.task_types)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PoolEntry:
        if d["state"] not in STATES:
            raise ValueError(f"pool entry {d.get('id')!r}: unknown state {d['state']!r}")
        return cls(
            **{
                **d,
                "task_types": tuple(d["task_types"]),
                "obs": [[float(a), float(b)] for a, b in d["obs"]],
                "evidence": dict(d["evidence"]),
            }
        )


def _rate(obs: Sequence[Sequence[float]]) -> float:
    passed, total = sum(o[0] for o in obs), sum(o[1] for o in obs)
    return passed / total


class RubricSkillPool:
    """The pool and its lifecycle (see the module docstring). Pure Python over explicit inputs:
    ``add`` proposals, ``record`` per-step pass counts, ``advance`` to apply the rules."""

    def __init__(self, config: AriseConfig, bank: CriteriaBank = seed_rubric_bank):
        self.config = config
        self.bank = bank  # where a bound entry finds its criterion on each task
        self.entries: dict[str, PoolEntry] = {}
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.totals = {"added": 0, "retired": 0, "refined": 0, "retired_unlearnable": 0}

    def live(self) -> list[PoolEntry]:
        return [e for e in self.entries.values() if e.live]

    def in_state(self, state: str) -> list[PoolEntry]:
        return [e for e in self.entries.values() if e.state == state]

    def excluded_keys(self) -> frozenset[str]:
        """Keys a reflection may not propose: live ones, and retired ones unless re-adding."""
        if self.config.readd_retired:
            return frozenset(e.key for e in self.live())
        return frozenset(e.key for e in self.entries.values())

    def _event(self, step: int, entry: PoolEntry, event: str, old, new, evidence) -> None:
        self.events.append(
            {
                "step": int(step),
                "entry": entry.id,
                "event": event,
                "from": old,
                "to": new,
                "evidence": evidence,
            }
        )

    def add(self, proposal: Proposal, step: int) -> PoolEntry:
        if len(self.live()) >= self.config.pool_cap:
            raise ValueError(f"ARISE pool is full ({self.config.pool_cap} live entries)")
        if proposal.key in self.excluded_keys():
            raise ValueError(f"ARISE pool already holds (or retired) {proposal.key!r}")
        entry = PoolEntry(
            id=f"arise-{self.next_id:04d}",
            key=proposal.key,
            text=proposal.text,
            weight=proposal.weight,
            capability=proposal.capability,
            task_types=proposal.task_types,
            skill=proposal.skill,
            source_id=proposal.source_id,
            created_step=int(step),
            evidence=dict(proposal.evidence),
        )
        self.next_id += 1
        self.entries[entry.id] = entry
        self.totals["added"] += 1
        self._event(step, entry, "add", None, ADDED, {"key": entry.key, **entry.evidence})
        return entry

    def record(self, entry_id: str, passed: float, total: float) -> bool:
        """One step's (satisfied, judged) counts for an entry; kept if total >= min_evals."""
        entry = self.entries[entry_id]
        if not entry.live or total < max(self.config.min_evals, 1):
            return False
        if not 0 <= passed <= total:
            raise ValueError(f"pool entry {entry_id}: passed {passed} not in [0, {total}]")
        entry.obs.append([float(passed), float(total)])
        return True

    def _window(self, entry: PoolEntry, w: int) -> float | None:
        return _rate(entry.obs[-w:]) if len(entry.obs) >= w else None

    def _move(self, step, entry, event, new, rate, w, threshold, extra=None) -> None:
        old = entry.state
        entry.state = new
        entry.obs = []
        evidence = {"pass_rate": rate, "window": w, "threshold": threshold, **(extra or {})}
        self._event(step, entry, event, old, new, evidence)

    def advance(
        self,
        step: int,
        refine: Callable[[PoolEntry], str | None] | None = None,
        *,
        retire: bool = True,
    ) -> list[PoolEntry]:
        """Applies the lifecycle rules once; returns the entries retired at this step.
        ``retire=False`` (a fixed rubric set): a pair that would retire stays where it is (an
        added or hidden pair keeps being judged, its skill not shown; an active pair past its
        refinements stays active)."""
        cfg = self.config
        retired = []
        for e in list(self.entries.values()):
            if e.state in (ADDED, HIDDEN):
                r = self._window(e, cfg.retire_window)
                if r is not None and r >= cfg.retire_above and not retire:
                    continue
                if r is not None and r >= cfg.retire_above:
                    self._move(step, e, "retire", RETIRED, r, cfg.retire_window, cfg.retire_above)
                    self.totals["retired"] += 1
                    retired.append(e)
                    continue
                r = self._window(e, cfg.activate_window)
                if r is not None and r < cfg.activate_below:
                    w, t = cfg.activate_window, cfg.activate_below
                    self._move(step, e, "activate", ACTIVE, r, w, t)
            elif e.state == ACTIVE:
                r = self._window(e, cfg.hide_window)
                if r is not None and r >= cfg.hide_above:
                    self._move(step, e, "hide", HIDDEN, r, cfg.hide_window, cfg.hide_above)
                    continue
                r = self._window(e, cfg.refine_window)
                if r is None or r >= cfg.refine_below:
                    continue
                if e.refinements >= cfg.max_refinements:
                    if cfg.retire_unlearnable and retire:
                        w, t = cfg.refine_window, cfg.refine_below
                        extra = {"reason": "unlearnable", "refinements": e.refinements}
                        self._move(step, e, "retire", RETIRED, r, w, t, extra)
                        self.totals["retired"] += 1
                        self.totals["retired_unlearnable"] += 1
                        retired.append(e)
                    continue
                new_skill = refine(e) if refine is not None else None
                if new_skill is None:
                    e.obs = []  # nothing to rewrite now: judge a fresh window before retrying
                    continue
                parent, old_skill = e.skill_id, e.skill
                e.skill, e.skill_version = new_skill, e.skill_version + 1
                e.parent_id, e.refinements = parent, e.refinements + 1
                self.totals["refined"] += 1
                extra = {"parent": parent, "old_skill": old_skill, "new_skill": new_skill}
                w, t = cfg.refine_window, cfg.refine_below
                self._move(step, e, "refine", ACTIVE, r, w, t, extra)
        return retired

    def rubric_for(self, task: Task) -> tuple[Criterion, ...]:
        """The live entries' criteria instantiated for ``task`` (judged: active and hidden)."""
        bank = self.bank(task) if self.entries else ()
        out = [e.criterion(task, bank) for e in self.entries.values()]
        return tuple(c for c in out if c is not None)

    def skills_for(self, task: Task) -> list[str]:
        """Skill texts to inject for ``task``: entries whose skill is active and that target it."""
        bank = self.bank(task) if self.entries else ()
        out = []
        for e in self.entries.values():
            if e.state == ACTIVE and e.applies(task, bank):
                out.append(fill_skill(e.skill, e.source(task, bank)))
        return list(dict.fromkeys(s for s in out if s.strip()))

    def pop_events(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "entries": [e.to_dict() for e in self.entries.values()],
            "next_id": self.next_id,
            "events": [dict(ev) for ev in self.events],
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        entries = [PoolEntry.from_dict(d) for d in state["entries"]]
        self.entries = {e.id: e for e in entries}
        self.next_id = int(state["next_id"])
        self.events = [dict(ev) for ev in state.get("events", [])]
        totals = state["totals"]
        self.totals = {k: int(totals[k]) for k in ("added", "retired", "refined")}
        # Absent from checkpoints written before unlearnable pairs could retire.
        self.totals["retired_unlearnable"] = int(totals.get("retired_unlearnable", 0))
