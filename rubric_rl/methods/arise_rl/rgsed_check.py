"""RG-SED's scripted-policy check: ARISE-RL's real controller, step pipeline and ``Services`` on
solver steps, with a stand-in policy whose memory effect is scripted (seconds, deterministic, no
model).

The stand-in (:class:`MemoryEffectEngine`): each task has M criteria, each a distinct word; a
rollout satisfies each criterion with probability ``p``, drawn from its sampling seed (so two
rollouts on the same seed draw the same uniforms: the paired samples of ``paired_seeds``). A
``<coach>`` block in the prompt that names k of the task's own criteria raises each of those k
probabilities by ``d·M/k``, so the expected satisfaction rate s (eq. 7, the unweighted mean)
rises by exactly ``d``; a memory naming none of them (the placebo arm's: another task's words)
changes nothing. The response spells the outcome (``yes`` / ``no`` per criterion, rubric order)
and :class:`ScriptedJudge` reads it back. Everything between — the pool draw, the coach, the
memory and placebo rollouts, Δr, the gate, the schedule, the teachers and each trajectory's
``sd_coef`` — is the real code.

``run_check(d, ...)`` runs ``steps`` solver steps and returns :class:`CheckResult`: the per-group
Δr of the real and the placebo arm, the step metrics, and each trajectory's λ with the Δr and
the schedule clock it was computed from. Ours throughout: the seed has no such check.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.rollout.scripted import ScriptedEngine, sample_rng
from rubric_rl.rubrics.judges import Judge, JudgeItem
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verdict

YES, NO = "yes", "no"
_COACH_RE = re.compile(r"<coach>(.*?)</coach>", re.DOTALL)
_NOTE_RE = re.compile(r"(?:^|;)\s*remember :\s*(.*?)\s*(?=;\s*remember :|$)", re.DOTALL)


def check_words(vocabulary: Sequence[str]) -> list[str]:
    """The words a check task's criteria can be: the domain vocabulary's lower-case alphabetic
    units (each one token of the embedded tokenizer), sorted, but the prompt's own ``list``."""
    return sorted({u for u in vocabulary if u.isalpha() and u.islower()} - {"list"})


def check_tasks(groups: int, criteria: int, words: Sequence[str]) -> list[Task]:
    """``groups`` tasks of ``criteria`` criteria, each criterion a distinct word of ``words``
    (so no memory of one task names a criterion of another); every second task's first
    criterion is a pitfall (weight −1: satisfied when absent)."""
    words = sorted(set(words))
    need = groups * criteria
    if need > len(words):
        raise ValueError(
            f"rgsed_check: {groups} tasks x {criteria} criteria need {need} distinct words; the "
            f"domain's vocabulary has {len(words)}"
        )
    tasks = []
    for g in range(groups):
        ws = words[g * criteria : (g + 1) * criteria]
        crits = tuple(
            Criterion(f"c{i}", w, -1.0 if (i == 0 and g % 2) else 1.0) for i, w in enumerate(ws)
        )
        tasks.append(
            Task(
                id=f"rgsed-check-{g:03d}",
                prompt=(Message("user", "list " + " , ".join(ws)),),
                rubric=Rubric(crits),
                domain="constraints",
            )
        )
    return tasks


def memory_notes(prompt_text: str) -> tuple[str, set[str]]:
    """(the prompt without its ``<coach>`` blocks, the notes those blocks hold)."""
    notes: set[str] = set()
    for block in _COACH_RE.findall(prompt_text):
        notes |= {n.strip() for n in _NOTE_RE.findall(block.strip()) if n.strip()}
    return _COACH_RE.sub(" ", prompt_text), notes


class MemoryEffectEngine(ScriptedEngine):
    """The stand-in policy (module docstring)."""

    def __init__(
        self, tok, tasks: Sequence[Task], *, d: float, p: float, hint: Callable[[str, float], str]
    ):
        super().__init__(tok)
        self.hint = hint  # how the coach states a criterion (the domain's ``style.hint``)
        self.d, self.p = float(d), float(p)
        self.tasks = list(tasks)
        self.requests: list[tuple[str, int, int, int]] = []  # id, step, task index, offset

    def _task(self, text: str) -> Task:
        words = set(text.split())
        hits = [t for t in self.tasks if {c.text for c in t.rubric.criteria} <= words]
        if len(hits) != 1:
            raise ValueError(f"MemoryEffectEngine: {len(hits)} tasks match prompt {text!r}")
        return hits[0]

    def probabilities(self, task: Task, notes: set[str]) -> np.ndarray:
        """Per criterion, P(satisfied) under a memory holding ``notes``."""
        crits = task.rubric.criteria
        named = np.array([self.hint(c.text, c.weight) in notes for c in crits])
        p = np.full(len(crits), self.p)
        if named.any():
            p = p + named * self.d * len(crits) / named.sum()
        if np.any(p > 1.0):
            raise ValueError(f"MemoryEffectEngine: p + d·M/k > 1 for task {task.id} ({p})")
        return p

    def record(self, request, prompt_text):
        self.requests.append(
            (request.request_id, request.step, request.task_index, request.sample_offset)
        )

    def reply(self, request, prompt_text, k):
        rest, notes = memory_notes(prompt_text)
        p = self.probabilities(self._task(rest), notes)
        sat = sample_rng(request, k).random(len(p)) < p  # the sample's own seed
        return " ".join(YES if s else NO for s in sat)


