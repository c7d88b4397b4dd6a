"""ARISE-RL (seed 002): generator–solver co-evolution on one policy, with RG-SED for both roles.

The run is a sequence of co-evolution cycles (seed App. D.5). Cycle ``i`` holds
``generator_steps`` generator steps, then a pool refresh, then ``solver_steps`` solver steps::

    step s (1-based), L = generator_steps + solver_steps:
      cycle = (s − 1) // L,  offset = (s − 1) % L
      offset < generator_steps → a generator step, else a solver step
      the first solver step of a cycle refreshes the pool first (RL paused: nothing trained)

A **generator step** rolls out generator-role episodes (``envs/constraint_writer.py``: role prompt
with the 10 most recent generated questions as in-context negatives, a ``lookup`` tool through
the agent loop, a final ``<question> … <rubric> …`` answer). Each episode is parsed into a
checkable task (R_fmt, its reason counted when 0) and checked for a tool observation (R_tool);
when both gates hold, K solver attempts (a probe stream, never trained) are judged under the
generated rubric, c counts those with solver reward ≥ γ and
``R_G = R_tool · R_fmt · (1 + R_diff(c))`` (``arise_rl_rewards``) is the trained reward.

A **pool refresh** (seed D.5) prompts the generator ``refresh_rollouts`` times, one rollout per
prompt in batches of ``refresh_batch`` (the negatives are the 10 most recent accepted questions
when the batch starts), keeps the parseable tasks (R_fmt = 1: the seed keeps every task it can
extract; ``pool_filter="grounded"`` also asks R_tool = 1) that are not duplicates (same parsed
question parameters: "strict deduplication") up to ``pool_size`` = 500; the new pool replaces
the old one. Ours: when fewer than ``pool_min`` tasks were generated, ``pool_fill="domain"``
tops the pool up with the domain's training tasks (counted in ``arise_rl/pool/filled``);
``"none"`` raises instead.

A **solver step** draws ``rollout.tasks_per_step`` pool tasks (uniformly, without replacement
while the pool allows) and trains on the solver reward ``r = α s + (1 − α)·1[s = 1]`` with s the
unweighted mean of the criterion scores (eq. 7; ``satisfaction="weighted"``: by |λ|) over the
generated rubric, completed with the question's library criteria (``rubric_completion``; failed
verdicts excluded).

**RG-SED** (seed §3.2, eq. 9–14), per role in ``rgsed_roles``: after the step's rewards, a coach
turns each group's feedback into memory m for EVERY group (``coach_rule="every_group"``; solver:
``rgsed_coach.coach_memory``, the criteria the group missed, most-missed first, or its best
rollout's behaviours when none was missed; generator: :func:`generator_memory`, the group's
authoring failures or its best episode's question; ``coach="llm"``: ``rgsed_llm_coach``, one LLM
call per group), J' = ``memory_rollouts`` (0: J)
memory-augmented rollouts (m in the system message, or ``memory_placement``) measure
``Δr = R̄_memory − R̄_standard`` (never trained; a generator memory rollout gets its own K solver
attempts), and a placebo arm (another task's memory, hints shuffled: ``placebo_memories``) on
the same seeds as the memory rollouts (``paired_seeds``) measures the null beside it.
The teacher of every trained rollout of a group is the same policy on the group's prompt with m
and the student's exact completion tokens, and ``sd_gate`` returns ``gate(Δr) · w(t) · d(t)``
(``rgsed.py``; λ0 = ``loss.sd_coef``) with t on ``schedule_clock`` (default: the step's offset in
its role phase) — on generator groups only at steps whose generator mean Δr is > 0
(``generator_sd``). Δr, the placebo's Δr, the gate regions and the effective λ are logged per
role (``role_metrics``; per group in ``history``). ``sd_scope="final_turn"`` distils only the last
assistant turn of a multi-turn rollout (``sd_mask``).

**The frozen solver** (``solver_policy="frozen"``, the default): the K attempts of a cycle's
generator phase sample the policy as it was at the phase's first step — a second parameter set
(``Services.hold_policy``, JAX engine), taken then, kept in the run's checkpoints for a
resume, released when the solver phase begins; ``"current"`` samples the live policy. **The base
probe** (``base_probe_tasks`` > 0): the policy of step 1 (the warm start) is held for the run and,
at each refresh, answers up to that many fresh generated tasks once (``pool/base_pass_rate``: the
seed's Fig. 4, whose generator makes the frozen base policy's pass rate fall cycle to cycle).

**The generator domain** (``arise_rl.generator_domain``, ``arise_rl_domain.py``): the role
prompt, tool env, parse, signature, pool records and coach hints the controller calls through
one interface — ``"constraint"`` (the default: ``envs/constraint_writer.py``, single-turn solver
samples) or ``"sql"`` (``envs/sql_writer.py``: the generator explores a training database
with the SQL env's read-only tools; the K attempts, memory rollouts and base probe are agent
episodes in the SQL env, ``Services.run_agent``, frozen solver included, and a teacher's prompt
is the agent's first messages with m in the system message before the tools block, as its memory
rollouts saw it).

What is ours (the seed does not state it): ``generator_steps`` per cycle (20), the tool-grounded
filter of the refresh, ``pool_fill`` and ``pool_min``, the sampling of pool tasks, the generator
coach's rules, the base probe's single sample at the rollout temperature, the solver coach's
threshold (rgsed_coach), the SQL generator domain as a whole (the seed's tools are web search,
maps and OTA tools; its own "ours" are listed in ``envs/sql_writer.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, TaskBatch
from rubric_rl.envs.base import GENERIC_STYLE, Style
from rubric_rl.methods.arise_rl import arise_rl_rewards as rw
from rubric_rl.methods.arise_rl import rgsed
from rubric_rl.methods.arise_rl.arise_rl_domain import (
    RUBRIC_COMPLETIONS,
    GeneratorDomain,
)
from rubric_rl.methods.arise_rl.rgsed_coach import COACH_RULES, coach_memory
from rubric_rl.methods.arise_rl.rgsed_llm_coach import (
    COACHES,
    CoachLLMConfig,
    LLMCoach,
    generator_attempt,
    solver_attempts,
)
from rubric_rl.methods.method import complete_section
from rubric_rl.rollout.batch import Group, Messages, Rollouts, Trajectory
from rubric_rl.rubrics.types import (
    Message,
    Task,
    Verdict,
)

SIGNAL = "arise_rl"  # the trained signal: R_G on generator groups, the solver reward on solver ones
ATTEMPTS_STREAM = "arise_rl/attempts"
MEMORY_STREAM = "arise_rl/memory"
REFRESH_STREAM = "arise_rl/refresh"
ROLES = ("generator", "solver")
POOL_FILLS = ("domain", "none")
SD_SCOPES = ("all", "final_turn")
PLACEMENTS = ("system", "last_user")
SOLVER_POLICIES = ("current", "frozen")
# "self": RG-SED (the same policy with the memory, gated by Δr); the baselines with an external
# teacher (config.teacher: a separate frozen parameter set, notes/baselines.md §7): "opcd" (the
# teacher sees the memory, constant λ, no gate), "gkd" (the teacher sees the student's prompt).
TEACHERS = ("self", "opcd", "gkd")
PLACEBO_STREAM = "arise_rl/placebo"
# Seeds of the memory rollouts: "placebo" (ours, the default) — the real and placebo arms share
# fresh seeds, so their difference is a paired contrast and Δr against the standard rollouts is
# unbiased; "standard" — memory sample j on standard sample j's seed (common random numbers with
# the standard side; biased upward whenever the memory was chosen from the standard rollouts'
# misses, which the paired sample then repeats unless the memory flips them: the scripted check
# measures it); "none" — the memory stream's own seeds.
PAIRINGS = ("placebo", "standard", "none")
# The warm-up/decay clock t of eq. 12 (the seed leaves it open): "phase" restarts it at each
# role phase (t = the step's offset in its cycle's generator or solver phase; ours, the default),
# "global" runs it on the training step across cycles and roles (the authors' single counter).
SCHEDULE_CLOCKS = ("phase", "global")
# s of eq. 7: "unweighted" (the seed's mean of the criterion scores) or "weighted" (by |λ|).
SATISFACTIONS = ("unweighted", "weighted")
# Which refreshed tasks enter the pool: "parsed" (the seed keeps every task it can extract,
# App. D.5) or "grounded" (also R_tool = 1).
POOL_FILTERS = ("parsed", "grounded")
# Generator-side SD: "after_positive" (a generator step distils only when its groups' mean Δr is
# > 0: the warm start never showed the generator a memory) or "always" (per-group gate only).
GENERATOR_SD = ("after_positive", "always")
# The generator's trained reward: ARISE-RL's R_G, or a baseline's own proposer reward
# (notes/baselines.md §6: Dr. Zero's 0.5·f + difficulty, Absolute Zero's format-aware
# learnability with its −0.5 / −1 penalties).
PROPOSER_REWARDS = ("arise_rl", "dr_zero", "absolute_zero")
# Advantages: "group" (GRPO within each prompt's group), "hrpo" (Dr. Zero: standardised within
# the step's groups sharing a task type, the analogue of its hop count), "trr++" (Absolute Zero's
# Task-Relative REINFORCE++: the mean of each (role, task type) as baseline, one std over the
# step's rollouts).
ADVANTAGE_GROUPINGS = ("group", "hrpo", "trr++")
FROZEN_SOLVER = "arise_rl_frozen_solver"  # held policies (Services.hold_policy)
BASE_POLICY = "arise_rl_base"
BASE_PROBE_STREAM = "arise_rl/base_probe"


@dataclasses.dataclass(frozen=True)
class AriseRLConfig:
    """``config.arise_rl``: each field's comment says what is the seed's and what is ours."""

    # The one default of each field: configs/arise_rl.py builds the section from
    # ``section_defaults(AriseRLConfig)`` and sets only what a variant changes.
    cycles: int = 3  # seed App. D.5: three rounds of generator-solver evolution
    generator_steps: int = 10  # ours: the seed does not say how long the generator trains
    solver_steps: int = 30  # seed: 120 (``seed_scale``); ours on the embedded default
    pool_size: int = 128  # seed: 500 (``seed_scale``)
    pool_min: int = 16  # ours: below this, pool_fill tops the pool up
    pool_fill: str = "domain"  # ours: "domain" (the domain's training tasks) | "none" (an error)
    refresh_rollouts: int = 256  # ours: generator rollouts per refresh (one rollout per prompt)
    refresh_batch: int = 64
    n_negatives: int = 3  # seed: 10 (``seed_scale``); ours on the tiny policy (prompt length)
    generator_max_new_tokens: int = 96  # ours: a generator turn (question + rubric) fits
    # K attempts against the solver frozen at the start of each cycle's generator phase
    # (the default; "current": the live policy). Both roles share one parameter set: "frozen"
    # holds a second one (the JAX engine) during the generator phase only.
    solver_policy: str = "frozen"
    # The frozen base policy's single-shot pass rate on up to this many fresh generated tasks at
    # each refresh (seed Fig. 4; 0 = off): holds the warm-start parameters for the whole run.
    base_probe_tasks: int = 64
    k_attempts: int = rw.K_ATTEMPTS  # seed §5.1
    gamma: float = rw.SUCCESS_THRESHOLD  # seed §5.1
    alpha: float = 0.8  # seed §5.1
    shape: str = "arise_rl"  # arise_rl | dr_zero | absolute_zero (R_diff's place)
    difficulty: bool = True
    tool_grounding: bool = True
    rgsed_roles: tuple[str, ...] = ROLES  # seed: both roles
    # J' memory rollouts per group; 0 = J, the group's own size (the authors' scripts: 8 + 8).
    memory_rollouts: int = 0
    # The placebo arm: J' more rollouts per group with another task's memory (shuffled); its Δr,
    # logged beside the real one, is the null (ours).
    placebo: bool = True
    # Seeds of the memory rollouts: "placebo" (the real and placebo arms share fresh seeds: a
    # paired contrast, and Δr unbiased), "standard" (memory j on standard j's seed: biased up
    # when the memory names the standard rollouts' misses), "none".
    paired_seeds: str = "placebo"
    # The coach writes memory for every group (the seed's); "majority": only the criteria most of
    # a group missed (rgsed_coach.py).
    coach_rule: str = "every_group"
    # Who writes the memory: "rule" (rgsed_coach.py; the default on the embedded domain, whose
    # tokenizer keeps only its own vocabulary and whose policy was warm-started on the rule
    # coach's wording) or "llm" (rgsed_llm_coach.py: one call per group, as the seed's coach;
    # coach_rule is then unused).
    coach: str = "rule"
    # The LLM coach's client (an empty field takes judge.llm's), prompts and limits
    # (rgsed_llm_coach.CoachLLMConfig documents each).
    coach_llm: CoachLLMConfig = CoachLLMConfig()
    # Warm-up/decay clock: "phase" restarts at each role phase (ours: the seed is ambiguous),
    # "global" runs on the training step.
    schedule_clock: str = "phase"
    satisfaction: str = "unweighted"  # eq. 7's mean; "weighted" by |λ|
    pool_filter: str = "parsed"  # the seed keeps every task it can extract; "grounded": R_tool = 1
    # A generated rubric is completed with every library criterion its question implies (the
    # task verifier's requirement set, which the solver is evaluated on); "as_written".
    rubric_completion: str = "library"
    # Generator SD only on steps where its memory helps on average (mean Δr > 0): its warm start
    # never showed the generator a memory; "always": the per-group gate alone.
    generator_sd: str = "after_positive"
    proposer_reward: str = "arise_rl"  # arise_rl | dr_zero | absolute_zero (their own rewards)
    advantage_grouping: str = "group"  # group | hrpo (Dr. Zero) | trr++ (Absolute Zero)
    memory_placement: str = "system"  # seed App. E: the memory sits at the system prompt's tail
    gate: str = "soft"  # the authors' code; "hard" is the seed's eq. 12; "none" = w/o gating
    tau: float = rgsed.TAU
    temperature: float = rgsed.TEMPERATURE
    warmup_steps: int = rgsed.WARMUP_STEPS
    decay_steps: int = rgsed.DECAY_STEPS
    decay_floor: float = rgsed.DECAY_FLOOR
    sd_scope: str = "all"  # all | final_turn
    # RG-SED ("self") or a distillation baseline with an external teacher: "opcd" | "gkd"
    # (config.teacher.model and .params).
    teacher: str = "self"
    # Where the generator writes tasks (arise_rl_domain.py): "constraint" (the embedded
    # constraint domain) | "sql" (the SQL env; the ``sql`` variant sets the rest).
    generator_domain: str = "constraint"

    @classmethod
    def from_config(cls, config: Any) -> AriseRLConfig:
        """``config.arise_rl`` as an ``AriseRLConfig``: every field present, none unknown, each
        of its default's type (``method.complete_section``), then ``__post_init__``'s checks;
        each error names ``config.arise_rl.<field>``."""
        return complete_section(cls, config, "arise_rl")

    def __post_init__(self):
        object.__setattr__(self, "rgsed_roles", tuple(self.rgsed_roles))
        if isinstance(self.coach_llm, Mapping):
            object.__setattr__(self, "coach_llm", CoachLLMConfig.from_mapping(self.coach_llm))
        elif not isinstance(self.coach_llm, CoachLLMConfig):
            raise ValueError(
                f"config.arise_rl.coach_llm must be a mapping of the LLM coach's options, got "
                f"{self.coach_llm!r}"
            )
        ints = dict(
            cycles=1, solver_steps=1, pool_size=1, k_attempts=1, refresh_batch=1,
            generator_max_new_tokens=1,
            base_probe_tasks=0,
            generator_steps=0, pool_min=0, refresh_rollouts=0, n_negatives=0, memory_rollouts=0,
            warmup_steps=0, decay_steps=0,
        )  # fmt: skip
        for name, lo in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < lo:
                raise ValueError(f"config.arise_rl.{name} must be an integer >= {lo}, got {v!r}")
        checks = (
            ("pool_fill", self.pool_fill, POOL_FILLS),
            ("gate", self.gate, rgsed.GATES),
            ("sd_scope", self.sd_scope, SD_SCOPES),
            ("memory_placement", self.memory_placement, PLACEMENTS),
            ("solver_policy", self.solver_policy, SOLVER_POLICIES),
            ("teacher", self.teacher, TEACHERS),
            ("shape", self.shape, tuple(rw.DIFFICULTY_SHAPES.names())),
            ("coach_rule", self.coach_rule, COACH_RULES),
            ("coach", self.coach, COACHES),
            ("paired_seeds", self.paired_seeds, PAIRINGS),
            ("schedule_clock", self.schedule_clock, SCHEDULE_CLOCKS),
            ("satisfaction", self.satisfaction, SATISFACTIONS),
            ("pool_filter", self.pool_filter, POOL_FILTERS),
            ("rubric_completion", self.rubric_completion, RUBRIC_COMPLETIONS),
            ("generator_sd", self.generator_sd, GENERATOR_SD),
            ("proposer_reward", self.proposer_reward, PROPOSER_REWARDS),
            ("advantage_grouping", self.advantage_grouping, ADVANTAGE_GROUPINGS),
        )
        for name, v, allowed in checks:
            if v not in allowed:
                raise ValueError(f"config.arise_rl.{name} must be one of {allowed}, got {v!r}")
        if not (isinstance(self.generator_domain, str) and self.generator_domain.strip()):
            raise ValueError(
                "config.arise_rl.generator_domain must name the solver domain's task writer "
                f"(e.g. 'constraint', 'sql'), got {self.generator_domain!r}"
            )
        bad = sorted(set(self.rgsed_roles) - set(ROLES))
        if bad:
            raise ValueError(f"config.arise_rl.rgsed_roles: unknown roles {bad}; known {ROLES}")
        if not 0.0 <= self.alpha <= 1.0 or not 0.0 <= self.gamma <= 1.0:
            raise ValueError(
                f"config.arise_rl.alpha and .gamma must be in [0, 1], got {self.alpha}, "
                f"{self.gamma}"
            )
        if self.pool_min > self.pool_size:
            raise ValueError(
                f"config.arise_rl.pool_min ({self.pool_min}) > pool_size ({self.pool_size})"
            )

    @property
    def cycle_length(self) -> int:
        return self.generator_steps + self.solver_steps

    @property
    def total_steps(self) -> int:
        return self.cycles * self.cycle_length


@dataclasses.dataclass(frozen=True)
class Phase:
    """Where a step falls in the co-evolution schedule."""

    cycle: int
    role: str  # "generator" | "solver"
    offset: int  # step index inside its cycle (0-based)

    @property
    def refreshes(self) -> bool:
        """The first solver step of a cycle: the pool is refreshed before it."""
        return self.role == "solver" and self.offset == 0


def phase(step: int, cfg: AriseRLConfig) -> Phase:
    """The phase of training step ``step`` (1-based, as ``Rollouts.step``); steps beyond the last
    cycle continue its solver phase."""
    if step < 1:
        raise ValueError(f"arise_rl phase: step must be >= 1, got {step}")
    s = step - 1
    length = cfg.cycle_length
    cycle = s // length
    if cycle >= cfg.cycles:
        return Phase(cfg.cycles - 1, "solver", s - (cfg.cycles - 1) * length - cfg.generator_steps)
    off = s % length
    if off < cfg.generator_steps:
        return Phase(cycle, "generator", off)
    return Phase(cycle, "solver", off - cfg.generator_steps)


# --- rewards of one group ------------------------------------------------------------------------


def met_matrix(task: Task, verdict_rows: Sequence[Sequence[Verdict]]) -> np.ndarray:
    """``[J, M]`` over the task's criteria: 1 met, 0 not met, NaN a failed or missing verdict."""
    ids = {c.id: i for i, c in enumerate(task.rubric.criteria)}
    out = np.full((len(verdict_rows), len(ids)), np.nan)
    for j, row in enumerate(verdict_rows):
        for v in row:
            i = ids.get(v.criterion_id)
            if i is None:
                raise ValueError(
                    f"task {task.id!r}: a verdict for criterion {v.criterion_id!r}, which is not "
                    "in its rubric"
                )
            if v.met is not None:
                out[j, i] = float(v.met)
    return out


