"""The HarnessRL controller: H_t = (task weights, per-task guidance fields, per-task weighted
criteria) evolving with the policy through memory, attributor, proposer and JIT critic (§2).

It is the step's sampler. Each step:

1. ``sample_tasks``: at the first step, the memory cold start (``cold_start``) sets the levels
   and bands (or the seed's values, ``harness.cold_start.tasks = 0``); the guidance cap of the
   step is enforced (fields over it are dropped by the schedule); tasks are drawn from Cat(p)
   with u = 1/(N p), each carrying its current harness rubric (so the judge stage scores S under
   c_t and the built-in ``rubric`` signal is the harness reward).
2. ``decorate``: the task's mounted fields after the prompt (``style.mount``).
3. ``observe``: per task (its first group of the step), the group's S and responses go to the
   memory's time index; the attributor labels every criterion from the group, the task's history
   and related criteria; the proposer makes one candidate or noop per interface; the critic
   measures rollout and rubric candidates on the current frozen policy (re-sampled groups through
   ``Services.generate`` on the ``harness_critic`` stream, which is never trained; re-grading the
   recorded group through ``Services.judge``, whose cache makes unchanged criteria free) and
   accepts within the bands; sampling candidates are accepted on their attribution. Accepted
   updates change H_{t+1}; every candidate, accepted or rejected, is recorded with its
   measurement (time index) and logged (``controllers/harness.jsonl``).

Ablations by flag: ``harness.critic=False`` accepts every candidate unmeasured (w/o critic);
``harness.memory="none"`` gives the attributor and proposer only the current group (w/o critic
& memory, with the critic off too); ``"task"`` keeps the per-task time index but no semantic
index (AMARIS++'s per-task revision log); ``harness.interfaces`` restricts the interfaces
(HarnessRL_g = rollout only, HarnessRL_c = rubric only).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, TaskBatch
from rubric_rl.methods.harness_rl import cold_start as cs
from rubric_rl.methods.harness_rl import evidence, evorubric
from rubric_rl.methods.harness_rl.attributor import (
    GENERIC_PROBES,
    LABELS,
    AttributorConfig,
    ProgrammaticAttributor,
    TaskAttribution,
    satisfied,
)
from rubric_rl.methods.harness_rl.critic import Band, Verdict, rollout_verdict, rubric_verdict
from rubric_rl.methods.harness_rl.interfaces import (
    draw_tasks,
    enforce_cap,
    guidance_cap,
    validate_levels,
)
from rubric_rl.methods.harness_rl.llm_evolver import LLMEvolverError
from rubric_rl.methods.harness_rl.proposer import (
    INTERFACES,
    Candidate,
    ProgrammaticProposer,
    ProposalContext,
    criterion_state,
    expected_gain,
)
from rubric_rl.methods.harness_rl.rubric_ops import (
    anchor_share_of,
    apply_ops,
    checks_the_same,
    criterion_json,
    rescale,
)
from rubric_rl.methods.harness_rl.sec import (
    SECBandit,
    SECConfig,
    arm_of,
    measure_pass_rates,
    pass_rate_bins,
)
from rubric_rl.methods.harness_rl.state import (
    TaskHarness,
    check_key,
    criterion_from_json,
    fields_after,
    mean_points,
    met_matrix,
    row_reward,
    same_state,
)
from rubric_rl.methods.harness_rl.style import GuidanceStyle
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.types import Criterion, Rubric, Task

CRITIC_STREAM = "harness_critic"
# A rollout candidate beyond the step's measurement budget is neither accepted nor rejected: it
# is not recorded (the proposer makes it again at the task's next draw), only counted.
DEFERRED = "deferred: over the step's measurement budget"
MEMORY_MODES = ("full", "task", "none")
# Switching arms (§3.2 RQ1): a published rule replaces the harness on one interface, with no
# attributor, proposer or critic there — SEC's difficulty bandit for p_t, RuscaRL's scheduled
# scaffold for g_t (a separate controller, rubric_rl/methods/harness_rl/ruscarl.py: the harness then
# mounts no field), EvoRubric's pruning and regeneration for c_t.
SAMPLING_RULES = ("harness", "sec")
ROLLOUT_RULES = ("harness", "ruscarl")
RUBRIC_RULES = ("harness", evorubric.RULE)
EVOLVERS = ("programmatic", "llm")
RECALIBRATE = ("quarter", "never")
MEASUREMENTS = ("paired", "unpaired")
# The paired rule's seed indices: one per (candidate, round) within a step, shared by the
# candidate's group and its control group.
PAIRED_STREAM = "harness_critic_paired"
REVERSAL_WINDOW = 100  # steps (the seed's reversal rate is per 100-step window)


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
    """The controller's settings, built from ``config.harness`` by ``builder.harness_config``:
    every field is required here, its one default is ``HarnessSection``'s (section.py)."""

    total_steps: int
    batch_size: int
    samples_per_task: int
    seed: int
    levels: tuple[float, ...]  # the seed's, until calibrated
    rollout_band: tuple[float, float]
    rubric_band: tuple[float, float]
    total_weight: float  # Λ
    interfaces: tuple[str, ...]
    critic: bool
    memory: str
    anchors: str  # library | none | seed
    retry_after: int  # draws of the task during which a rejected (op, target) is not retried
    max_rollout_measurements: int  # rollout candidates the critic re-samples per step
    cold_start_tasks: int  # 0: the seed's levels and bands
    cold_start_groups: int
    cold_start_regradings: int
    deterministic_floor: float
    band_floor: float  # points: a band's least lower bound and least width (ours)
    # "quarter" (ours): the bands are re-measured on the current policy at the start of each
    # training quarter (the levels stay); "never": the seed's bands, frozen at the cold start.
    recalibrate: str
    # "paired" (ours): a rollout candidate's group and the current harness's group re-sampled on
    # shared seeds, paired_samples (J') each; "unpaired": the seed's re-sampled group (J) against
    # the recorded one (critic.py).
    measurement: str
    paired_samples: int
    # The in-step proposer-critic loop (§1: rejected updates "return with their measurements to
    # the proposer"): a rollout candidate rejected on a measurement is re-proposed with that
    # (field, target) excluded, up to in_step_rounds proposals per task and step, within the
    # step's measurement budget. 1 = one proposal per draw.
    in_step_rounds: int
    attributor: AttributorConfig
    sampling_rule: str  # harness | sec (the p_t <- SEC switching arm)
    rollout_rule: str  # harness | ruscarl (the g_t <- RuscaRL switching arm)
    rubric_rule: str  # harness | evorubric (the c_t <- EvoRubric switching arm)
    sec: SECConfig
    evolver: str  # programmatic | llm (attributor and proposer via LLMClient)

    def __post_init__(self):
        validate_levels(self.levels)
        Band(*self.rollout_band)
        Band(*self.rubric_band)
        rules = {"sampling_rule": SAMPLING_RULES, "rollout_rule": ROLLOUT_RULES,
                 "rubric_rule": RUBRIC_RULES, "evolver": EVOLVERS}  # fmt: skip
        for field, allowed in rules.items():
            if getattr(self, field) not in allowed:
                raise ValueError(
                    f"harness.{field}={getattr(self, field)!r}: expected one of {allowed}"
                )
        if self.measurement not in MEASUREMENTS:
            raise ValueError(
                f"harness.measurement={self.measurement!r}: expected one of {MEASUREMENTS}"
            )
        if self.measurement == "paired" and self.paired_samples < 2:
            raise ValueError(f"harness.paired_samples={self.paired_samples}: must be >= 2")
        if self.in_step_rounds < 1:
            raise ValueError(f"harness.in_step_rounds={self.in_step_rounds}: must be >= 1")
        if self.recalibrate not in RECALIBRATE:
            raise ValueError(
                f"harness.recalibrate={self.recalibrate!r}: expected one of {RECALIBRATE}"
            )
        if not (self.band_floor >= 0 and math.isfinite(self.band_floor)):
            raise ValueError(f"harness.cold_start.band_floor={self.band_floor}: must be >= 0")
        if self.memory not in MEMORY_MODES:
            raise ValueError(f"harness.memory={self.memory!r}: expected one of {MEMORY_MODES}")
        if self.anchors not in ("library", "none", "seed"):
            raise ValueError(f"harness.anchors={self.anchors!r}: expected library, none or seed")
        bad = [i for i in self.interfaces if i not in INTERFACES]
        if bad or not self.interfaces:
            raise ValueError(
                f"harness.interfaces={self.interfaces}: a non-empty subset of {INTERFACES}"
            )
        if self.max_rollout_measurements < 0:
            raise ValueError(
                f"harness.max_rollout_measurements={self.max_rollout_measurements}: must be >= 0"
            )
        if self.total_weight <= 0:
            raise ValueError(f"harness.total_weight={self.total_weight}: Λ must be > 0")
        if self.cold_start_tasks and (self.cold_start_groups < 2 or self.cold_start_regradings < 2):
            raise ValueError("harness.cold_start: groups and regradings must be >= 2")


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _checks(criteria: Sequence[Criterion]) -> list[tuple]:
    """What a rubric checks and how much each check weighs (an op that leaves this unchanged is
    a no-op, whatever it records)."""
    return [(c.id, criterion_state(c), round(float(c.weight), 9)) for c in criteria]


