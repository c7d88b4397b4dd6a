"""ARISE reflection roles: read recent rollout evidence, propose rubric–skill pairs, refine skills.

ARISE (seed 000, "Rubric–Skill Co-Evolution"): "A reflection model uses recent rollout evidence to
discover emerging gaps and add new pairs"; "persistent failures prompt refinement". Two
implementations share the ``Reflection`` interface:

- ``ProgrammaticReflection`` (verifiable domains, e.g. the embedded constraint domain): a
  data-driven miner. Its candidate bank is derived from the window's tasks: with
  ``AriseConfig.bank="library"`` (``"auto"`` on a domain that has one) the domain's checker
  library read from each task's prompt (``envs/constraint_library.py``: every stated clause and
  the implicit requirements no seed criterion states), with ``"seed_rubric"`` every
  rule-verified criterion of the task's own rubric; keyed ``<task type>/<capability>/<criterion
  id>``, with a capability the task declares (the pool targets task-type × capability cells, so
  a criterion without one has nothing to target). Each candidate's checker is run on every rollout
  of the window and the candidates are ranked by how well their verdict separates failed from
  successful rollouts:
  ``separation = P̂(sat | success) − P̂(sat | failure)``, both Laplace-smoothed
  (``(k + 1) / (n + 2)``), so with no success yet in the window the criteria most often failed by
  the failures still rank first. "sat" means met (positive weight) or absent (pitfall). A candidate
  needs ``min_support`` evaluations of which ``min_failures`` on failed rollouts and a separation
  ≥ ``min_separation``; a candidate whose verdict agrees with the task outcome on at least
  ``redundant_agreement`` of a window holding both outcomes only restates the verifier (it rewards
  no partial progress) and is skipped. Ties: more failures explained first, then the key.
  Refinement makes the skill more specific by citing the criterion the window shows failing on the
  task itself (the ``{criterion}`` placeholder is filled per task at decoration time).

  Three rankings (``rank``). ``"progress_mass"`` (the default) and ``"progress"`` follow ARISE's
  "rubrics evolve to reward partial behavioral progress" where the task reward is silent: a group
  whose rollouts all failed the task (a failing group) has zero task advantage, and a criterion
  helps there only if its verdict varies inside the group. A candidate's score is its mean
  within-group verdict variance ``q_g (1 − q_g)`` over the window's failing groups of at least two
  judged rollouts (``q_g`` its satisfied share in group g; a group = one task in one step) for
  ``"progress"``, its sum ``Σ_g q_g (1 − q_g)`` for ``"progress_mass"`` (a criterion giving ten
  failing groups a signal outranks one giving one group the same), and it must show partial progress
  (satisfied by at least one failed rollout) and a variance above ``min_progress_variance``. So a
  criterion no rollout meets (which the separation score ranks first when nothing succeeds yet: it
  fails every failure) is never proposed; it would hold a slot without giving any group a signal.
  Ours: the seed states the goal, not this statistic. ``"separation"`` is the previous ranking (by
  separation, as above), kept as an ablation.
- ``LLMReflection`` (``reflection_llm.py``, re-exported here): a versioned prompt through the
  ``LLMClient``; the reply is validated strictly (like judge output) and a reply with any invalid
  or duplicate pair is rejected whole — never half-applied.

Rollout evidence reaches a reflection as ``RolloutRecord`` values; proposals come back as
``Proposal`` values that the pool (``controllers/arise.py``) turns into entries. Those types, the
``Reflection`` interface and the ``REFLECTIONS`` registry live in ``reflection_base.py`` (shared
with the pool and the LLM reflection, which import neither this module nor each other) and are
re-exported here with the LLM reflection's names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from rubric_rl.methods.arise.reflection_base import (  # noqa: F401  (re-exported API)
    CRITERION_SLOT,
    MISSED_PREFIX,
    REFLECTIONS,
    REMEMBER_PREFIX,
    CriteriaBank,
    PoolPair,
    Proposal,
    Reflection,
    RolloutRecord,
    failing_records,
    fill_skill,
    guidance_hint,
    satisfied,
    seed_rubric_bank,
)
from rubric_rl.methods.arise.reflection_llm import (  # noqa: F401  (re-exported API)
    REFLECTION_TEMPLATES,
    LLMReflection,
    ReflectionTemplate,
    parse_proposals,
    parse_refinement,
)
from rubric_rl.rubrics.judges import ProgrammaticJudge
from rubric_rl.rubrics.types import Criterion, Task, VerifierKind

# --- programmatic reflection ---------------------------------------------------------------------


RANKINGS = ("progress_mass", "progress", "separation")


@dataclasses.dataclass(frozen=True)
class CandidateScore:
    """Separation statistics of one candidate over the window (see module docstring)."""

    key: str
    n_success: int
    n_failure: int
    sat_success: int
    sat_failure: int
    fail_groups: int = 0  # failing groups (no success) with >= 2 judged rollouts of this one
    fail_group_variance: float = 0.0  # mean q_g (1 - q_g) over those groups

    @property
    def fail_group_mass(self) -> float:
        """Σ_g q_g (1 − q_g) over the failing groups: the rubric signal the candidate would give
        the window's failing groups in all (the mean times how many groups it reaches)."""
        return self.fail_group_variance * self.fail_groups

    @property
    def support(self) -> int:
        return self.n_success + self.n_failure

    @property
    def failures_explained(self) -> int:
        return self.n_failure - self.sat_failure

    @property
    def separation(self) -> float:
        # Laplace-smoothed P(sat | success) − P(sat | failure).
        ps = (self.sat_success + 1.0) / (self.n_success + 2.0)
        pf = (self.sat_failure + 1.0) / (self.n_failure + 2.0)
        return ps - pf

    @property
    def agreement(self) -> float:
        """Fraction of rollouts where sat == success (1.0 = restates the verifier)."""
        agree = self.sat_success + (self.n_failure - self.sat_failure)
        return agree / self.support if self.support else 0.0

    @property
    def mutual_information(self) -> float:
        """Plug-in I(sat; success) in bits, reported with the evidence."""
        n = self.support
        if not n:
            return 0.0
        cells = {
            (1, 1): self.sat_success,
            (0, 1): self.n_success - self.sat_success,
            (1, 0): self.sat_failure,
            (0, 0): self.n_failure - self.sat_failure,
        }
        px = {x: (cells[(x, 1)] + cells[(x, 0)]) / n for x in (0, 1)}
        py = {1: self.n_success / n, 0: self.n_failure / n}
        mi = 0.0
        for (x, y), k in cells.items():
            if k:
                pxy = k / n
                mi += pxy * math.log2(pxy / (px[x] * py[y]))
        return mi