def solver_rewards(
    task: Task,
    verdict_rows: Sequence[Sequence[Verdict]],
    alpha: float = 0.8,
    satisfaction: str = "unweighted",
) -> np.ndarray:
    """``[J]`` ARISE-RL solver rewards (eq. 8; NaN where every verdict failed) on s of eq. 7:
    the unweighted mean of the criterion scores (the seed's), or weighted by |λ|
    (``satisfaction="weighted"``). A pitfall keeps its sign either way (satisfied = absent)."""
    if satisfaction not in SATISFACTIONS:
        raise ValueError(f"solver_rewards: satisfaction must be one of {SATISFACTIONS}")
    if not verdict_rows:
        return np.zeros(0)
    weights = np.array([c.weight for c in task.rubric.criteria], np.float64)
    if not weights.size:
        return np.full(len(verdict_rows), np.nan)
    if satisfaction == "unweighted":
        weights = np.sign(weights)
    return np.atleast_1d(rw.solver_reward(weights, met_matrix(task, verdict_rows), alpha))


@dataclasses.dataclass
class GeneratorScore:
    """One generator episode's parse, gates, solver successes and R_G."""

    reward: float
    fmt_reason: str | None  # None: R_fmt = 1
    tool: bool  # the tool observation event (before the ablation switch)
    task: Task | None  # the parsed task (None when R_fmt = 0)
    question: str
    c: int | None = None  # solver successes of K (None: the solver was not run)
    num_unknown: int = 0  # listed criteria naming no check of the question (dropped)

    @property
    def gates(self) -> bool:
        return self.fmt_reason is None and self.tool

    def as_info(self) -> dict[str, Any]:
        return {
            "r_g": self.reward, "fmt_reason": self.fmt_reason, "tool": self.tool, "c": self.c,
            "question": self.question, "task_id": self.task.id if self.task else None,
            "num_unknown": self.num_unknown,
        }  # fmt: skip