class ScriptedJudge(Judge):
    """Reads the stand-in's ``yes`` / ``no`` per criterion (rubric order) back into verdicts: a
    criterion is satisfied on ``yes`` (met for a positive one, absent for a pitfall)."""

    async def ascore(self, items: Sequence[JudgeItem]) -> list[list[Verdict]]:
        out = []
        for it in items:
            words = it.response.split()
            order = {c.id: i for i, c in enumerate(it.task.rubric.criteria)}
            row = []
            for c in it.criteria:
                sat = words[order[c.id]] == YES
                row.append(Verdict(c.id, sat if c.weight > 0 else not sat))
            out.append(row)
        return out


@dataclasses.dataclass
class CheckResult:
    """What ``run_check`` measured: per solver group of every step, its Δr (real and placebo,
    NaN where undefined), the step it ran at and its trajectories' λ; the step metrics."""

    delta_r: np.ndarray  # [steps · G]
    placebo: np.ndarray  # [steps · G]
    step: np.ndarray  # [steps · G]
    sd_coef: np.ndarray  # [steps · G, J] each trajectory's λ
    metrics: list[dict[str, float]]
    requests: list[tuple[str, int, int, int]]
    config: Any


def check_config(base: Any, groups: int, samples: int, steps: int, overrides: Mapping[str, Any]):
    """``base`` (configs/arise_rl.py's ``smoke`` config; the package never imports configs/) on
    solver steps only: ``groups`` tasks x ``samples`` rollouts a step, eq. 8 with α = 1 (r = s,
    so Δr is in s's units), no warm-up, the live policy, no base probe; ``overrides`` set
    ``config.arise_rl`` fields (e.g. the old defaults)."""
    c = copy.deepcopy(base)
    c.unlock()
    c.calibration.enabled = False
    c.rollout.update(tasks_per_step=groups, samples_per_task=samples)
    c.arise_rl.update(
        cycles=1, generator_steps=0, solver_steps=steps, pool_size=groups, pool_min=0, alpha=1.0,
        warmup_steps=0, base_probe_tasks=0, solver_policy="current", memory_rollouts=0,
    )  # fmt: skip
    c.arise_rl.update(dict(overrides))
    c.domain.update(n_train=16, n_heldout=8, n_ood=8)
    c.lock()
    return c


def run_check(
    d: float,
    base: Any,
    *,
    p: float = 0.5,
    groups: int = 16,
    criteria: int = 4,
    samples: int = 8,
    steps: int = 4,
    overrides: Mapping[str, Any] | None = None,
    workdir: str | None = None,
) -> CheckResult:
    """``steps`` solver steps of the real pipeline on ``groups`` distinct check tasks (the pool,
    drawn without replacement) with the stand-in's memory effect ``d`` (module docstring);
    ``base``: configs/arise_rl.py's ``smoke`` config (``check_config``)."""
    from rubric_rl.config import builders
    from rubric_rl.methods.arise_rl.arise_rl import AriseRLController
    from rubric_rl.services import Services
    from rubric_rl.step import StepContext

    config = check_config(base, groups, samples, steps, overrides or {})
    with (
        tempfile.TemporaryDirectory() if workdir is None else contextlib.nullcontext(workdir) as wd
    ):
        domain = builders.build_domain(config)
        tasks = check_tasks(groups, criteria, check_words(domain.vocabulary))
        tok = builders.build_tokenizer(config, domain, wd)
        # the stand-in's tasks have no domain verifier (the judge is the only reward)
        domain = dataclasses.replace(domain, verify=None)
        engine = MemoryEffectEngine(tok, tasks, d=d, p=p, hint=domain.style.hint)
        services = Services(
            config, engine, tok, ScriptedJudge(), domain, wd,
            functools.partial(builders.prompt_buckets, config),
        )  # fmt: skip
        controllers, pipeline = builders.build_method(config, domain)
        controllers.bind(services, f"{wd}/controllers")
        (ctl,) = [c for c in controllers.controllers if isinstance(c, AriseRLController)]
        ctl.pool, ctl.pool_cycle = list(tasks), 0
        dr, placebo, at, coefs, metrics = [], [], [], [], []
        try:
            for step in range(1, steps + 1):
                services.begin_step(step)
                ctx = StepContext(
                    step, config, np.random.default_rng([0, step]), services, controllers, domain
                )
                rollouts = pipeline(ctx)
                h = ctl.history[-1]
                dr += [np.nan if x is None else x for x in h["delta_r"]]
                placebo += [np.nan if x is None else x for x in h["placebo"]]
                at += [step] * len(rollouts.groups)
                coefs += [[t.sd_coef for t in g.trajectories] for g in rollouts.groups]
                metrics.append(dict(ctx.metrics))
        finally:
            engine.close()
    return CheckResult(
        np.asarray(dr, np.float64), np.asarray(placebo, np.float64), np.asarray(at),
        np.asarray(coefs, np.float64), metrics, list(engine.requests), config,
    )  # fmt: skip


def mean_se(x: np.ndarray) -> tuple[float, float]:
    """(mean, standard error) over the defined entries."""
    x = np.asarray(x, np.float64)
    x = x[~np.isnan(x)]
    if x.size < 2:
        return (float(x.mean()) if x.size else float("nan")), float("nan")
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size))


__all__ = [
    "CheckResult",
    "MemoryEffectEngine",
    "ScriptedJudge",
    "check_config",
    "check_tasks",
    "check_words",
    "mean_se",
    "memory_notes",
    "run_check",
]
