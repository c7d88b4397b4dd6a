"""HarnessRL's harness proposer (§2.3): the label selects the interface, the proposer selects
the update — one candidate or noop per interface and step, a = (a_p, a_g, a_c).

The programmatic proposer (rule-judged domains; every choice below is ours where the seed is
silent, and the LLM proposer makes the same choices with a judge model):

- **Sampling** (task diagnosed saturated): ``reweight(i, γ_{ℓ+1})``, one level down; noop at
  the lowest level.
- **Rollout** (a blind criterion; by expected gain, ``blind_targets``; a target whose weight is
  below the rollout band's lower bound is never proposed): ``add(f)`` of the first field in
  ``<criterion>``, ``<reference>``, ``<critique>`` order that is free, under the cap, and was
  not rejected for this criterion within the task's last ``retry_after`` draws and whose
  prompt fits the model's prompt length (``ProposalContext.fits``) (rejected
  candidates return with their measurement: the next proposal tries the next field).
  ``<criterion>`` states the target criterion (``hint``) — a conjunction criterion (a rule
  whose checker takes ``parts``, e.g. "meets every rule of the task at once") is stated by its
  failing parts instead (``conjunction_parts``: the rubric's criteria that check a part, least
  satisfied first, at most 3), since its own text names no behaviour; ``<reference>`` needs a
  donor — a
  response that satisfied the target in this task's history or, from the memory, a related
  criterion of another task (cross-task donor), with a failing rollout of this group as the
  negative; ``<critique>`` names the criteria most of the previous group missed (a
  conjunction's failing parts in its place). Secondary: a
  ``drop(f)`` of every mounted field whose target criterion has left blind. With no blind
  criterion, the drops alone are the candidate.
- **Rubric** (a spurious criterion; the most confident first): an anchor is only reweighted
  (halved; never a task's only positive anchor, whose share the Λ rescale restores); another
  criterion is rewritten into a library criterion of the task that checks something its rubric
  does not yet check (the checker library parameterised from the prompt),
  weighted at least as the median positive criterion of the task,
  else turned into a pitfall (its cue penalised, λ → −|λ|), else deleted; an operation that
  was rejected for this criterion within ``retry_after`` draws, or (with memory) that would
  restore the state an accepted update replaced within the task's previous two draws (a
  reversal), is skipped for the next. Secondary operations: delete a non-anchor criterion that
  passes on generic content and is saturated; when the task is saturated, create one library
  criterion the rubric lacks (tightening).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rubric_rl.methods.harness_rl.attributor import TaskAttribution
from rubric_rl.methods.harness_rl.interfaces import GUIDANCE_FIELDS
from rubric_rl.methods.harness_rl.rubric_ops import RubricOp, checks_the_same
from rubric_rl.rubrics.types import Criterion, Task

INTERFACES = ("sampling", "rollout", "rubric")


@dataclasses.dataclass(frozen=True)
class GuidanceOp:
    op: str  # add / drop
    field: str
    text: str = ""
    target: str | None = None  # the criterion it is for
    donor: str | None = None  # "task/criterion" of a cross-task <reference> donor

    def __post_init__(self):
        if self.op not in ("add", "drop"):
            raise ValueError(f"guidance op {self.op!r}: expected add or drop")
        if self.field not in GUIDANCE_FIELDS:
            raise ValueError(f"guidance field {self.field!r}: expected one of {GUIDANCE_FIELDS}")
        if self.op == "add" and not self.text.strip():
            raise ValueError(f"guidance add({self.field}) needs a text")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One interface's candidate update for one task."""

    interface: str
    task_id: str
    label: str  # the label that motivated its primary operation
    target: str | None  # the criterion (or, for sampling, the task) it addresses
    guidance: tuple[GuidanceOp, ...] = ()
    rubric: tuple[RubricOp, ...] = ()
    level: int | None = None  # sampling: the task's new level index
    grounded: bool = False  # built on evidence retrieved from the memory above the floor

    def __post_init__(self):
        if self.interface not in INTERFACES:
            raise ValueError(f"candidate interface {self.interface!r}: expected {INTERFACES}")

    @property
    def drop_only(self) -> bool:
        return bool(self.guidance) and all(g.op == "drop" for g in self.guidance)

    @property
    def kind(self) -> str:
        """The primary operation: reweight (sampling), add/drop, or the first rubric op."""
        if self.interface == "sampling":
            return "reweight"
        if self.interface == "rollout":
            return "drop" if self.drop_only else "add"
        return self.rubric[0].op

    def to_json(self) -> dict[str, Any]:
        return {
            "interface": self.interface,
            "task_id": self.task_id,
            "label": self.label,
            "target": self.target,
            "kind": self.kind,
            "guidance": [dataclasses.asdict(g) for g in self.guidance],
            "rubric": [op.to_json() for op in self.rubric],
            "level": self.level,
            "grounded": self.grounded,
        }