# --- the generator's coach -----------------------------------------------------------------------


def generator_memory(
    scores: Sequence[GeneratorScore],
    k: int,
    hints: Mapping[str, str],
    *,
    rule: str = "every_group",
    max_hints: int = 2,
    style: Style = GENERIC_STYLE,
) -> str | None:
    """The generator group's memory m (seed App. E fig. 17: the coach summarises the group's
    authoring failures — format errors, ungrounded rubrics, queries every solver attempt solves
    or none does) as ``<coach>`` text. ``rule`` (``rgsed_coach.COACH_RULES``):

    * ``"every_group"`` (the default: the seed's coach writes for every group): the hints of the
      failures ANY episode of the group made, most common first (ties in the order format, tool,
      too easy, too hard), at most ``max_hints``; when no episode failed (all gated, 0 < c < K),
      the best episode's behaviour: ``hints["keep"]`` with its question (a domain without a
      "keep" hint writes nothing then);
    * ``"majority"``: the hints of the failures of most of the group (strictly more than half),
      in that order; None when no failure is that common.

    ``hints``: the generator domain's (its task writer's, ``TaskWriter.hints``); ``style``: the
    domain's, which writes the memory from its notes (``Style.coach``).
    Ours: the rules and the wording (the seed's coach is an LLM)."""
    if rule not in COACH_RULES:
        raise ValueError(f"generator_memory: rule must be one of {COACH_RULES}, got {rule!r}")
    n = len(scores)
    if n == 0:
        return None
    counts = {
        "format": sum(s.fmt_reason is not None for s in scores),
        "tool": sum(s.fmt_reason is None and not s.tool for s in scores),
        "too_easy": sum(s.c is not None and s.c == k for s in scores),
        "too_hard": sum(s.c is not None and s.c == 0 for s in scores),
    }
    table = hints
    if rule == "majority":
        named = [table[name] for name, count in counts.items() if count > n / 2]
        return style.coach(named) if named else None
    order = list(counts)
    failed = sorted((name for name in order if counts[name] > 0),
                    key=lambda name: (-counts[name], order.index(name)))  # fmt: skip
    if failed:
        return style.coach([table[name] for name in failed[:max_hints]])
    if "keep" not in table:
        return None
    best = max(range(n), key=lambda j: (scores[j].reward, -j))
    return style.coach([table["keep"].format(question=scores[best].question)])


def final_turn_mask(loss_mask: Sequence[int] | None, n: int) -> tuple[int, ...]:
    """Per completion token, 1 on the last assistant turn only (the last run of loss tokens)."""
    mask = list(loss_mask) if loss_mask is not None else [1] * n
    out = [0] * len(mask)
    i = len(mask) - 1
    while i >= 0 and mask[i] == 0:
        i -= 1
    while i >= 0 and mask[i] != 0:
        out[i] = 1
        i -= 1
    return tuple(out)