class HarnessController(Controller):
    name = "harness"

    def __init__(
        self,
        tasks: Sequence[Task],
        config: HarnessConfig,
        style: GuidanceStyle,
        *,
        embedder_spec: str = "minilm",
        memory_floor: float | None = None,
        memory_top_k: int = 4,
        cache_key: str | None = None,
        cache_dir: str | None = None,
        llm_client=None,
        llm_max_failure_rate: float = 0.5,
    ):
        if not tasks:
            raise ValueError("harness: the training task bank is empty")
        self.tasks = tuple(tasks)
        self.index = {t.id: i for i, t in enumerate(self.tasks)}
        self.config = config
        self.style = style
        self.attributor = ProgrammaticAttributor(config.attributor, style.features)
        # The interfaces a switching rule owns get no proposer candidate.
        ruled = {"sampling": config.sampling_rule != "harness",
                 "rollout": config.rollout_rule != "harness",
                 "rubric": config.rubric_rule != "harness"}  # fmt: skip
        proposed = tuple(i for i in config.interfaces if not ruled.get(i, False))
        self.proposer = ProgrammaticProposer(
            hint=style.hint, reference=style.reference, critique=style.critique,
            library=style.library, interfaces=proposed,
        )  # fmt: skip
        self.llm = None
        if config.evolver == "llm":
            from rubric_rl.methods.harness_rl.llm_evolver import LLMAttributor, LLMProposer

            if llm_client is None:
                raise ValueError("harness.evolver='llm' needs an LLM client (harness.llm)")
            rate = llm_max_failure_rate
            self.attributor = LLMAttributor(llm_client, max_failure_rate=rate)
            self.proposer = LLMProposer(
                llm_client, interfaces=proposed, total=config.total_weight, max_failure_rate=rate
            )
            self.llm = (self.attributor, self.proposer)
        # p_t <- SEC: type x count arms now; pass-rate arms once measured (``_sec_bins``).
        self.sec: SECBandit | None = None
        self.sec_rates: dict[str, float | None] | None = None
        if config.sampling_rule == "sec" and config.sec.bins == "type_count":
            arms = [arm_of(t, config.sec.max_level) for t in self.tasks]
            self.sec = SECBandit(arms, config.sec, seed=config.seed)
        self.embedder_spec = embedder_spec
        self.memory_floor = memory_floor
        self.memory_top_k = memory_top_k
        self.cache_key = cache_key
        self.cache_dir = cache_dir
        self.memory = None
        self.levels = tuple(config.levels)
        self.rollout_band = Band(*config.rollout_band)
        self.rubric_band = Band(*config.rubric_band)
        # The paired rule's decision threshold (points; None: the band's lower bound decides).
        self.rollout_threshold: float | None = None
        self.calibrated: dict[str, Any] | None = None
        self.state: dict[str, TaskHarness] = {}
        self.last_label: dict[str, str] = {}  # "task/criterion" -> its latest label
        self.generic: dict[str, bool] = {}  # criterion check key -> passes on generic content
        self.accepted_log: dict[str, list[dict[str, Any]]] = {}  # task -> accepted rubric updates
        self.totals = {"accepted_rubric": 0, "reversals": 0}
        # task -> accepted updates awaiting the task's next draw, when their ``outcome`` (the
        # reward and the target's reach then) goes to the time index.
        self.pending_outcomes: dict[str, list[dict[str, Any]]] = {}
        self.reversal_log: list[list[int]] = []  # [step, reversal] of recent accepted rubric ones
        self._events: list[dict[str, Any]] = []
        # The step's attributions (analysis: the scripted-policy check scores them).
        self.last_attributions: list[TaskAttribution] = []

    # ------------------------------------------------------------------ setup

    def bind(self, services, run_dir):
        super().bind(services, run_dir)
        if self.config.memory != "none" and run_dir is not None and self.memory is None:
            from rubric_rl.memory.embedder import make_embedder
            from rubric_rl.memory.store import HarnessMemory

            self.memory = HarnessMemory(
                os.path.join(run_dir, "memory"),
                make_embedder(self.embedder_spec),
                top_k=self.memory_top_k,
                floor=self.memory_floor,
            )

    def rollback(self, step: int) -> None:
        if self.memory is not None:
            self.memory.rollback(step)

    def disk_records(self) -> dict[str, int]:
        if self.memory is None:
            return {}
        counts = self.memory.counts()  # flushes: the records of every step up to now
        return {f"memory {k}": counts[k] for k in ("time_records", "criterion_versions")}

    def _task_state(self, task: Task) -> TaskHarness:
        st = self.state.get(task.id)
        if st is None:
            seed = tuple(task.rubric.evaluated().criteria)
            crits = tuple(c.replace(anchor=self._is_anchor(task, c)) for c in seed)
            share = anchor_share_of(crits)
            crits = rescale(crits, total=self.config.total_weight, anchor_share=share)
            st = TaskHarness(crits, share)
            self.state[task.id] = st
        return st

    def _is_anchor(self, task: Task, c: Criterion) -> bool:
        """Anchors (ours for rule domains): seed criteria the checker library also derives from
        the prompt — requirements the task states, whose text the cold start fixes."""
        mode = self.config.anchors
        if mode == "none":
            return False
        if mode == "seed":
            return True
        if self.style.library is None:
            return False
        return any(checks_the_same(c, lib) for lib in self.style.library(task))

    def harness_task(self, task: Task) -> Task:
        """The task with its current harness rubric c_t."""
        st = self._task_state(task)
        return dataclasses.replace(task, rubric=Rubric(st.criteria, aggregation="weighted"))

    # ------------------------------------------------------------------ sampling + guidance

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch:
        if self.calibrated is None:
            self._cold_start()
        elif self._recalibration_due(step):
            self._recalibrate(step)
        cap = guidance_cap(step, self.config.total_steps)
        for tid, st in self.state.items():
            if st.fields:
                keep, dropped = enforce_cap({f: v for f, v in st.fields.items()}, cap)
                if dropped:
                    st.fields = dict(keep)
                    self._events.append(
                        {
                            "event": "schedule_drop",
                            "task_id": tid,
                            "fields": list(dropped),
                            "cap": cap,
                        }
                    )
        if self.config.sampling_rule == "sec" and self.sec is None:
            self._sec_bins()
        if self.sec is not None:  # p_t <- SEC: the bandit draws, no importance weight (SEC's)
            idx = self.sec.draw(self.config.batch_size, rng)
            u = np.ones(len(idx))
        else:
            level = np.array([self._level(t) for t in self.tasks])
            idx, u = draw_tasks(level, self.levels, self.config.batch_size, rng)
        return TaskBatch(tuple(self.harness_task(self.tasks[i]) for i in idx), u)

    def _level(self, task: Task) -> int:
        st = self.state.get(task.id)
        return 0 if st is None else st.level

    def decorate(self, tasks: Sequence[Task], prompts: Sequence[Any]) -> list:
        out = []
        for t, p in zip(tasks, prompts, strict=True):
            st = self.state.get(t.id)
            if st is None or not st.fields:
                out.append(list(p))
            else:
                out.append(self.style.mount(t, {f: v["text"] for f, v in st.fields.items()}))
        return out

    # ------------------------------------------------------------------ cold start

    def _cold_start(self) -> None:
        cfg = self.config
        if cfg.cold_start_tasks <= 0 or self.services is None:
            self.calibrated = {"source": "seed"}
            return
        cached = self._cold_start_cache()
        if cached is not None and os.path.exists(cached):
            with open(cached, encoding="utf-8") as f:
                self._apply_cold_start(json.load(f))
            return
        out = self._measure_cold_start()
        if cached is not None:
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            tmp = cached + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(out, f, sort_keys=True)
            os.replace(tmp, cached)
        self._apply_cold_start(out)

    def _measure_cold_start(self) -> dict[str, Any]:
        cfg = self.config
        return cs.run_cold_start(
            self.services, self.tasks, seed=cfg.seed, n_tasks=cfg.cold_start_tasks,
            groups=cfg.cold_start_groups, regradings=cfg.cold_start_regradings,
            samples_per_task=cfg.samples_per_task, deterministic_floor=cfg.deterministic_floor,
            band_floor=cfg.band_floor,
            paired_samples=cfg.paired_samples if cfg.measurement == "paired" else 0,
            placebo=lambda t: self.style.mount(t, {"criterion": cs.PLACEBO_TEXT}),
        )  # fmt: skip

    def _sec_bins(self, rates: Mapping[str, float | None] | None = None) -> None:
        """SEC's pass-rate arms: the warm-start policy's pass rates measured once on the
        training tasks (or ``rates``, from a checkpoint), binned by quantile."""
        cfg = self.config.sec
        if rates is None:
            if self.services is None:
                raise ValueError("harness.sec.bins='pass_rate': no Services to measure pass rates")
            rates = measure_pass_rates(
                self.services, self.tasks, samples=cfg.pass_rate_samples,
                n_tasks=cfg.pass_rate_tasks, seed=self.config.seed,
            )  # fmt: skip
        missing = [t.id for t in self.tasks if t.id not in rates]
        if missing:
            raise ValueError(f"SEC pass rates: no entry for task(s) {missing[:5]} (another bank?)")
        self.sec_rates = {t.id: rates[t.id] for t in self.tasks}
        arms = pass_rate_bins([self.sec_rates[t.id] for t in self.tasks], cfg.n_bins)
        self.sec = SECBandit(arms, cfg, seed=self.config.seed)
        sizes = {n: len(m) for n, m in zip(self.sec.names, self.sec.members, strict=True)}
        self._events.append({"event": "sec_bins", "arm_sizes": sizes})

    def _quarter(self, step: int) -> int:
        return min(3, max(0, (int(step) - 1) * 4 // int(self.config.total_steps)))

    def _recalibration_due(self, step: int) -> bool:
        cal = self.calibrated or {}
        return (
            self.config.recalibrate == "quarter"
            and self.config.critic  # the bands are the critic's
            and cal.get("source") == "cold_start"
            and self.services is not None
            and self._quarter(step) > int(cal.get("quarter", 0))
        )

    def _recalibrate(self, step: int) -> None:
        """The bands re-measured on the current policy (the cold start's procedure on the same
        tasks); the sampling levels stay, so the tasks' levels keep their meaning."""
        q = self._quarter(step)
        out = self._measure_cold_start()
        self.rollout_band = Band(*out["rollout_band"])
        self.rubric_band = Band(*out["rubric_band"])
        self.rollout_threshold = out.get("rollout_threshold")
        self.calibrated = {**out, "levels": list(self.levels), "quarter": q, "step": int(step)}
        self._events.append({"event": "recalibrate", **self.calibrated})

    def _cold_start_cache(self) -> str | None:
        if self.cache_dir and self.cache_key:
            return os.path.join(self.cache_dir, self.cache_key, "cold_start.json")
        if self.run_dir:
            return os.path.join(self.run_dir, "cold_start.json")
        return None

    def _apply_cold_start(self, cal: Mapping[str, Any]) -> None:
        self.levels = validate_levels(cal["levels"], "cold start levels")
        self.rollout_band = Band(*cal["rollout_band"])
        self.rubric_band = Band(*cal["rubric_band"])
        self.rollout_threshold = cal.get("rollout_threshold")
        self.calibrated = dict(cal)
        self._events.append({"event": "cold_start", **self.calibrated})

    # ------------------------------------------------------------------ observe

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        step = int(rollouts.step)
        times = {"attributor_proposer": 0.0, "critic": 0.0, "memory": 0.0}
        scores = rollouts.scores
        rewards = rollouts.signal("rubric")
        seen: set[str] = set()
        records, label_rows, work = [], [], []
        ctxs: dict[str, ProposalContext] = {}  # the proposal context of each task, for retries
        not_attributed = 0  # tasks whose LLM attribution failed this step
        sec_metrics = self._update_sec(rollouts) if self.sec is not None else {}
        self.last_attributions = []
        todo = []  # (group index, its task's state, criterion ids, their texts): first draws
        for g, group in enumerate(rollouts.groups):
            if group.task.id in seen or group.task.id not in self.index:
                continue
            seen.add(group.task.id)
            st = self._task_state(group.task)
            crit = {c.id: c for c in st.criteria}
            ids = list(scores.criterion_ids[g])
            todo.append((g, st, ids, [crit[i].text if i in crit else i for i in ids]))
        t0 = time.perf_counter()
        # The step's memory reads, batched: one search over every criterion text and one
        # history read for the step's tasks and their neighbours.
        related, history_cache = evidence.prefetch(
            self.memory, [(rollouts.groups[g].task.id, texts) for g, _, _, texts in todo],
            semantic=self.config.memory == "full",
        )  # fmt: skip
        times["memory"] += time.perf_counter() - t0
        for g, st, ids, texts in todo:
            group = rollouts.groups[g]
            task = group.task
            st.draws += 1
            st.criteria_before_step = st.criteria
            k, j = len(ids), len(group.trajectories)
            met = np.where(scores.valid[g, :k, :j], scores.met[g, :k, :j], np.nan)
            crit = {c.id: c for c in st.criteria}
            weights = [crit[i].weight if i in crit else 1.0 for i in ids]
            responses = tuple(t.response for t in group.trajectories)
            reward_now = mean_points(rewards[g, :j].tolist())
            records += self._outcomes(task.id, ids, weights, met, reward_now)
            t0 = time.perf_counter()
            ev = evidence.gather(
                self.memory, task.id, ids, last_label=self.last_label, draws=st.draws,
                retry_after=self.config.retry_after, cache=history_cache,
                related=None if related is None else related[task.id],
            )  # fmt: skip
            times["memory"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            generic = self._generic_pass(task, st.criteria)
            nxt = self.levels[st.level + 1] if st.level + 1 < len(self.levels) else None
            group_record = (task.id, "group", {
                "criterion_ids": ids, "weights": weights,
                "met": [[None if math.isnan(x) else float(x) for x in row] for row in met],
                "responses": list(responses), "reward_points": reward_now,
                "fields": sorted(st.fields), "level": st.level,
            })  # fmt: skip
            seeded = {"seed": step} if self.llm is not None else {}
            try:
                att = self.attributor.attribute(
                    task.id, ids, weights, texts, met, responses, history=ev.history,
                    past_labels=ev.past_labels, related=ev.related, generic_pass=generic,
                    next_level=nxt, **seeded,
                )  # fmt: skip
            except LLMEvolverError as e:
                # Recorded as a failure: no labels and no candidates for the task this step.
                not_attributed += 1
                self._events.append({"event": "attributor_failed", "task_id": task.id,
                                     "error": str(e)})  # fmt: skip
                records.append(group_record)
                times["attributor_proposer"] += time.perf_counter() - t0
                continue
            sat = satisfied(met, weights)
            # The reversal guard reads what the critic accepted; with no critic there is none
            # (so the no-critic arms can show the reversals the seed reports for them).
            guard = self.config.memory != "none" and self.config.critic
            replaced = self._replaced(task.id) if guard else {}
            ctx = ProposalContext(
                task=task, criteria=st.criteria, fields=st.fields, level=st.level,
                n_levels=len(self.levels), cap=guidance_cap(step, self.config.total_steps),
                responses=responses,
                satisfied={i: tuple(float(x) for x in sat[m]) for m, i in enumerate(ids)},
                rejected=ev.rejected,
                replaced=replaced,
                donors=ev.donors, generic_pass=generic, min_points=self.rollout_band.lower,
                fits=self._fits(task),
            )  # fmt: skip
            cands = self.proposer.propose(ctx, att, **seeded)
            ctxs[task.id] = ctx
            if self.config.rubric_rule == evorubric.RULE and "rubric" in self.config.interfaces:
                cands = {**cands, "rubric": self._evorubric(task, st, ids, met, responses)}
            self.last_attributions.append(att)
            times["attributor_proposer"] += time.perf_counter() - t0
            baseline = group_record[2]["reward_points"]
            work.append((task, st, att, cands, responses, baseline))
            records.append(group_record)
            label_rows.append(
                (task.id, "labels", {c.criterion_id: c.to_json() for c in att.labels})
            )
            for c in att.labels:
                self.last_label[f"{task.id}/{c.criterion_id}"] = c.label
        # The fields this step's groups were rolled out with (before this step's updates).
        mounted = [len(st.fields) for _, st, *_ in work]
        # Over the drawn tasks seen before (a first draw cannot carry a field yet).
        repeat = [len(st.fields) > 0 for _, st, *_ in work if st.draws > 1]
        guidance_tokens = self._guidance_tokens(rollouts)
        t0 = time.perf_counter()
        verdicts = self._critic(step, work)
        times["critic"] += time.perf_counter() - t0
        update_rows = self._apply(step, work, verdicts)
        t0 = time.perf_counter()
        retry_rows = self._in_step_rounds(step, work, verdicts, ctxs, seeded)
        update_rows += retry_rows
        times["critic"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        if self.memory is not None:
            self.memory.record_many(step, records + label_rows + update_rows)
            self._index_criteria(step, [w[0] for w in work])
        times["memory"] += time.perf_counter() - t0
        metrics = self._metrics(work, verdicts, times, mounted, not_attributed)
        if self.config.in_step_rounds > 1:
            metrics["updates/rollout/in_step_proposed"] = float(len(retry_rows))
            metrics["updates/rollout/in_step_accepted"] = float(
                sum(r["status"] == "accepted" for _, _, r in retry_rows)
            )
        if repeat:
            metrics["guidance/repeat_draw_guided_share"] = float(np.mean(repeat))
        metrics.update(self._reversal_window(step, update_rows))
        return {**metrics, **sec_metrics, **guidance_tokens}

    def _in_step_rounds(self, step, work, verdicts, ctxs, seeded) -> list[tuple[str, str, dict]]:
        """Rounds 2.. of the proposer-critic loop: each rollout candidate rejected on a
        measurement goes back to the proposer with its (field, target) pairs excluded; the next
        candidate is measured within the step's remaining budget and applied as round 1's."""
        if self.config.in_step_rounds <= 1 or not self.config.critic:
            return []
        measured = sum(
            1 for (_, i), v in verdicts.items() if i == "rollout" and v.reason != DEFERRED
        )
        budget = self.config.max_rollout_measurements - measured
        last = [(w, verdicts.get((w[0].id, "rollout"))) for w in work]
        rows: list[tuple[str, str, dict]] = []
        for round_ in range(2, self.config.in_step_rounds + 1):
            again = []
            for (task, st, att, cands, responses, baseline), v in last:
                c = cands.get("rollout")
                if c is None or v is None or v.accepted or v.delta is None or c.drop_only:
                    continue
                tried = {(g.field, g.target) for g in c.guidance if g.op == "add"}
                ctx = dataclasses.replace(
                    ctxs[task.id], criteria=st.criteria, fields=st.fields,
                    rejected=ctxs[task.id].rejected | tried,
                )  # fmt: skip
                ctxs[task.id] = ctx
                new = self.proposer.propose(ctx, att, **seeded).get("rollout")
                if new is not None and not new.drop_only:
                    again.append((task, st, att, {"rollout": new}, responses, baseline))
            again = again[: max(0, budget)]
            if not again:
                break
            v_round = self._critic(step, again)
            budget -= sum(1 for v in v_round.values() if v.reason != DEFERRED)
            rows += self._apply(step, again, v_round, round_=round_)
            last = [(w, v_round.get((w[0].id, "rollout"))) for w in again]
        return rows

    def _reversal_window(self, step: int, update_rows) -> dict[str, float]:
        """The reversal rate over the last ``REVERSAL_WINDOW`` steps' accepted rubric updates (the
        seed's per-window rate; ``reversal_rate`` is the run's cumulative one)."""
        for _, _, row in update_rows:
            if row["status"] == "accepted" and row["candidate"]["interface"] == "rubric":
                self.reversal_log.append([step, int(bool(row.get("reversal")))])
        self.reversal_log = [x for x in self.reversal_log if x[0] > step - REVERSAL_WINDOW]
        if not self.reversal_log:
            return {}
        return {"reversal_rate_window": float(np.mean([x[1] for x in self.reversal_log]))}

    def _outcomes(self, task_id, ids, weights, met, reward_now) -> list[tuple[str, str, dict]]:
        """The ``outcome`` records of the task's updates accepted at its previous draw: the
        group's reward and the target's reach now, beside those at acceptance."""
        rows = []
        sat = satisfied(met, weights) if len(ids) else np.zeros((0, 0))
        for p in self.pending_outcomes.pop(task_id, []):
            reach = None
            if p["target"] in ids:
                row = sat[ids.index(p["target"])]
                reach = _finite(float(np.nanmean(row))) if np.isfinite(row).any() else None
            then = p["reward_points_then"]
            change = None if then is None or reward_now is None else reward_now - then
            rows.append((task_id, "outcome", {
                **p, "reward_points_now": reward_now, "reward_change": change,
                "target_reach_now": reach,
            }))  # fmt: skip
        return rows

    def _guidance_tokens(self, rollouts: Rollouts) -> dict[str, float]:
        """The guided rollouts' extra cost, bounded: the share of the step's prompt tokens that
        the mounted fields add (prompt tokens are prefilled, not decoded, so the share of
        generation time is lower)."""
        if self.services is None:
            return {}
        total = extra = 0
        for g in rollouts.groups:
            n = len(g.prompt_ids) * len(g.trajectories)
            total += n
            if g.prompt is not None and list(g.prompt) != g.task.messages:
                base = self.services.encode_prompt(g.task.messages, f"task {g.task.id}")
                extra += (len(g.prompt_ids) - len(base)) * len(g.trajectories)
        return {"guidance/prompt_token_share": extra / total} if total else {}

    def _update_sec(self, rollouts: Rollouts) -> dict[str, float]:
        """SEC's TD(0) update from the step's trained advantages (every group of the step)."""
        self.sec.observe(rollouts, self.index)
        return self.sec.metrics(prefix="sec/")

    def _evorubric(self, task, st, ids, met, responses) -> Candidate | None:
        """c_t <- EvoRubric: prune the group's zero-variance criteria, regenerate one verified
        library criterion (``evorubric.py``)."""
        prune = evorubric.prune_ops(st.criteria, met, ids)
        gone = {op.targets[0] for op in prune}
        crit = {c.id: c for c in st.criteria}
        rows = [k for k, cid in enumerate(ids) if cid in crit and cid not in gone]
        w = np.array([crit[ids[k]].weight for k in rows], np.float64)
        pos = float(np.maximum(w, 0.0).sum())
        if rows and pos > 0:
            rest = (w[:, None] * met[rows]).sum(axis=0) / pos  # NaN where a verdict failed
        else:
            rest = np.full(len(responses), np.nan)

        def judge_new(crits):
            return met_matrix(crits, self.services.judge([task], [list(responses)], [crits])[0])

        new = []
        if self.services is not None:
            kept = [c for c in st.criteria if c.id not in gone]
            new = evorubric.regenerate(task, kept, rest, self.style.library, judge_new)
        return evorubric.candidate(task, st.criteria, prune, new)

    def _generic_pass(self, task: Task, crits: Sequence[Criterion]) -> dict[str, bool]:
        """Whether a content-free response (``GENERIC_PROBES``) satisfies each criterion."""
        todo = [c for c in crits if check_key(c) not in self.generic]
        if todo and self.services is not None:
            vs = self.services.judge(
                [task], [list(GENERIC_PROBES)], [todo], check_failure_rate=False
            )
            for i, c in enumerate(todo):
                ok = [v[i].met for v in vs[0] if v[i].met is not None]
                self.generic[check_key(c)] = any((m if c.weight > 0 else not m) for m in ok)
        return {c.id: self.generic.get(check_key(c), False) for c in crits}

    def _replaced(self, task_id: str) -> dict[str, frozenset]:
        """Per criterion, the states accepted updates replaced within the task's previous two
        draws (a proposal restoring one would reverse an update)."""
        st = self.state.get(task_id)
        out: dict[str, set] = {}
        for upd in self.accepted_log.get(task_id, []):
            if st is not None and st.draws - upd["draw"] > 2:
                continue
            for cid, before in upd["before"].items():
                if before is not None:
                    out.setdefault(cid, set()).add(criterion_state(criterion_from_json(before)))
        return {k: frozenset(v) for k, v in out.items()}

    # ------------------------------------------------------------------ critic

    def _critic(self, step: int, work) -> dict[tuple[str, str], Verdict]:
        out: dict[tuple[str, str], Verdict] = {}
        rollout_todo = []
        for task, st, att, cands, responses, baseline in work:
            c = cands.get("sampling")
            if c is not None:
                out[(task.id, "sampling")] = Verdict(True, None, "accepted on its attribution")
            c = cands.get("rollout")
            if c is not None:
                fields = {f: v["text"] for f, v in fields_after(st.fields, c).items()}
                too_long = self._prompt_error(task, fields)
                if too_long is not None:
                    # Applied, it would break every later generation of the task: rejected
                    # alone, with or without a critic.
                    out[(task.id, "rollout")] = Verdict(False, None, f"invalid: {too_long}")
                elif not self.config.critic:
                    out[(task.id, "rollout")] = Verdict(True, None, "no critic")
                else:
                    rollout_todo.append((task, st, c, baseline, self._priority(st, att, c)))
            c = cands.get("rubric")
            if c is not None:
                invalid = self._invalid_rubric(step, st, c)
                if invalid is not None:
                    # Unmeasured acceptance still needs an applicable edit: an invalid one (an id
                    # already in the rubric, an anchor touched) is rejected, never raised.
                    out[(task.id, "rubric")] = Verdict(False, None, invalid)
                elif c.label == evorubric.RULE:
                    out[(task.id, "rubric")] = Verdict(True, None, "switching rule: no critic")
                elif not self.config.critic:
                    out[(task.id, "rubric")] = Verdict(True, None, "no critic")
                else:
                    out[(task.id, "rubric")] = self._measure_rubric(
                        step, task, st, c, responses, baseline
                    )
        # Re-sampled groups, most confident first (then by expected gain), up to the per-step
        # budget; one engine call, or one per candidate if it fails, so that a failure rejects
        # only the candidate that caused it.
        rollout_todo.sort(key=lambda x: x[-1])
        rollout_todo = [x[:4] for x in rollout_todo[: self.config.max_rollout_measurements]]
        results: list[Any] = []
        if rollout_todo:
            try:
                results = self._measure_rollout(rollout_todo)
            except Exception as e:  # noqa: BLE001 - no measurement rejects (§3)
                results = [e] if len(rollout_todo) == 1 else [
                    self._resample_one(x) for x in rollout_todo
                ]  # fmt: skip
            for (task, _, c, baseline), res in zip(rollout_todo, results, strict=True):
                if isinstance(res, Exception):
                    out[(task.id, "rollout")] = Verdict(False, None, f"no measurement: {res!r}")
                    continue
                if self.config.measurement == "paired":
                    delta = res  # the candidate's group − the current harness's, paired
                    threshold = self.rollout_threshold
                else:
                    delta = None if res is None or baseline is None else res - baseline
                    threshold = None
                out[(task.id, "rollout")] = rollout_verdict(
                    delta, self.rollout_band, drop_only=c.drop_only, threshold=threshold
                )
        for task, _, _, cands, _, _ in work:
            if cands.get("rollout") is not None and (task.id, "rollout") not in out:
                out[(task.id, "rollout")] = Verdict(False, None, DEFERRED)
        return out

    def _measure_rollout(self, todo) -> list[float | None]:
        """Per candidate: the paired Δ (points), or the unpaired rule's re-sampled mean."""
        if self.config.measurement == "paired":
            return self._resample_paired(todo)
        return self._resample(todo)

    def _resample_paired(self, todo) -> list[float | None]:
        """Δ = mean reward of J' samples with each candidate's fields − that of J' samples with
        the task's current fields, sample j of both on one seed (points, current rubric)."""
        from rubric_rl.services import stream_base

        control, treated = [], []
        for task, st, c, _ in todo:
            now = {f: v["text"] for f, v in st.fields.items()}
            after = {f: v["text"] for f, v in fields_after(st.fields, c).items()}
            control.append(self.style.mount(task, now) if now else task.messages)
            treated.append(self.style.mount(task, after) if after else task.messages)
        base = stream_base(PAIRED_STREAM)
        seeds = [base + self.index[task.id] for task, *_ in todo]
        names = [t.id for t, *_ in todo]
        _, trajs = self.services.generate(
            control + treated, self.config.paired_samples, stream=CRITIC_STREAM,
            names=names + names, seed_indices=seeds + seeds,
        )  # fmt: skip
        tasks = [self.harness_task(t) for t, *_ in todo]
        vs = self.services.judge(tasks + tasks, [[x.response for x in ts] for ts in trajs])
        means = [
            mean_points([row_reward(t.rubric.criteria, row) for row in rows])
            for t, rows in zip(tasks + tasks, vs, strict=True)
        ]
        n = len(todo)
        return [
            None if a is None or b is None else b - a
            for a, b in zip(means[:n], means[n:], strict=True)
        ]

    def _resample(self, todo) -> list[float | None]:
        """The mean reward (points) of a group re-sampled with each candidate's fields, under the
        task's current rubric; raises if generation or judging fails."""
        prompts = []
        for task, st, c, _ in todo:
            fields = fields_after(st.fields, c)
            prompts.append(self.style.mount(task, {f: v["text"] for f, v in fields.items()}))
        _, trajs = self.services.generate(
            prompts, self.config.samples_per_task, stream=CRITIC_STREAM,
            names=[t.id for t, *_ in todo],
        )  # fmt: skip
        tasks = [self.harness_task(t) for t, *_ in todo]
        vs = self.services.judge(tasks, [[x.response for x in ts] for ts in trajs])
        return [
            mean_points([row_reward(t.rubric.criteria, row) for row in rows])
            for t, rows in zip(tasks, vs, strict=True)
        ]

    def _resample_one(self, item) -> float | None | Exception:
        try:
            return self._measure_rollout([item])[0]
        except Exception as e:  # noqa: BLE001 - no measurement rejects this candidate only
            return e

    def _priority(self, st: TaskHarness, att: TaskAttribution | None, c: Candidate) -> tuple:
        """The measurement budget's order: the target's label confidence, then its expected gain
        (weight × (1 − reach)), highest first; drops (no blind target) last among equals."""
        lab = None if att is None else next(
            (x for x in att.labels if x.criterion_id == c.target), None
        )  # fmt: skip
        crit = next((x for x in st.criteria if x.id == c.target), None)
        conf = 0.0 if lab is None else lab.confidence
        gain = 0.0
        if lab is not None and crit is not None:
            gain = expected_gain(crit.weight, lab.satisfied_rate)
        return (-conf, -gain)

    def _fits(self, task: Task):
        """Whether ``task``'s prompt with mounted fields fits ``model.max_prompt_len`` (None: no
        services to encode with)."""
        if self.services is None:
            return None
        return lambda fields: self._prompt_error(task, fields) is None

    def _prompt_error(self, task: Task, fields: Mapping[str, str]) -> str | None:
        if self.services is None or not fields:
            return None
        try:
            self.services.encode_prompt(self.style.mount(task, dict(fields)), f"task {task.id}")
        except ValueError as e:
            return str(e)
        return None

    def _invalid_rubric(self, step: int, st: TaskHarness, cand: Candidate) -> str | None:
        """Why ``cand``'s ops cannot apply to the task's rubric (None: they apply)."""
        try:
            new = apply_ops(
                st.criteria, cand.rubric, step=step, total=self.config.total_weight,
                anchor_share=st.anchor_share,
            )  # fmt: skip
        except (ValueError, KeyError) as e:
            return f"invalid: {e}"
        if _checks(new) == _checks(st.criteria):
            return "invalid: no change after the Λ rescale"
        return None

    def _measure_rubric(self, step, task, st, cand: Candidate, responses, baseline) -> Verdict:
        try:
            new = apply_ops(
                st.criteria, cand.rubric, step=step, total=self.config.total_weight,
                anchor_share=st.anchor_share,
            )  # fmt: skip
        except (ValueError, KeyError) as e:
            return Verdict(False, None, f"invalid: {e}")
        try:
            rows = self.services.judge([task], [list(responses)], [new])[0]
        except Exception as e:  # noqa: BLE001 - no measurement rejects (§3)
            return Verdict(False, None, f"no measurement: {e!r}")
        after = mean_points([row_reward(new, row) for row in rows])
        delta = None if after is None or baseline is None else after - baseline
        return rubric_verdict(delta, self.rubric_band)

    # ------------------------------------------------------------------ apply

    def _apply(self, step: int, work, verdicts, round_: int = 1) -> list[tuple[str, str, dict]]:
        rows = []
        for task, st, att, cands, _, baseline in work:
            for iface in INTERFACES:
                c = cands.get(iface)
                if c is None:
                    continue
                v = verdicts.get((task.id, iface), Verdict(False, None, "no measurement"))
                if v.reason == DEFERRED:
                    continue
                row = {
                    "status": "accepted" if v.accepted else "rejected",
                    "candidate": c.to_json(), "verdict": v.to_json(), "draw": st.draws,
                    "critic": self.config.critic,
                }  # fmt: skip
                if round_ > 1:
                    row["round"] = round_  # the in-step loop's retry
                if v.accepted:
                    row.update(self._accept(step, task, st, c))
                    lab = None if att is None else next(
                        (x for x in att.labels if x.criterion_id == c.target), None
                    )  # fmt: skip
                    self.pending_outcomes.setdefault(task.id, []).append({
                        "update_step": step, "interface": iface, "kind": c.kind,
                        "target": c.target, "measured_delta": v.delta,
                        "reward_points_then": baseline,
                        "target_reach_then": None if lab is None else _finite(lab.satisfied_rate),
                    })  # fmt: skip
                rows.append((task.id, "update", row))
                self._events.append({"event": "update", "task_id": task.id, **row})
        return rows

    def _accept(self, step: int, task: Task, st: TaskHarness, c: Candidate) -> dict[str, Any]:
        if c.interface == "sampling":
            before = st.level
            st.level = int(c.level)
            return {"level": [before, st.level]}
        if c.interface == "rollout":
            st.fields = fields_after(st.fields, c, step)
            return {"fields": sorted(st.fields)}
        before = {x.id: x for x in st.criteria}
        new = apply_ops(
            st.criteria, c.rubric, step=step, total=self.config.total_weight,
            anchor_share=st.anchor_share,
        )  # fmt: skip
        after = {x.id: x for x in new}
        touched = sorted(
            {t for op in c.rubric for t in op.targets} | {n.id for op in c.rubric for n in op.new}
        )
        change = {
            "draw": st.draws,
            "before": {i: (criterion_json(before[i]) if i in before else None) for i in touched},
            "after": {i: (criterion_json(after[i]) if i in after else None) for i in touched},
        }
        reversal = self._is_reversal(task.id, change)
        self.accepted_log.setdefault(task.id, []).append(change)
        self.totals["accepted_rubric"] += 1
        self.totals["reversals"] += int(reversal)
        st.criteria = new
        return {"reversal": reversal, "criteria": [criterion_json(x) for x in new]}

    def _is_reversal(self, task_id: str, change: Mapping[str, Any]) -> bool:
        """An accepted update that undoes an earlier same-criterion update within the task's
        previous two draws (§3.2 RQ2): for a criterion both touched, it restores the state (or
        the absence) the earlier update had replaced."""
        for old in self.accepted_log.get(task_id, []):
            if change["draw"] - old["draw"] > 2:
                continue
            for cid, now in change["after"].items():
                if cid not in old["before"]:
                    continue
                prev, then = old["before"][cid], old["after"].get(cid)
                if not same_state(prev, then) and same_state(now, prev):
                    return True
        return False

    def _index_criteria(self, step: int, tasks: Sequence[Task]) -> None:
        from rubric_rl.memory.store import CriterionEntry

        entries = []
        for t in tasks:
            st = self.state[t.id]
            live = {c.id for c in st.criteria}
            for c in st.criteria:
                entries.append(CriterionEntry(t.id, c.id, c.text, weight=c.weight, anchor=c.anchor))
            for upd in self.accepted_log.get(t.id, []):
                for cid, after in upd["after"].items():
                    if after is None and cid not in live and upd["before"].get(cid):
                        b = upd["before"][cid]
                        entries.append(CriterionEntry(t.id, cid, b["text"], deleted=True))
        self.memory.index_criteria(step, entries)

    # ------------------------------------------------------------------ metrics

    def _metrics(self, work, verdicts, times, mounted=(), not_attributed=0) -> dict[str, float]:
        m: dict[str, float] = {}
        labels = [c.label for _, _, att, *_ in work for c in att.labels]
        for lab in LABELS:
            m[f"labels/{lab}"] = labels.count(lab) / len(labels) if labels else 0.0
        for iface in INTERFACES:
            cands = [(t.id, c[iface]) for t, _, _, c, *_ in work if c.get(iface) is not None]
            deferred = [tid for tid, _ in cands if verdicts[(tid, iface)].reason == DEFERRED]
            cands = [(tid, c) for tid, c in cands if tid not in deferred]
            acc = [verdicts[(tid, iface)].accepted for tid, _ in cands]
            m[f"updates/{iface}/deferred"] = float(len(deferred))
            m[f"updates/{iface}/proposed"] = float(len(cands))
            m[f"updates/{iface}/accepted"] = float(sum(acc))
            m[f"updates/{iface}/rejected"] = float(len(acc) - sum(acc))
        measured = {k for k, v in verdicts.items() if v.reason != DEFERRED}
        grounded = [
            verdicts[(t.id, i)].accepted
            for t, _, _, c, *_ in work for i in ("rollout", "rubric")
            if c.get(i) is not None and c[i].grounded and (t.id, i) in measured
        ]  # fmt: skip
        plain = [
            verdicts[(t.id, i)].accepted
            for t, _, _, c, *_ in work for i in ("rollout", "rubric")
            if c.get(i) is not None and not c[i].grounded and (t.id, i) in measured
        ]  # fmt: skip
        if grounded:
            m["critic/accept_rate_with_evidence"] = float(np.mean(grounded))
        if plain:
            m["critic/accept_rate_without_evidence"] = float(np.mean(plain))
        n_fields = [len(self.state[t.id].fields) if t.id in self.state else 0 for t in self.tasks]
        m["guidance/fields_per_task"] = float(np.mean(n_fields))
        m["guidance/unguided_share"] = float(np.mean([n == 0 for n in n_fields]))
        if mounted:
            # Over the step's drawn tasks (the bank-wide share above counts never-drawn tasks).
            m["guidance/drawn_fields_per_task"] = float(np.mean(mounted))
            m["guidance/drawn_unguided_share"] = float(np.mean([n == 0 for n in mounted]))
        for lv in range(len(self.levels)):
            m[f"levels/{lv}"] = float(np.mean([self._level(t) == lv for t in self.tasks]))
        m["reversal_rate"] = self.totals["reversals"] / max(1, self.totals["accepted_rubric"])
        m["critic/rollout_band_lower"] = self.rollout_band.lower
        m["critic/rollout_band_upper"] = self.rollout_band.upper
        if self.rollout_threshold is not None:
            m["critic/rollout_threshold"] = float(self.rollout_threshold)
        power = (self.calibrated or {}).get("rollout_power") or {}
        for k in ("at_lower", "at_zero"):
            if k in power:
                m[f"critic/rollout_power_{k}"] = float(power[k])
        m["task_saturated"] = (
            float(np.mean([att.task_saturated for _, _, att, *_ in work])) if work else 0.0
        )
        for k, v in times.items():
            m[f"time/{k}"] = v
        if self.llm is not None:
            m["attributor/not_attributed"] = float(not_attributed)
            for who, caller in zip(("attributor", "proposer"), self.llm, strict=True):
                for k, v in caller.stats().items():
                    m[f"llm/{who}/{k}"] = float(v)
        return m

    def pop_events(self) -> list[dict[str, Any]]:
        out, self._events = self._events, []
        return out

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        if self.memory is not None:
            self.memory.flush()  # a checkpoint never precedes its step's memory records
        return {
            "levels": list(self.levels),
            "rollout_band": [self.rollout_band.lower, self.rollout_band.upper],
            "rubric_band": [self.rubric_band.lower, self.rubric_band.upper],
            "rollout_threshold": self.rollout_threshold,
            "calibrated": self.calibrated,
            "tasks": {
                tid: {
                    "criteria": [criterion_json(c) for c in st.criteria],
                    "anchor_share": st.anchor_share, "level": st.level,
                    "fields": st.fields, "draws": st.draws,
                }
                for tid, st in sorted(self.state.items())
            },
            "last_label": dict(sorted(self.last_label.items())),
            "generic": dict(sorted(self.generic.items())),
            "accepted_log": self.accepted_log,
            "totals": dict(self.totals),
            "pending_outcomes": self.pending_outcomes,
            "reversal_log": self.reversal_log,
            "sec": (
                None
                if self.sec is None
                else {**self.sec.state_dict(), "pass_rates": self.sec_rates}
                if self.sec_rates is not None
                else self.sec.state_dict()
            ),
            # The LLM evolver's counts and failure-rate windows (none for the programmatic one).
            "llm": {c.role: c.state_dict() for c in self.llm} if self.llm else {},
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        self.levels = validate_levels(state["levels"], "checkpoint harness levels")
        self.rollout_band = Band(*state["rollout_band"])
        self.rubric_band = Band(*state["rubric_band"])
        self.rollout_threshold = state.get("rollout_threshold")
        self.calibrated = state.get("calibrated")
        self.state = {
            tid: TaskHarness(
                criteria=tuple(criterion_from_json(c) for c in d["criteria"]),
                anchor_share=float(d["anchor_share"]), level=int(d["level"]),
                fields={k: dict(v) for k, v in d["fields"].items()}, draws=int(d["draws"]),
            )
            for tid, d in state["tasks"].items()
        }  # fmt: skip
        self.last_label = dict(state["last_label"])
        self.generic = {k: bool(v) for k, v in state["generic"].items()}
        self.accepted_log = {k: list(v) for k, v in state["accepted_log"].items()}
        self.totals = dict(state["totals"])
        self.pending_outcomes = {k: list(v) for k, v in state.get("pending_outcomes", {}).items()}
        self.reversal_log = [list(x) for x in state.get("reversal_log", [])]
        sec = state.get("sec")
        if sec and self.config.sampling_rule == "sec" and self.config.sec.bins == "pass_rate":
            if sec.get("pass_rates") is None:
                raise ValueError("checkpoint SEC state has no pass rates (saved with other bins?)")
            self._sec_bins(sec["pass_rates"])
        if self.sec is not None and sec:
            self.sec.load_state_dict(sec)
        for caller in self.llm or ():
            if caller.role in state.get("llm", {}):  # absent in checkpoints from before it
                caller.load_state_dict(state["llm"][caller.role])


__all__ = ["HarnessConfig", "HarnessController", "TaskHarness"]