@dataclasses.dataclass(frozen=True)
class ProposalContext:
    """What the proposer knows of one task at one step."""

    task: Task
    criteria: tuple[Criterion, ...]
    fields: Mapping[str, Mapping[str, Any]]  # mounted field -> {"text", "target", ...}
    level: int
    n_levels: int
    cap: int
    responses: tuple[str, ...]
    satisfied: Mapping[str, tuple[float, ...]]  # criterion id -> per-rollout satisfied (NaN)
    # (field or op, target criterion) pairs rejected within the task's last retry_after draws
    rejected: frozenset[tuple[str, str]] = frozenset()
    # criterion id -> states (verifier, weight sign) that accepted updates replaced within the
    # task's previous two draws: restoring one would reverse an update
    replaced: Mapping[str, frozenset[tuple[Any, bool]]] = dataclasses.field(default_factory=dict)
    # criterion id -> (response text, "task/criterion" donor or None) satisfying it
    donors: Mapping[str, tuple[str, str | None]] = dataclasses.field(default_factory=dict)
    generic_pass: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    # The rollout band's lower bound (points): a target whose weight is below it cannot move the
    # group's reward measurably even if every rollout came to meet it, so it is never measured.
    min_points: float = 0.0
    # Whether the prompt with these mounted fields (field -> text) fits the model's prompt
    # length; None: no check. A field that does not fit is skipped for the next.
    fits: Callable[[Mapping[str, str]], bool] | None = None


def criterion_state(c: Criterion) -> tuple[Any, bool]:
    """What a criterion checks, and its sign: equal states check the same thing."""
    return (c.verifier if c.verifier.checker else c.text.strip(), c.weight > 0)


def expected_gain(weight: float, reach: float) -> float:
    """Points a guidance field can add at most: the target's weight × the share of rollouts
    that miss it (1 − reach; an undefined reach counts as 0)."""
    r = 0.0 if reach != reach else float(reach)
    return float(weight) * (1.0 - r)


MAX_PARTS = 3  # a conjunction's failing parts stated in one field (ours)


def _same_args(a, b) -> bool:
    try:
        return dict(a) == dict(b)
    except (TypeError, ValueError):
        return a == b


def conjunction_parts(
    target: Criterion,
    criteria: Sequence[Criterion],
    satisfied: Mapping[str, Sequence[float]],
) -> list[Criterion]:
    """The criteria of ``criteria`` that check a part of the conjunction ``target`` (a rule
    whose checker takes ``parts``: (checker, args) pairs; a negative criterion checks the part
    with its arguments whatever the part's checker, which states the exclusion) and that some
    rollout of the group missed, least satisfied first (then rubric order); [] when ``target``
    is not a conjunction."""
    parts = target.verifier.kwargs.get("parts") if target.verifier.checker else None
    if not parts:
        return []
    out = []
    for k, c in enumerate(criteria):
        if c.id == target.id or not c.verifier.checker:
            continue
        hit = any(
            _same_args(c.verifier.args, args) and (c.verifier.checker == checker or c.weight < 0)
            for checker, args in parts
        )
        if not hit:
            continue
        s = [x for x in satisfied.get(c.id, ()) if x == x]
        reach = sum(s) / len(s) if s else 0.0
        if reach < 1.0:
            out.append((reach, k, c))
    return [c for _, _, c in sorted(out, key=lambda x: x[:2])]


def blind_targets(
    att: TaskAttribution, criteria: Sequence[Criterion], min_points: float = 0.0
) -> list:
    """The blind labels worth a guidance field, best first (ours): positive criteria whose weight
    (points after the Λ rescale) reaches ``min_points``, ranked by expected gain (weight ×
    (1 − reach)), ties by rarity — the label's confidence, which rises with the consecutive
    groups that missed it — then by the criterion's place in the rubric, never by its id."""
    pos = {c.id: (k, c) for k, c in enumerate(criteria)}
    out = []
    for lab in att.labels:
        if lab.label != "blind" or lab.criterion_id not in pos:
            continue
        k, c = pos[lab.criterion_id]
        if c.weight <= 0 or c.weight < min_points:
            continue
        out.append((-expected_gain(c.weight, lab.satisfied_rate), -lab.confidence, k, lab))
    return [x[-1] for x in sorted(out, key=lambda x: x[:3])]


