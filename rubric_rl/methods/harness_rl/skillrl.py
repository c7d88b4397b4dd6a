"""SkillRL (Xia et al., arXiv 2602.08234): a skill bank distilled from trajectories, the task's
category skills in its prompt, and new skills for categories that keep failing — the
guidance-side baseline of HarnessRL (``../shared/notes/baselines.md`` §2).

SkillRL's teacher (o3) writes skills as prose from trajectories; no LLM teacher is wired here.
**The programmatic teacher (ours, for domains with a checker library):** a skill is a
requirement *kind* of a task category (``"end"``, ``"distinct"``, ``"plain"``, …, the library
criterion's id before ``:``) whose criterion the category's rollouts fail; shown to a task, it is
written as the task's own library criterion of that kind through the domain's guidance style
(``<criterion>`` blocks — the prompt shape the warm start taught), so "how to avoid the mistake"
is the requirement the policy keeps missing.

- **Category** = the task's type (SkillRL's "template" mode detects it with keyword rules).
- **Bank before RL** (SkillRL: distilled from base-model trajectories): the first step's own
  rollouts (the warm-started policy's), judged on each task's library criteria; per category
  the ``init_skills`` kinds with the highest failure rate, at least ``min_fail`` (ours: 3, 0.5).
- **Retrieval** (template mode): the category's skills that apply to the task (its library has
  that kind), in bank order, at most ``max_shown`` (3, ours: the most guidance the warm start
  showed; SkillRL shows the category's skills plus the top 6 general ones).
- **Recursive evolution** (SkillRL: after each validation pass, categories below a success rate
  of 0.4 get 1-3 new skills from at most 10 failed trajectories): every ``update_every`` steps
  (10, ours), from the *training* rollouts of those steps (the validation split is reserved for
  choices by the protocol — ours), a category whose task pass rate is below ``threshold`` gets
  up to ``max_new`` (3) new kinds — those most failed in its (at most 10 per step) failed
  rollouts that the bank lacks. Skills are never pruned (as the released code).
- Skills are trained in the prompt (SkillRL's policy conditions on them) and never shown at
  evaluation (HarnessRL's protocol).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller
from rubric_rl.methods.harness_rl.state import met_matrix
from rubric_rl.rollout.batch import Messages, Rollouts
from rubric_rl.rubrics.types import Criterion, Task

VERIFIER = "task_verifier"


def kind_of(criterion_id: str) -> str:
    """A library criterion's requirement kind (``"end:!"`` -> ``"end"``)."""
    return criterion_id.split(":", 1)[0]


def category_of(task: Task) -> str:
    return task.task_type or task.env_name or task.domain or "task"