@REFLECTIONS.register("programmatic")
class ProgrammaticReflection(Reflection):
    """Mines checker-backed criteria that separate failed from successful rollouts.

    Args:
      skill_texts: capability -> base skill text (the domain's ``Domain.skill_texts``: the
        embedded domain's is the wording its warm-start corpus teaches; default none). A
        capability without a text gets the criterion itself as its skill.
      min_support, min_failures, min_separation, redundant_agreement: see the module docstring.
      rank: ``"progress"`` (within-group variance over failing groups) or ``"separation"``.
      min_progress_variance: ``"progress"`` proposes only candidates whose score exceeds it.
    """

    name = "programmatic"

    def __init__(
        self,
        skill_texts: Mapping[str, str] | None = None,
        *,
        min_support: int = 8,
        min_failures: int = 4,
        min_separation: float = 0.1,
        redundant_agreement: float = 0.98,
        rank: str = "progress_mass",
        min_progress_variance: float = 0.0,
        bank: CriteriaBank = seed_rubric_bank,
    ):
        if rank not in RANKINGS:
            raise ValueError(
                f"ProgrammaticReflection: rank must be one of {RANKINGS}, got {rank!r}"
            )
        self.skill_texts = dict(skill_texts or {})
        self.min_support = int(min_support)
        self.min_failures = int(min_failures)
        self.min_separation = float(min_separation)
        self.redundant_agreement = float(redundant_agreement)
        self.rank_by = rank
        self.min_progress_variance = float(min_progress_variance)
        self.bank = bank
        self._judge = ProgrammaticJudge()

    def candidates(self, task: Task) -> list[tuple[str, Criterion]]:
        """The bank's rule-checked criteria for the task that can target one of its capability
        cells (``bank``: the task's own rubric, or the domain's checker library)."""
        out = []
        for c in self.bank(task):
            if c.verifier.kind != VerifierKind.RULE or not c.capability:
                continue
            if c.capability not in task.capabilities:
                continue
            out.append((f"{task.task_type}/{c.capability}/{c.id}", c))
        return out

    def score_candidates(self, records: Sequence[RolloutRecord]) -> dict[str, CandidateScore]:
        counts: dict[str, list[int]] = {}
        # (step, task id) -> key -> [satisfied flags of its failed rollouts]; None = a success.
        groups: dict[tuple[int, str], dict[str, list[bool]] | None] = {}
        for rec in records:
            if rec.success is None:
                continue
            gid = (int(rec.step), rec.task.id)
            if rec.success:
                groups[gid] = None
            elif gid not in groups:
                groups[gid] = {}
            for key, crit in self.candidates(rec.task):
                met = self._judge.check(rec.task, rec.response, crit).met
                if met is None:
                    continue  # a failed check is no evidence either way
                c = counts.setdefault(key, [0, 0, 0, 0])
                sat = satisfied(met, crit.weight)
                if rec.success:
                    c[0] += 1
                    c[2] += sat
                else:
                    c[1] += 1
                    c[3] += sat
                    if groups[gid] is not None:
                        groups[gid].setdefault(key, []).append(bool(sat))
        var: dict[str, list[float]] = {}
        for per_key in groups.values():
            for key, sats in (per_key or {}).items():
                if len(sats) >= 2:
                    q = sum(sats) / len(sats)
                    var.setdefault(key, []).append(q * (1.0 - q))
        out = {}
        for k, c in counts.items():
            v = var.get(k, [])
            out[k] = CandidateScore(k, *c, len(v), sum(v) / len(v) if v else 0.0)
        return out

    def eligible(self, s: CandidateScore) -> bool:
        if s.support < self.min_support or s.n_failure < self.min_failures:
            return False
        if self.rank_by in ("progress", "progress_mass"):
            if s.sat_failure == 0 or s.fail_group_variance <= self.min_progress_variance:
                return False  # no partial progress among failures, or no signal inside a group
        elif s.separation < self.min_separation:
            return False
        both = s.n_success > 0 and s.n_failure > 0
        return not (both and s.agreement >= self.redundant_agreement)

    def rank(self, records: Sequence[RolloutRecord]) -> list[CandidateScore]:
        """Eligible candidates, best first: by the summed (``progress_mass``) or mean
        (``progress``) within-failing-group variance, or by separation; ties by failures
        explained, then the key."""
        scores = [s for s in self.score_candidates(records).values() if self.eligible(s)]
        if self.rank_by == "progress_mass":
            return sorted(scores, key=lambda s: (-s.fail_group_mass, -s.failures_explained, s.key))
        if self.rank_by == "progress":
            return sorted(
                scores, key=lambda s: (-s.fail_group_variance, -s.failures_explained, s.key)
            )
        return sorted(scores, key=lambda s: (-s.separation, -s.failures_explained, s.key))

    def base_skill(self, capability: str) -> str:
        return self.skill_texts.get(capability, CRITERION_SLOT)

    def propose(
        self,
        records: Sequence[RolloutRecord],
        pool: Sequence[PoolPair],
        *,
        max_new: int,
        step: int,
        exclude_keys: frozenset[str] = frozenset(),
    ) -> list[Proposal]:
        taken = {e.key for e in pool} | set(exclude_keys)
        example: dict[str, Criterion] = {}
        for rec in records:
            for key, crit in self.candidates(rec.task):
                example.setdefault(key, crit)
        out: list[Proposal] = []
        for s in self.rank(records):
            if len(out) >= max_new:
                break
            if s.key in taken:
                continue
            crit = example[s.key]
            task_type = s.key.split("/", 1)[0]
            out.append(
                Proposal(
                    key=s.key,
                    text=crit.text,
                    skill=self.base_skill(crit.capability),
                    capability=crit.capability,
                    task_types=(task_type,),
                    weight=crit.weight,
                    source_id=crit.id,
                    evidence={
                        "rank": self.rank_by,
                        "fail_group_variance": round(s.fail_group_variance, 6),
                        "fail_group_mass": round(s.fail_group_mass, 6),
                        "fail_groups": s.fail_groups,
                        "separation": round(s.separation, 6),
                        "mutual_information": round(s.mutual_information, 6),
                        "support": s.support,
                        "failures": s.n_failure,
                        "failures_explained": s.failures_explained,
                    },
                )
            )
        return out

    def refine(self, entry: PoolPair, records: Sequence[RolloutRecord], *, step: int) -> str | None:
        """Level 1 cites the failing criterion after the capability skill ("the last answers
        missed : <criterion>"); level 2 also leads with it ("remember : <criterion>"). Needs at
        least one observed failure of the entry's own rubric in the window."""
        if not failing_records(records, entry):
            return None
        base = self.base_skill(entry.capability)
        if entry.refinements == 0:
            return f"{base} ; {MISSED_PREFIX} {CRITERION_SLOT}"
        if entry.refinements == 1:
            return f"{REMEMBER_PREFIX} {CRITERION_SLOT} ; {base} ; {MISSED_PREFIX} {CRITERION_SLOT}"
        return None