# --- the controller ------------------------------------------------------------------------------


class AriseRLController(Controller):
    """The ARISE-RL sampler and controller (module docstring): the cycle schedule, the pool, R_G,
    the solver reward and RG-SED's memories, Δr and gates."""

    name = "arise_rl"

    def __init__(
        self,
        cfg: AriseRLConfig,
        *,
        fallback_tasks: Sequence[Task] = (),
        forbidden: frozenset[str] = frozenset(),
        tasks_per_step: int = 16,
        seed: int = 0,
        generator_domain: GeneratorDomain | None = None,
        style: Style = GENERIC_STYLE,
        llm_coach: LLMCoach | None = None,
    ):
        self.cfg = cfg
        self.style = style  # the solver domain's: how coach memory is written and mounted
        if (cfg.coach == "llm") != (llm_coach is not None):
            raise ValueError(
                f"AriseRLController: config.arise_rl.coach={cfg.coach!r} "
                f"{'needs' if cfg.coach == 'llm' else 'takes no'} llm_coach "
                "(arise_rl_controllers builds it from config.arise_rl.coach_llm)"
            )
        self.llm_coach = llm_coach
        self.fallback_tasks = tuple(fallback_tasks)
        # the generator domain (arise_rl_domain.build_generator_domain: the solver domain's task
        # writer, config.arise_rl.generator_domain's)
        if generator_domain is None:
            raise TypeError(
                "AriseRLController: generator_domain is required (arise_rl_domain."
                "build_generator_domain over the solver domain)"
            )
        self.generator_domain = generator_domain
        self.forbidden = frozenset(forbidden)
        self.tasks_per_step = int(tasks_per_step)
        self.seed = int(seed)
        self.pool: list[Task] = []
        self.pool_cycle = -1
        self.pool_stats: dict[str, float] = {}
        self.recent: list[str] = []  # the most recent generated questions (negatives)
        self.phase: Phase | None = None
        self._memory: dict[int, str] = {}  # group index -> memory text, this step
        self._dr: np.ndarray | None = None
        self._placebo_dr: np.ndarray | None = None
        self._events: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []  # per-step c / Δr summaries (state)

    # --- sampling ------------------------------------------------------------------------------

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch:
        self.phase = ph = phase(step, self.cfg)
        self._memory, self._dr, self._placebo_dr = {}, None, None
        n = self.tasks_per_step
        self._hold_policies(step, ph)
        if ph.role == "generator":
            tasks = self.generator_domain.generator_tasks(
                rng, n, self.recent, first_index=step * n, n_negatives=self.cfg.n_negatives
            )
            return TaskBatch(tasks, np.ones(n))
        if self.pool_cycle != ph.cycle:
            self.refresh_pool(ph.cycle, step, rng)
        replace = len(self.pool) < n
        idx = rng.choice(len(self.pool), size=n, replace=replace)
        return TaskBatch([self.pool[int(i)] for i in idx], np.ones(n))

    def _hold_policies(self, step: int, ph: Phase) -> None:
        """The second parameter sets: the frozen base policy (held from step 1, for the per-cycle
        probe) and, with ``solver_policy="frozen"``, the solver frozen at the start of each
        cycle's generator phase (released when its solver phase begins)."""
        cfg = self.cfg
        if cfg.base_probe_tasks > 0:
            if step == 1:
                self.services.hold_policy(BASE_POLICY)
            elif self.services.held_step(BASE_POLICY) != 1:
                raise RuntimeError(
                    f"arise_rl at step {step}: the frozen base policy (taken at step 1) is gone "
                    f"(held_step={self.services.held_step(BASE_POLICY)}); the run's checkpoints "
                    "keep it for a resume"
                )
        if cfg.solver_policy != "frozen":
            return
        if ph.role == "solver":
            if ph.refreshes:
                self.services.release_policy(FROZEN_SOLVER)
            return
        first = step - ph.offset  # the cycle's first generator step
        if ph.offset == 0:
            self.services.hold_policy(FROZEN_SOLVER)
        elif self.services.held_step(FROZEN_SOLVER) != first:
            raise RuntimeError(
                f"arise_rl at step {step}: the frozen solver of cycle {ph.cycle} (taken at step "
                f"{first}) is not held (held_step={self.services.held_step(FROZEN_SOLVER)})"
            )

    def _rewards(self, task: Task, verdict_rows: Sequence[Sequence[Verdict]]) -> np.ndarray:
        return solver_rewards(task, verdict_rows, self.cfg.alpha, self.cfg.satisfaction)

    def _solver_policy(self) -> str | None:
        return FROZEN_SOLVER if self.cfg.solver_policy == "frozen" else None

    def base_probe(self, tasks: Sequence[Task]) -> float:
        """The frozen base policy's single-shot pass rate (one sample at the rollout temperature;
        solver reward ≥ γ) on ``tasks`` (seed Fig. 4: on fresh generator tasks, per cycle)."""
        _, trajs = self._solve(tasks, 1, BASE_PROBE_STREAM, policy=BASE_POLICY)
        verdicts = self.services.judge(tasks, [[t.response for t in ts] for ts in trajs])
        pairs = zip(tasks, verdicts, strict=True)
        r = np.concatenate([self._rewards(t, vs) for t, vs in pairs])
        return float(np.mean(np.where(np.isnan(r), 0.0, r >= self.cfg.gamma)))

    def refresh_pool(self, cycle: int, step: int, rng: np.random.Generator) -> None:
        """Seed App. D.5: a new pool of deduplicated generated tasks (module docstring)."""
        cfg = self.cfg
        pool: dict[str, Task] = {}
        counts: collections.Counter = collections.Counter()
        done = 0
        while done < cfg.refresh_rollouts and len(pool) < cfg.pool_size:
            b = min(cfg.refresh_batch, cfg.refresh_rollouts - done)
            tasks = self.generator_domain.generator_tasks(
                rng, b, self.recent, first_index=done, n_negatives=cfg.n_negatives
            )
            _, trajs = self._run_generator(tasks, 1, REFRESH_STREAM)
            for (t,) in trajs:
                s = self._parse(t.response)
                counts["rollouts"] += 1
                counts[f"reason/{s.fmt_reason}" if s.fmt_reason else "parsed"] += 1
                if s.fmt_reason is None and not s.tool and cfg.tool_grounding:
                    counts["ungrounded"] += 1
                    if cfg.pool_filter == "grounded":
                        continue
                if s.task is None:
                    continue
                key = self.generator_domain.signature(s.task)
                if key in pool:
                    counts["duplicates"] += 1
                    continue
                if len(pool) < cfg.pool_size:
                    pool[key] = s.task
                    self._remember(s.question)
            done += b
        generated = len(pool)
        filled = 0
        if generated < cfg.pool_min:
            if cfg.pool_fill == "none" or not self.fallback_tasks:
                raise RuntimeError(
                    f"arise_rl pool refresh at step {step} (cycle {cycle}): {generated} usable "
                    f"generated tasks < config.arise_rl.pool_min={cfg.pool_min} after "
                    f"{done} generator rollouts (parse reasons {dict(counts)}); set "
                    "arise_rl.pool_fill='domain' or lower pool_min"
                )
            order = rng.permutation(len(self.fallback_tasks))
            for i in order:
                if len(pool) >= cfg.pool_min:
                    break
                t = self.fallback_tasks[int(i)]
                if t.id not in pool:
                    pool[t.id] = t
                    filled += 1
        self.pool = list(pool.values())
        self.pool_cycle = cycle
        fresh = [t for t in self.pool if (t.raw or {}).get("split") == "generated"]
        probe = fresh[: self.cfg.base_probe_tasks]
        self.pool_stats = {
            "rollouts": float(done), "generated": float(generated), "filled": float(filled),
            "parse_rate": counts["parsed"] / max(done, 1),
            "duplicates": float(counts["duplicates"]), "ungrounded": float(counts["ungrounded"]),
        }  # fmt: skip
        if probe:
            self.pool_stats["base_pass_rate"] = self.base_probe(probe)
            self.pool_stats["base_probe_tasks"] = float(len(probe))
        self._events.append(
            {"event": "pool_refresh", "cycle": cycle, "size": len(self.pool), **self.pool_stats,
             "reasons": {k: v for k, v in counts.items() if k.startswith("reason/")}}
        )  # fmt: skip

    def _remember(self, question: str) -> None:
        self.recent.append(question)
        keep = max(self.cfg.n_negatives, 1)
        del self.recent[:-keep]

    # --- generator episodes --------------------------------------------------------------------

    def _run_generator(
        self, tasks: Sequence[Task], n: int, stream: str, seed_indices: Sequence[int] | None = None
    ):
        params = self.services.sampling_params(1, max_new_tokens=self.cfg.generator_max_new_tokens)
        return self.services.run_agent(
            tasks, n, stream=stream, params=params, make_env=self.generator_domain.make_env,
            seed_indices=seed_indices,
        )  # fmt: skip

    def _solve(
        self,
        tasks: Sequence[Task],
        n: int,
        stream: str,
        *,
        prompts: Sequence[Messages] | None = None,
        policy: str | None = None,
        seed_indices: Sequence[int] | None = None,
    ):
        """``n`` solver rollouts per task (never trained): single-turn samples of ``prompts``
        (default: the tasks' messages), or, in a domain whose solver is an agent
        (``solver_agent``), episodes in the solver domain's env whose first messages are
        ``prompts``."""
        if self.generator_domain.solver_agent:
            if prompts is not None:
                tasks = [_with_prompt(t, p) for t, p in zip(tasks, prompts, strict=True)]
            return self.services.run_agent(
                tasks, n, stream=stream, policy=policy, seed_indices=seed_indices
            )
        prompts = [t.messages for t in tasks] if prompts is None else prompts
        return self.services.generate(
            prompts, n, stream=stream, names=[t.id for t in tasks], policy=policy,
            seed_indices=seed_indices,
        )  # fmt: skip

    def _parse(self, response: str) -> GeneratorScore:
        parsed, outcome = self.generator_domain.episode_outcome(response, forbidden=self.forbidden)
        return GeneratorScore(
            reward=0.0, fmt_reason=outcome.fmt_reason, tool=outcome.tool_observed,
            task=parsed.task, question=parsed.question, num_unknown=parsed.num_unknown,
        )  # fmt: skip

    def score_generator(self, responses: Sequence[str]) -> list[GeneratorScore]:
        """Parse, gates, K solver attempts on the current policy (one call for all parseable,
        gated tasks; a probe stream, never trained) and R_G of each generator episode."""
        cfg = self.cfg
        scores = [self._parse(r) for r in responses]
        # ARISE-RL solves the gated tasks; the baselines' proposers every parsed one (their
        # difficulty term is computed whenever their format term is > 0)
        baseline = cfg.proposer_reward != "arise_rl"
        solve = [
            s for s in scores
            if s.task is not None and cfg.difficulty
            and (baseline or s.tool or not cfg.tool_grounding)
        ]  # fmt: skip
        if solve:
            tasks = [s.task for s in solve]
            _, trajs = self._solve(
                tasks, cfg.k_attempts, ATTEMPTS_STREAM, policy=self._solver_policy()
            )
            verdicts = self.services.judge(tasks, [[t.response for t in ts] for ts in trajs])
            for s, task, vs in zip(solve, tasks, verdicts, strict=True):
                r = self._rewards(task, vs)
                s.c = int(rw.solver_successes(r, cfg.gamma))
        for s in scores:
            if baseline:
                s.reward = proposer_reward(cfg.proposer_reward, s, cfg.k_attempts)
                continue
            outcome = rw.GeneratorOutcome(
                s.question, 0 if s.task is None else len(s.task.rubric), s.tool, s.fmt_reason
            )
            solver = None if s.c is None else _scores_for(s.c, cfg)
            s.reward = rw.generator_reward(
                outcome, solver, gamma=cfg.gamma, shape=cfg.shape,
                tool_grounding=cfg.tool_grounding, difficulty=cfg.difficulty,
            )  # fmt: skip
        return scores

    def score_generator_groups(self, rollouts: Rollouts, verifier_signal: str) -> None:
        """The ``attempts`` stage: every generator trajectory's ``GeneratorScore`` in
        ``info["arise_rl"]``; the task verifier (``verifier_signal``) does not apply to a
        generator episode (NaN)."""
        groups = [g for g in rollouts.groups if g.role == "generator" and "arise_rl" not in g.info]
        flat = [t for g in groups for t in g.trajectories]
        scores = self.score_generator([t.response for t in flat])
        for t, s in zip(flat, scores, strict=True):
            t.info["arise_rl"] = s.as_info()
            t.signals.setdefault(verifier_signal, math.nan)
        for g in groups:
            g.info["arise_rl"] = True

    # --- hooks ---------------------------------------------------------------------------------

    def signal_weights(self) -> dict[str, float]:
        return {SIGNAL: 1.0}

    def shape_advantages(self, rollouts: Rollouts, advantages: np.ndarray) -> np.ndarray | None:
        """``advantage_grouping``: "group" leaves the trainer's per-prompt advantages; "hrpo"
        and "trr++" recompute them from the trained signal over wider groups
        (:func:`grouped_advantages`) — Dr. Zero's HRPO on its proposer's (generator) groups only,
        Absolute Zero's TRR++ on both roles."""
        mode = self.cfg.advantage_grouping
        if mode == "group":
            return None
        r = rollouts.signal(SIGNAL)
        roles = [g.role for g in rollouts.groups]
        keys = [(g.role, g.task.task_type) for g in rollouts.groups]
        out = grouped_advantages(r, keys, mode)
        if mode == "hrpo":
            gen = np.array([role == "generator" for role in roles])
            out = np.where(gen[:, None], out, advantages)
        return out

    def reward_signals(self, rollouts: Rollouts) -> dict[str, np.ndarray]:
        out = np.full((len(rollouts.groups), rollouts.group_size), np.nan)
        for gi, g in enumerate(rollouts.groups):
            if g.role == "generator":
                for j, t in enumerate(g.trajectories):
                    out[gi, j] = t.info["arise_rl"]["r_g"]
            else:
                r = self._rewards(g.task, [t.verdicts for t in g.trajectories])
                out[gi, : len(r)] = r
        return {SIGNAL: out}

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        ph = self.phase or phase(rollouts.step, self.cfg)
        m: dict[str, float] = {
            "cycle": float(ph.cycle),
            "generator_phase": float(ph.role == "generator"),
            "pool/size": float(len(self.pool)),
        }
        m.update({f"pool/{k}": v for k, v in self.pool_stats.items()})
        gen = [t.info["arise_rl"] for g in rollouts.groups if g.role == "generator"
               for t in g.trajectories]  # fmt: skip
        if gen:
            m.update(generator_metrics(gen, self.cfg.k_attempts))
            for info in gen:
                if info["fmt_reason"] is None:
                    self._remember(info["question"])
        sol = rollouts.signal(SIGNAL)[[g.role == "solver" for g in rollouts.groups]]
        if sol.size and np.any(~np.isnan(sol)):
            m["solver/reward"] = float(np.nanmean(sol))
            m["solver/success_rate"] = float(
                np.nanmean(np.where(np.isnan(sol), np.nan, sol >= self.cfg.gamma))
            )
        return m

    # --- RG-SED ----------------------------------------------------------------------------------

    def memories(self, rollouts: Rollouts) -> dict[int, str]:
        """Group index -> the coach's memory m, for the groups of the roles in ``rgsed_roles``
        (``coach_rule``: every group by default; ``coach="llm"``: one LLM coach call per group,
        a failed call leaving its group without memory)."""
        out: dict[int, str] = {}
        rule = self.cfg.coach_rule
        for gi, g in enumerate(rollouts.groups):
            if g.role not in self.cfg.rgsed_roles or not g.trajectories:
                continue
            if self.llm_coach is not None:
                text = self._llm_memory(rollouts.step, gi, g)
            elif g.role == "generator":
                scores = [_score_of(t) for t in g.trajectories]
                text = generator_memory(
                    scores, self.cfg.k_attempts, self.generator_domain.hints, rule=rule,
                    style=self.style,
                )  # fmt: skip
            else:
                text = coach_memory(
                    g.task, [t.response for t in g.trajectories],
                    [t.verdicts for t in g.trajectories], rule=rule, style=self.style,
                )  # fmt: skip
            if text:
                out[gi] = text
        return out

    def _llm_memory(self, step: int, gi: int, g: Group) -> str | None:
        """The LLM coach's memory of one group; its call's seed from (run seed, step, group)."""
        ts = g.trajectories
        if g.role == "generator":
            attempts = [
                generator_attempt(t.response, _score_of(t), self.cfg.k_attempts) for t in ts
            ]
        else:
            attempts = solver_attempts(
                g.task, [t.response for t in ts], [t.verdicts for t in ts], [t.reward for t in ts]
            )
        seed = int(np.random.default_rng([self.seed, step, gi, 0xC0AC]).integers(2**31))
        return self.llm_coach.memory(g.role, g.task, attempts, seed=seed)

    def _coach_memories(self, rollouts: Rollouts) -> tuple[dict[int, str], dict[str, float]]:
        """``memories`` and, with the LLM coach, its calls and failed calls this step and the
        failed calls so far (``rgsed/coach_*``)."""
        if self.llm_coach is None:
            return self.memories(rollouts), {}
        before = dict(self.llm_coach.counts)
        memory = self.memories(rollouts)
        after = self.llm_coach.counts
        return memory, {
            "rgsed/coach_calls": float(after["calls"] - before["calls"]),
            "rgsed/coach_failed": float(after["rejected"] - before["rejected"]),
            "rgsed/coach_failed_total": float(after["rejected"]),
        }

    def placebo_memories(self, rollouts: Rollouts, memory: Mapping[int, str]) -> dict[int, str]:
        """The placebo arm's memories: each group with memory gets the memory of ANOTHER task of
        its role this step (a random cyclic derangement of the role's groups with memory), its
        hints in shuffled order. Its Δr is the null of the real one: a memory that helps by its
        content for this task beats it, one that helps by being there (any memory) does not. A
        group whose donor has the same task or the same hints gets none (no null to draw).
        Ours: the seed has no placebo."""
        rng = np.random.default_rng([self.seed, rollouts.step, 0x9ACEB0])
        out: dict[int, str] = {}
        for role in ROLES:
            idx = [gi for gi in sorted(memory) if rollouts.groups[gi].role == role]
            if len(idx) < 2:
                continue
            order = [idx[int(i)] for i in rng.permutation(len(idx))]
            for a, gi in enumerate(order):
                donor = order[(a + 1) % len(order)]
                hints = self.style.coach_notes(memory[donor])
                same_task = rollouts.groups[donor].task.id == rollouts.groups[gi].task.id
                if same_task or sorted(hints) == sorted(self.style.coach_notes(memory[gi])):
                    continue
                rng.shuffle(hints)
                out[gi] = self.style.coach(hints)
        return out

    def memory_prompt(self, group: Group, memory: str) -> Messages:
        """The group's prompt with m as the domain style's coach block (``memory_placement``)."""
        return self.style.add_block(
            group.task, group.messages, "coach", memory, placement=self.cfg.memory_placement
        )

    def memory_rewards(
        self,
        rollouts: Rollouts,
        memory: Mapping[int, str],
        n: int,
        stream: str,
        seed_indices: Mapping[int, int] | None = None,
    ) -> tuple[np.ndarray, dict[int, list[Trajectory]]]:
        """``n`` rollouts of each group in ``memory`` with its text mounted (never trained):
        (rewards ``[G, n]``, NaN for groups without; the trajectories by group). ``seed_indices``:
        each group's seed index (``Services.generate``), None: the stream's own."""
        groups = rollouts.groups
        out = np.full((len(groups), n), np.nan)
        by_group: dict[int, list[Trajectory]] = {}
        for role in ROLES:
            idx = [gi for gi in sorted(memory) if groups[gi].role == role]
            if not idx:
                continue
            seeds = None if seed_indices is None else [seed_indices[gi] for gi in idx]
            prompts = [self.memory_prompt(groups[gi], memory[gi]) for gi in idx]
            if role == "solver":
                tasks = [groups[gi].task for gi in idx]
                _, trajs = self._solve(tasks, n, stream, prompts=prompts, seed_indices=seeds)
                verdicts = self.services.judge(tasks, [[t.response for t in ts] for ts in trajs])
                for gi, task, vs in zip(idx, tasks, verdicts, strict=True):
                    out[gi] = self._rewards(task, vs)
            else:
                tasks = [_with_prompt(groups[gi].task, p) for gi, p in zip(idx, prompts)]
                _, trajs = self._run_generator(tasks, n, stream, seed_indices=seeds)
                scores = self.score_generator([t.response for ts in trajs for t in ts])
                for k, gi in enumerate(idx):
                    out[gi] = [sc.reward for sc in scores[k * n : (k + 1) * n]]
            by_group.update(zip(idx, (list(ts) for ts in trajs), strict=True))
        return out, by_group

    def _seed_indices(self, rollouts: Rollouts) -> tuple[dict[int, int] | None, int]:
        """(each group's seed index for both memory arms, how to check the pairing: 0 none,
        1 against the standard rollouts, 2 memory against placebo) by ``paired_seeds``.
        "standard": the group's index, the trained call's (one call over the step's groups, in
        order); "placebo": an index of the memory stream, shared by the real and placebo arms."""
        mode = self.cfg.paired_seeds
        n = len(rollouts.groups)
        if mode == "standard":
            return {gi: gi for gi in range(n)}, 1
        if mode == "placebo":
            from rubric_rl.services import stream_base

            base = stream_base(MEMORY_STREAM)
            return {gi: base + gi for gi in range(n)}, 2
        return None, 0

    def run_rgsed(self, rollouts: Rollouts) -> dict[str, float]:
        """The ``memory`` stage: memories, memory rollouts and the placebo arm's (never
        trained), Δr per group, and the per-role metrics (``role_metrics``). With an external
        teacher there is no gate to measure: OPCD's memories only, GKD's none."""
        cfg = self.cfg
        n_groups = max(len(rollouts.groups), 1)
        self._dr = self._placebo_dr = None
        if cfg.teacher != "self":
            self._memory, coach_m = (
                self._coach_memories(rollouts) if cfg.teacher == "opcd" else ({}, {})
            )
            return {"rgsed/memory_frac": len(self._memory) / n_groups, **coach_m}
        self._memory, coach_m = self._coach_memories(rollouts)
        dr = np.full(len(rollouts.groups), np.nan)
        placebo = np.full(len(rollouts.groups), np.nan)
        paired = np.full(len(rollouts.groups), np.nan)
        jm = cfg.memory_rollouts or rollouts.group_size
        std = rollouts.signal(SIGNAL)
        if self._memory and jm > 0:
            seeds, check = self._seed_indices(rollouts)
            mem, trajs = self.memory_rewards(rollouts, self._memory, jm, MEMORY_STREAM, seeds)
            dr = rgsed.delta_r(mem, std)
            fake = self.placebo_memories(rollouts, self._memory) if cfg.placebo else {}
            ptrajs: dict[int, list[Trajectory]] = {}
            if fake:
                pm, ptrajs = self.memory_rewards(rollouts, fake, jm, PLACEBO_STREAM, seeds)
                placebo = rgsed.delta_r(pm, std)
            for gi, ts in trajs.items():
                partner = rollouts.groups[gi].trajectories if check == 1 else ptrajs.get(gi)
                paired[gi] = _seed_match(ts, partner) if check else np.nan
        self._dr, self._placebo_dr = dr, placebo
        m = {"rgsed/memory_frac": len(self._memory) / n_groups, **coach_m}
        defined = dr[~np.isnan(dr)]
        if defined.size:
            m["rgsed/delta_r"] = float(defined.mean())
        if np.any(~np.isnan(paired)):
            m["rgsed/paired_frac"] = float(np.nanmean(paired))
        regions = rgsed.gate_regions(dr, cfg.tau)
        m.update({f"rgsed/{k}": v for k, v in regions.items() if k != "num_undefined"})
        mult = self.multipliers(rollouts)
        m["rgsed/gate_mean"] = float(mult.mean()) if mult.size else 0.0
        m["rgsed/gate_active_frac"] = float(np.mean(mult > 0.5)) if mult.size else 0.0
        m.update(self.role_metrics(rollouts, mult))
        self.history.append(
            {"step": rollouts.step, "role": self.phase.role if self.phase else None,
             "groups": [g.role for g in rollouts.groups],
             "delta_r": [None if np.isnan(x) else float(x) for x in dr],
             "placebo": [None if np.isnan(x) else float(x) for x in placebo]}
        )  # fmt: skip
        del self.history[:-1000]
        return m

    def role_metrics(self, rollouts: Rollouts, mult: np.ndarray) -> dict[str, float]:
        """Per role present this step (seed Fig. 5 is per group): the share of its groups with
        memory, mean Δr and its standard error, the gate regions over its groups, the placebo's
        Δr and regions beside them, and the effective λ / λ0 (mean over the role's groups, and
        the share above 0.5: the pipeline's memory stage scales them by λ0 = ``loss.sd_coef``)."""
        roles = np.array([g.role for g in rollouts.groups])
        out: dict[str, float] = {}
        for role in ROLES:
            sel = roles == role
            if not sel.any():
                continue
            key = f"rgsed/{role}"
            out[f"{key}/memory_frac"] = float(np.mean([gi in self._memory
                                                       for gi in np.flatnonzero(sel)]))  # fmt: skip
            out[f"{key}/lambda_ratio"] = float(mult[sel].mean())
            out[f"{key}/lambda_active_frac"] = float(np.mean(mult[sel] > 0.5))
            for arm, dr in (("", self._dr), ("placebo_", self._placebo_dr)):
                d = dr[sel]
                d = d[~np.isnan(d)]
                if not d.size:
                    continue
                out[f"{key}/{arm}delta_r"] = float(d.mean())
                out[f"{key}/{arm}delta_r_se"] = (
                    float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else math.nan
                )
                regions = rgsed.gate_regions(d, self.cfg.tau)
                out.update({f"{key}/{arm}{k}": v for k, v in regions.items()
                            if k != "num_undefined"})  # fmt: skip
            if self._dr is not None and self._placebo_dr is not None:
                diff = (self._dr - self._placebo_dr)[sel]
                diff = diff[~np.isnan(diff)]
                if diff.size:
                    out[f"{key}/contrast"] = float(diff.mean())
        return out

    def clock(self, step: int) -> int:
        """The warm-up/decay clock t (``schedule_clock``): the step's offset in its role phase
        (0 at each phase's first step), or the training step."""
        if self.cfg.schedule_clock == "global":
            return step
        return phase(step, self.cfg).offset

    def multipliers(self, rollouts: Rollouts) -> np.ndarray:
        """``[G]`` gate(Δr) · w(t) · d(t) (``rgsed.sd_gate_multipliers``) on the groups with memory
        and a measured Δr, 0 elsewhere; with ``generator_sd="after_positive"``, 0 on every
        generator group of a step whose generator groups' mean Δr is not > 0."""
        n = len(rollouts.groups)
        if self._dr is None or len(self._dr) != n:
            return np.zeros(n)
        c = self.cfg
        mult = rgsed.sd_gate_multipliers(
            self._dr, self.clock(rollouts.step), gate=c.gate, tau=c.tau,
            temperature=c.temperature, warmup_steps=c.warmup_steps, decay_steps=c.decay_steps,
            decay_floor=c.decay_floor,
        )  # fmt: skip
        mult = np.where([gi in self._memory for gi in range(n)], mult, 0.0)
        gen = np.array([g.role == "generator" for g in rollouts.groups])
        if c.generator_sd == "after_positive" and gen.any():
            d = self._dr[gen]
            d = d[~np.isnan(d)]
            if not (d.size and d.mean() > 0.0):
                mult = np.where(gen, 0.0, mult)
        return mult

    def sd_gate(self, rollouts: Rollouts) -> np.ndarray:
        if self.cfg.teacher != "self":  # OPCD / GKD: λ = λ0 on every group, every step
            return np.ones(len(rollouts.groups))
        return self.multipliers(rollouts)

    def set_teachers(self, rollouts: Rollouts) -> None:
        """The teacher stage: every trained rollout of a group with memory gets the group's
        prompt with m (``memory_placement``) and, with ``sd_scope="final_turn"``, an SD mask on
        its last assistant turn. The completion tokens are the student's (trainer_batch). With
        an external teacher every group is distilled: OPCD's teacher sees m where there is one,
        GKD's the student's own prompt."""
        external = self.cfg.teacher != "self"
        for gi, g in enumerate(rollouts.groups):
            text = self._memory.get(gi)
            if text is None and not external:
                continue
            prompt = self.memory_prompt(g, text) if text else [dict(m) for m in g.messages]
            if self.generator_domain.solver_agent:
                prompt = self._agent_messages(g, prompt)
            for t in g.trajectories:
                t.teacher_prompt = prompt
                t.teacher_placement = self.cfg.memory_placement
                if self.cfg.sd_scope == "final_turn":
                    t.sd_mask = final_turn_mask(t.loss_mask, len(t.tokens))

    def _agent_messages(self, group: Group, prompt: Messages) -> Messages:
        """An agent episode's first messages for ``group``'s task with ``prompt`` in its place,
        the tools block written after the system message (so after a memory placed there): the
        teacher sees what the group's memory rollouts saw. Ours: the block is always written
        into the system message (``tool_calls.tools_system_block``, Qwen3's template's wording),
        also when the student's chat template took ``tools=`` (``rollout.agent.tools_in_system``
        off: a real checkpoint), since a teacher prompt is encoded from messages alone; the two
        renderings are the same text only as far as that block matches the template's."""
        task = _with_prompt(group.task, prompt)
        make_env = (
            self.generator_domain.make_env if group.role == "generator"
            else self.services.domain.make_env
        )  # fmt: skip
        env = make_env(task)
        try:
            obs = env.reset(task)
        finally:
            env.close()
        return obs.chat_messages(tools_in_system=True)

    # --- state ---------------------------------------------------------------------------------

    def pop_events(self) -> list[dict[str, Any]]:
        out, self._events = self._events, []
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "pool": [self.generator_domain.task_record(t) for t in self.pool],
            "pool_cycle": self.pool_cycle,
            "pool_stats": dict(self.pool_stats),
            "recent": list(self.recent),
            "history": list(self.history),
            **({"llm_coach": self.llm_coach.state_dict()} if self.llm_coach else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        by_id = {t.id: t for t in self.fallback_tasks}
        self.pool = [
            _task_from_record(self.generator_domain, r, by_id, self.forbidden)
            for r in state.get("pool", [])
        ]
        self.pool_cycle = int(state.get("pool_cycle", -1))
        self.pool_stats = {k: float(v) for k, v in dict(state.get("pool_stats", {})).items()}
        self.recent = [str(q) for q in state.get("recent", [])]
        self.history = list(state.get("history", []))
        if self.llm_coach is not None:
            # its counts and failure window; a checkpoint without them starts both empty
            coach = state.get("llm_coach")
            if coach is not None:
                self.llm_coach.load_state_dict(coach)
            else:
                self.llm_coach.load_state_dict(
                    {"counts": {k: 0 for k in self.llm_coach.counts}, "failure_stop": None}
                )


# Absolute Zero's −1 goes to a format error (the output cannot be read as a task at all), its −0.5
# to a task that is read but invalid (ours: the parse reasons that name the tags vs the others).
FORMAT_ERRORS = frozenset(
    {"no_final_answer", "no_question", "empty_question", "no_rubric", "stray_rubric_text",
     "empty_rubric"}
)  # fmt: skip


def proposer_reward(name: str, score: GeneratorScore, k: int) -> float:
    """A baseline's own proposer reward of one generator episode (notes/baselines.md §6):

    * "dr_zero": ``0.5·f + difficulty`` with Dr. Zero's format score
      ``f = (1 + think + tool + ans)/4`` when the episode parsed (its integrity check), else 0,
      and its difficulty ``(K − c)/(K − 1)`` for 0 < c < K. Theirs: the composite, the
      difficulty shape. Approximated: think = 1 (our answer format has no think block to
      score), tool = the tool observation event (Dr. Zero's hop-count rule gives 1 for one hop
      whatever was called), ans = 1 when every listed criterion names a check, else 0.5 (its
      short-answer rule has no rubric counterpart); c and K are ARISE-RL's attempts.
    * "absolute_zero": learnability ``1 − c/K`` for 0 < c < K, else 0, on a valid task; −0.5 for
      a task read but invalid; −1 on a format error (``FORMAT_ERRORS``). Theirs: the composite
      and its penalties. Approximated: "valid" = R_fmt (its code executor has no counterpart),
      no tool gate (AZR has no tool), the thresholded success rate c/K as r̄."""
    c = 0 if score.c is None else score.c
    parsed = score.fmt_reason is None
    if name == "dr_zero":
        ans = 1.0 if score.num_unknown == 0 else 0.5
        f = rw.dr_zero_format_score(parsed, 1.0, float(score.tool), ans)
        return rw.dr_zero_proposer_reward(f, c, k)
    if name == "absolute_zero":
        formatted = score.fmt_reason not in FORMAT_ERRORS
        return rw.absolute_zero_proposer_reward(formatted, parsed, c, k)
    raise ValueError(f"proposer_reward: unknown proposer reward {name!r}")


def grouped_advantages(
    rewards: np.ndarray, keys: Sequence[Any], mode: str, eps: float = 1e-6
) -> np.ndarray:
    """``[G, J]`` advantages with a baseline shared by the groups of equal ``keys[g]`` (NaN
    rewards: advantage 0, and left out of the statistics):

    * "hrpo" (Dr. Zero): ``(r − mean_key) / (std_key + eps)``, mean and std over every rollout of
      the key's groups (its hop count's groups; ours: the role's task type);
    * "trr++" (Absolute Zero's Task-Relative REINFORCE++): ``(r − mean_key) / (std + eps)``, the
      baseline per key (task type x role) and ONE std over all the step's centred rewards."""
    r = np.asarray(rewards, np.float64)
    valid = ~np.isnan(r)
    centred = np.zeros_like(r)
    scaled = np.zeros_like(r)
    for key in dict.fromkeys(keys):
        rows = np.array([k == key for k in keys])
        sel = rows[:, None] & valid
        if not sel.any():
            continue
        x = r[sel]
        centred[sel] = x - x.mean()
        scaled[sel] = (x - x.mean()) / (x.std() + eps)
    if mode == "hrpo":
        return scaled
    if mode == "trr++":
        return centred / ((centred[valid].std() if valid.any() else 0.0) + eps)
    raise ValueError(f"grouped_advantages: mode must be 'hrpo' or 'trr++', got {mode!r}")


def _seed_match(a: Sequence[Trajectory], b: Sequence[Trajectory] | None) -> float:
    """The share of the first min(len) pairs of ``a`` and ``b`` on the same seed; NaN without a
    partner or where the engine reports no seeds."""
    pairs = list(zip(a, b or ()))
    if not pairs or any(x.seed is None or y.seed is None for x, y in pairs):
        return math.nan
    return float(np.mean([x.seed == y.seed for x, y in pairs]))


def _scores_for(c: int, cfg: AriseRLConfig) -> np.ndarray:
    """K solver rewards with exactly c successes (R_G reads only c)."""
    return np.array([1.0] * c + [0.0] * (cfg.k_attempts - c))


def _score_of(t: Trajectory) -> GeneratorScore:
    info = t.info["arise_rl"]
    return GeneratorScore(
        reward=info["r_g"], fmt_reason=info["fmt_reason"], tool=info["tool"], task=None,
        question=info["question"], c=info["c"],
    )  # fmt: skip


def _with_prompt(task: Task, prompt: Messages) -> Task:
    return dataclasses.replace(task, prompt=tuple(Message(m["role"], m["content"]) for m in prompt))


def _task_from_record(
    domain: GeneratorDomain,
    rec: Mapping[str, Any],
    by_id: Mapping[str, Task],
    forbidden: frozenset[str],
) -> Task:
    """A pool task back from its record: a generated one re-parsed by the generator domain, a
    domain task by id."""
    task = domain.task_from_record(rec, forbidden)
    if task is not None:
        return task
    if rec["id"] not in by_id:
        raise ValueError(
            f"arise_rl state: pool task {rec['id']!r} is not a training task of the domain"
        )
    return by_id[rec["id"]]


def generator_metrics(infos: Sequence[Mapping[str, Any]], k: int) -> dict[str, float]:
    """Format / tool / difficulty rates, the parse reasons' shares and the c distribution."""
    n = len(infos)
    fmt = [i["fmt_reason"] is None for i in infos]
    tool = [bool(i["tool"]) for i in infos]
    cs = [i["c"] for i in infos if i["c"] is not None]
    m = {
        "generator/fmt_rate": float(np.mean(fmt)),
        "generator/tool_rate": float(np.mean(tool)),
        "generator/gates_rate": float(np.mean([f and t for f, t in zip(fmt, tool)])),
        "generator/r_g": float(np.mean([i["r_g"] for i in infos])),
        "generator/solved": float(len(cs)) / n,
    }
    reasons = collections.Counter(i["fmt_reason"] for i in infos if i["fmt_reason"] is not None)
    m.update({f"generator/reason/{r}": v / n for r, v in sorted(reasons.items())})
    if cs:
        c = np.asarray(cs, np.float64)
        m["generator/c_mean"] = float(c.mean())
        m["generator/difficulty_rate"] = float(np.mean((c > 0) & (c < k)))
        m["generator/all_solved"] = float(np.mean(c == k))
        m["generator/none_solved"] = float(np.mean(c == 0))
        for v in range(k + 1):
            m[f"generator/c/{v}"] = float(np.mean(c == v))
    return m


# --- the pipeline (the arise_rl Method's) --------------------------------------------------------


def assign_roles(rollouts: Rollouts, env_name: str) -> Rollouts:
    """After the default ``sample``: a generator task's group (its task's ``env_name`` is the
    generator domain's, ``GeneratorDomain.env_name``) has the generator role."""
    for g in rollouts.groups:
        if g.task.env_name == env_name:
            g.role = "generator"
    return rollouts


def pipeline(controller: AriseRLController) -> Any:
    """ARISE-RL's step over its controller: sample (+ roles) → decorate → generate (generator
    groups: agent episodes with the lookup tool, trained) → judge → attempts (parse, gates, K
    solver attempts: never trained) → reward → advantage → observe → memory (RG-SED's memory
    rollouts: never trained; Δr) → select → teacher (the memory in the prompt) → gate."""
    from rubric_rl import step
    from rubric_rl.services import TRAIN_STREAM

    def sample_roles(rollouts: Rollouts | None, ctx: Any) -> Rollouts:
        return assign_roles(step.sample(rollouts, ctx), controller.generator_domain.env_name)

    def generate_roles(rollouts: Rollouts, ctx: Any) -> Rollouts:
        """Generator groups get trained agent episodes over the generator's tool environment
        (the default ``generate`` then skips them)."""
        todo = [g for g in rollouts.groups if g.role == "generator" and not g.trajectories]
        if todo:
            n = int(ctx.config.rollout.samples_per_task)
            ids, trajs = controller._run_generator([g.task for g in todo], n, TRAIN_STREAM)
            for g, p, ts in zip(todo, ids, trajs, strict=True):
                g.prompt_ids, g.trajectories = tuple(p), list(ts)
        return step.generate(rollouts, ctx)

    def attempts(rollouts: Rollouts, ctx: Any) -> Rollouts:
        """R_G's inputs for the generator groups: parse, gates, K solver attempts (never
        trained)."""
        controller.score_generator_groups(rollouts, step.VERIFIER_SIGNAL)
        return rollouts

    def memory(rollouts: Rollouts, ctx: Any) -> Rollouts:
        """RG-SED's memories and memory rollouts (measurement only) and Δr, when SD is on; the
        effective λ per role (``rgsed/<role>/lambda_mean``: λ0 = ``loss.sd_coef`` × the mean
        multiplier over the role's groups, ``lambda_active_frac``: the share above 0.5 λ0)."""
        if ctx.needs_teacher:
            m = controller.run_rgsed(rollouts)
            lambda0 = float(ctx.config.loss.sd_coef)
            for role in ROLES:
                if f"rgsed/{role}/lambda_ratio" in m:
                    m[f"rgsed/{role}/lambda_mean"] = lambda0 * m[f"rgsed/{role}/lambda_ratio"]
            ctx.metrics.update({f"arise_rl/{k}": v for k, v in m.items()})
        return rollouts

    def teacher(rollouts: Rollouts, ctx: Any) -> Rollouts:
        """Every trained rollout of a group with memory: the teacher prompt with m."""
        if ctx.needs_teacher:
            controller.set_teachers(rollouts)
        return rollouts

    return (
        step.default_pipeline()
        .replace("sample", sample_roles)
        .replace("generate", generate_roles)
        .insert_after("judge", "attempts", attempts)
        .insert_after("observe", "memory", memory)
        .replace("teacher", teacher)
    )


__all__ = [
    "SIGNAL",
    "AriseRLConfig",
    "AriseRLController",
    "GeneratorScore",
    "Phase",
    "assign_roles",
    "final_turn_mask",
    "generator_memory",
    "generator_metrics",
    "met_matrix",
    "phase",
    "pipeline",
    "solver_rewards",
]