@dataclasses.dataclass(frozen=True)
class SkillRLConfig:
    init_skills: int = 3
    min_fail: float = 0.5
    max_shown: int = 3
    update_every: int = 10
    threshold: float = 0.4  # SkillRL's update_threshold
    max_new: int = 3  # SkillRL's max_new_skills
    max_failed: int = 10  # failed rollouts per category and step read (SkillRL: at most 10)

    def __post_init__(self):
        for name in ("init_skills", "max_shown", "update_every", "max_new", "max_failed"):
            if getattr(self, name) < 1:
                raise ValueError(f"skillrl.{name}={getattr(self, name)}: must be >= 1")
        for name in ("min_fail", "threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"skillrl.{name}={getattr(self, name)}: must be in [0, 1]")


def failure_rates(
    stats: Mapping[str, Sequence[float]], min_total: int = 1
) -> list[tuple[str, float]]:
    """(kind, failed / seen) for kinds seen at least ``min_total`` times, highest first (ties by
    kind, so the order is deterministic)."""
    rates = [(k, f / n) for k, (f, n) in stats.items() if n >= min_total]
    return sorted(rates, key=lambda x: (-x[1], x[0]))


class SkillRLController(Controller):
    name = "skillrl"

    def __init__(
        self,
        config: SkillRLConfig,
        style,
        library: Callable[[Task], Sequence[Criterion]] | None,
    ):
        if library is None:
            raise ValueError(
                "skillrl: the programmatic teacher needs the domain's checker library "
                "(domain.criteria_library); an LLM teacher is not implemented"
            )
        self.config = config
        self.style = style
        self.library = library
        self.bank: dict[str, list[dict[str, Any]]] = {}  # category -> skills, in bank order
        self.initialized = False
        self.window: dict[str, dict[str, Any]] = {}  # category -> {passed, total, kinds}
        self.steps_seen = 0
        self.n_dynamic = 0
        self._events: list[dict[str, Any]] = []
        self._shown: list[int] = []  # skills mounted on the step's prompts (metrics)

    # ------------------------------------------------------------------ retrieval

    def skills_for(self, task: Task) -> list[Criterion]:
        """The task's library criteria of its category's skills, in bank order, capped."""
        lib = {kind_of(c.id): c for c in self.library(task) if c.weight > 0}
        out = []
        for skill in self.bank.get(category_of(task), []):
            c = lib.get(skill["kind"])
            if c is not None:
                out.append(c)
            if len(out) >= self.config.max_shown:
                break
        return out

    def decorate(self, tasks: Sequence[Task], prompts: Sequence[Messages]) -> list[Messages]:
        out = []
        for task, prompt in zip(tasks, prompts, strict=True):
            skills = self.skills_for(task)
            self._shown.append(len(skills))
            if not skills:
                out.append(list(prompt))
                continue
            if list(prompt) != task.messages:
                raise ValueError(
                    f"skillrl: task {task.id!r}'s prompt was decorated by another controller; "
                    "skills are mounted on the task's own prompt"
                )
            hints = [self.style.hint(c.text, c.weight) for c in skills]
            out.append(self.style.mount(task, {"criterion": hints}))
        return out

    # ------------------------------------------------------------------ evidence

    def _judge_library(self, rollouts: Rollouts) -> list[tuple[Task, list, np.ndarray]]:
        """Per group: (task, library criteria, met [K, J] with NaN for a failed verdict)."""
        tasks, responses, crits = [], [], []
        for g in rollouts.groups:
            lib = [c for c in self.library(g.task) if c.weight > 0]
            if not lib or not g.trajectories:
                continue
            tasks.append(g.task)
            responses.append([t.response for t in g.trajectories])
            crits.append(lib)
        if not tasks:
            return []
        verdicts = self.services.judge(tasks, responses, crits, check_failure_rate=False)
        return [
            (task, lib, met_matrix(lib, rows))
            for task, lib, rows in zip(tasks, crits, verdicts, strict=True)
        ]

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        judged = self._judge_library(rollouts)
        passed = {
            g.task.id: [t.signals.get(VERIFIER, np.nan) for t in g.trajectories]
            for g in rollouts.groups
        }
        if not self.initialized:
            self._init_bank(judged)
        for task, lib, met in judged:
            w = self.window.setdefault(category_of(task), {"passed": 0, "total": 0, "kinds": {}})
            ok = np.asarray(passed.get(task.id, []), float)
            defined = ~np.isnan(ok)
            w["passed"] += int(np.sum(ok[defined] > 0.5))
            w["total"] += int(defined.sum())
            failed = [j for j in range(met.shape[1]) if defined[j] and ok[j] <= 0.5]
            for j in failed[: self.config.max_failed]:
                for k, c in enumerate(lib):
                    if np.isnan(met[k, j]):
                        continue
                    f, n = w["kinds"].get(kind_of(c.id), (0, 0))
                    w["kinds"][kind_of(c.id)] = (f + int(met[k, j] < 0.5), n + 1)
        self.steps_seen += 1
        if self.steps_seen % self.config.update_every == 0:
            self._evolve(int(rollouts.step))
        shown, self._shown = self._shown, []
        return {
            "bank/size": float(sum(len(v) for v in self.bank.values())),
            "bank/dynamic": float(self.n_dynamic),
            "shown_per_task": float(np.mean(shown)) if shown else 0.0,
        }

    def _init_bank(self, judged) -> None:
        stats: dict[str, dict[str, list[int]]] = {}
        for task, lib, met in judged:
            per = stats.setdefault(category_of(task), {})
            for k, c in enumerate(lib):
                row = met[k][~np.isnan(met[k])]
                f, n = per.get(kind_of(c.id), (0, 0))
                per[kind_of(c.id)] = (f + int(np.sum(row < 0.5)), n + int(row.size))
        for cat in sorted(stats):
            rates = failure_rates(stats[cat])
            chosen = [k for k, r in rates if r >= self.config.min_fail][: self.config.init_skills]
            self.bank[cat] = [{"kind": k, "source": "init", "step": 1} for k in chosen]
            self._events.append({"event": "init", "category": cat, "kinds": chosen})
        self.initialized = True

    def _evolve(self, step: int) -> None:
        for cat in sorted(self.window):
            w = self.window[cat]
            if not w["total"]:
                continue
            rate = w["passed"] / w["total"]
            if rate >= self.config.threshold:
                continue
            have = {s["kind"] for s in self.bank.get(cat, [])}
            new = [k for k, r in failure_rates(w["kinds"]) if r > 0 and k not in have]
            new = new[: self.config.max_new]
            for k in new:
                self.n_dynamic += 1
                skill = {"kind": k, "source": f"dyn_{self.n_dynamic:03d}", "step": step}
                self.bank.setdefault(cat, []).append(skill)
            self._events.append(
                {"event": "evolve", "category": cat, "success": rate, "added": new, "step": step}
            )
        self.window = {}

    # ------------------------------------------------------------------ state

    def pop_events(self) -> list[dict[str, Any]]:
        out, self._events = self._events, []
        return out

    def state_dict(self) -> dict[str, Any]:
        window = {
            cat: {**w, "kinds": {k: list(v) for k, v in sorted(w["kinds"].items())}}
            for cat, w in sorted(self.window.items())
        }
        return {
            "bank": {k: [dict(s) for s in v] for k, v in sorted(self.bank.items())},
            "initialized": self.initialized,
            "window": window,
            "steps_seen": self.steps_seen,
            "n_dynamic": self.n_dynamic,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        self.bank = {k: [dict(s) for s in v] for k, v in state["bank"].items()}
        self.initialized = bool(state["initialized"])
        self.window = {
            cat: {**w, "kinds": {k: tuple(v) for k, v in w["kinds"].items()}}
            for cat, w in state["window"].items()
        }
        self.steps_seen = int(state["steps_seen"])
        self.n_dynamic = int(state["n_dynamic"])


def skillrl_controllers(config, domain) -> list[Controller]:
    """SkillRL's skill bank (``config.skillrl``, when the config has that section)."""
    if config.get("skillrl") is None:
        return []
    from rubric_rl.methods.harness_rl.style import style_for
    from rubric_rl.methods.method import from_section

    sc = from_section(SkillRLConfig, config, "skillrl")
    return [SkillRLController(sc, style_for(domain), domain.criteria_library)]


__all__ = [
    "skillrl_controllers",
    "SkillRLConfig",
    "SkillRLController",
    "category_of",
    "failure_rates",
    "kind_of",
]