class ProgrammaticProposer:
    """Rule-based proposer over a domain's guidance wording and checker library."""

    def __init__(
        self,
        *,
        hint: Callable[[str, float], str],
        reference: Callable[[str | None, str | None], str],
        critique: Callable[[Sequence[str]], str],
        library: Callable[[Task], Sequence[Criterion]] | None = None,
        interfaces: Sequence[str] = INTERFACES,
    ):
        bad = [i for i in interfaces if i not in INTERFACES]
        if bad:
            raise ValueError(f"harness.interfaces {bad}: expected a subset of {INTERFACES}")
        self.hint, self.reference, self.critique = hint, reference, critique
        self.library = library
        self.interfaces = tuple(interfaces)

    def propose(self, ctx: ProposalContext, att: TaskAttribution) -> dict[str, Candidate | None]:
        out: dict[str, Candidate | None] = {i: None for i in INTERFACES}
        if "sampling" in self.interfaces:
            out["sampling"] = self._sampling(ctx, att)
        if "rollout" in self.interfaces:
            out["rollout"] = self._rollout(ctx, att)
        if "rubric" in self.interfaces:
            out["rubric"] = self._rubric(ctx, att)
        return out

    # ------------------------------------------------------------------ sampling

    def _sampling(self, ctx: ProposalContext, att: TaskAttribution) -> Candidate | None:
        if not att.task_saturated or ctx.level + 1 >= ctx.n_levels:
            return None
        return Candidate("sampling", ctx.task.id, "saturated", ctx.task.id, level=ctx.level + 1)

    # ------------------------------------------------------------------ rollout guidance

    def _rollout(self, ctx: ProposalContext, att: TaskAttribution) -> Candidate | None:
        labels = {c.criterion_id: c for c in att.labels}
        drops = tuple(
            GuidanceOp("drop", f, target=info.get("target"))
            for f, info in ctx.fields.items()
            if info.get("target") is not None
            and labels.get(info["target"]) is not None
            and labels[info["target"]].label != "blind"
        )
        free = ctx.cap - (len(ctx.fields) - len(drops))
        crit = {c.id: c for c in ctx.criteria}
        kept = {f: v["text"] for f, v in ctx.fields.items() if f not in {d.field for d in drops}}
        for lab in blind_targets(att, ctx.criteria, ctx.min_points):
            if free <= 0:
                break
            target = crit[lab.criterion_id]
            for field in GUIDANCE_FIELDS:
                if field in kept:
                    continue
                if (field, target.id) in ctx.rejected:
                    continue
                op = self._add(field, target, ctx)
                if op is None or (ctx.fits is not None and not ctx.fits({**kept, field: op.text})):
                    continue
                grounded = op.donor is not None
                return Candidate(
                    "rollout", ctx.task.id, "blind", target.id, (*drops, op), grounded=grounded
                )
        if drops:
            return Candidate("rollout", ctx.task.id, "agree", drops[0].target, drops)
        return None

    def _stated(self, c: Criterion, ctx: ProposalContext) -> list[str]:
        """The hints that state ``c``: its failing parts' for a conjunction, else its own."""
        parts = conjunction_parts(c, ctx.criteria, ctx.satisfied)[:MAX_PARTS]
        return [self.hint(x.text, x.weight) for x in (parts or [c])]

    def _add(self, field: str, target: Criterion, ctx: ProposalContext) -> GuidanceOp | None:
        if field == "criterion":
            return GuidanceOp("add", field, " ; ".join(self._stated(target, ctx)), target.id)
        if field == "reference":
            good = ctx.donors.get(target.id)
            if good is None:
                return None
            sat = ctx.satisfied.get(target.id, ())
            bad = next((r for r, s in zip(ctx.responses, sat, strict=False) if s == 0.0), None)
            return GuidanceOp("add", field, self.reference(good[0], bad), target.id, good[1])
        # critique: the criteria most of the group missed (the target first)
        missed = [target]
        for c in ctx.criteria:
            s = [x for x in ctx.satisfied.get(c.id, ()) if x == x]
            if c.id != target.id and s and sum(s) / len(s) < 0.5:
                missed.append(c)
        hints = [h for c in missed for h in self._stated(c, ctx)]
        return GuidanceOp("add", field, self.critique(list(dict.fromkeys(hints))[:3]), target.id)

    # ------------------------------------------------------------------ rubric

    def _rubric(self, ctx: ProposalContext, att: TaskAttribution) -> Candidate | None:
        crit = {c.id: c for c in ctx.criteria}
        labels = {c.criterion_id: c for c in att.labels}
        spurious = sorted(
            (c for c in att.labels if c.label == "spurious" and c.criterion_id in crit),
            key=lambda c: (-c.confidence, c.criterion_id),
        )
        primary: RubricOp | None = None
        target = None
        for lab in spurious:
            primary = self._fix_spurious(crit[lab.criterion_id], ctx)
            if primary is not None:
                target = lab.criterion_id
                break
        ops = [primary] if primary is not None else []
        touched = set(primary.targets) if primary is not None else set()
        # Secondary: delete a saturated criterion that passes on generic content.
        for cid, lab in labels.items():
            c = crit.get(cid)
            if c is None or c.anchor or cid in touched or len(crit) - len(touched) <= 1:
                continue
            if lab.label == "saturated" and ctx.generic_pass.get(cid):
                if ("delete", cid) not in ctx.rejected:
                    ops.append(RubricOp("delete", (cid,), reason="saturated generic pass"))
                    touched.add(cid)
                    break
        # Secondary: tighten a saturated task with a criterion its rubric lacks.
        if att.task_saturated:
            new = self._missing_library(ctx, exclude=[o.new for o in ops])
            if new is not None and ("create", new.id) not in ctx.rejected:
                ops.append(RubricOp("create", (), (new,), reason="tighten a saturated task"))
        if not ops:
            return None
        label = "spurious" if primary is not None else "saturated"
        if target is None:
            first = ops[0]
            target = first.targets[0] if first.targets else first.new[0].id
        return Candidate("rubric", ctx.task.id, label, target, rubric=tuple(ops))

    def _fix_spurious(self, c: Criterion, ctx: ProposalContext) -> RubricOp | None:
        replaced = ctx.replaced.get(c.id, frozenset())
        if c.anchor:
            if ("reweight", c.id) in ctx.rejected:
                return None
            others = [x for x in ctx.criteria if x.anchor and x.weight > 0 and x.id != c.id]
            if c.weight > 0 and not others:
                # The anchors hold a fixed share of Λ: the rescale gives a task's only positive
                # anchor its weight back, so halving it would change nothing.
                return None
            return RubricOp("reweight", (c.id,), weight=c.weight / 2, reason="spurious anchor")
        new = self._missing_library(ctx)
        if (
            new is not None
            and ("rewrite", c.id) not in ctx.rejected
            and criterion_state(new) not in replaced
        ):
            # A surface cue's weight is small by design; the requirement that replaces it
            # counts like the task's others: at least their median positive weight (ours).
            pos = sorted(x.weight for x in ctx.criteria if x.weight > 0)
            weight = max(abs(c.weight), pos[len(pos) // 2] if pos else abs(c.weight))
            new = new.replace(weight=weight, id=f"{c.id}>{new.id}")
            return RubricOp("rewrite", (c.id,), (new,), reason="spurious: check the requirement")
        if c.weight > 0 and ("reweight", c.id) not in ctx.rejected:
            flipped = (c.verifier if c.verifier.checker else c.text.strip(), False)
            if flipped not in replaced:
                return RubricOp(
                    "reweight", (c.id,), weight=-abs(c.weight), reason="penalise the cue"
                )
        if ("delete", c.id) not in ctx.rejected and len(ctx.criteria) > 1:
            return RubricOp("delete", (c.id,), reason="spurious")
        return None

    def _missing_library(self, ctx: ProposalContext, exclude=()) -> Criterion | None:
        """The first library criterion of the task that no current criterion checks and whose
        id is free: a library check the rubric already holds under its ``lib:`` id in another
        state (e.g. penalised by an earlier reweight) was dealt with, and is not added again."""
        if self.library is None:
            return None
        taken = [n for group in exclude for n in group]
        ids = {c.id for c in (*ctx.criteria, *taken)}
        for cand in self.library(ctx.task):
            if cand.weight <= 0 or f"lib:{cand.id}" in ids:
                continue
            if any(checks_the_same(cand, c) for c in (*ctx.criteria, *taken)):
                continue
            return cand.replace(id=f"lib:{cand.id}", tags=(), origin="library")
        return None


__all__ = [
    "INTERFACES",
    "Candidate",
    "GuidanceOp",
    "ProgrammaticProposer",
    "ProposalContext",
    "blind_targets",
    "conjunction_parts",
    "criterion_state",
    "expected_gain",
]
