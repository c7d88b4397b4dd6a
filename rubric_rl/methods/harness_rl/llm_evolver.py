"""HarnessRL's LLM attributor and proposer (real runs): the same interfaces as the programmatic
ones (``attribute(...) -> TaskAttribution``, ``propose(ctx, att) -> {interface: Candidate}``),
asked of a model through the ``LLMClient`` with versioned prompts and strictly validated replies.

What is computed, not asked: the satisfied rates, the discriminative mass, the confidence
1 − 2^−k of a label held for k recorded groups (as the programmatic attributor), the
``+``/``−`` side of a quoted rollout. What is asked: each criterion's label (the seed's three
questions: reach, training stage, reward hacking), the hack patterns, verbatim quotes, the
wording phrase that permits a surface pass, whether the task is saturated; and one candidate or
null per interface.

Validation, as the judge's (``rubrics/judges.py``) and ARISE's reflection: JSON (a fenced block
is accepted) of exactly the documented shape. A reply is rejected WHOLE — nothing of it is used —
when a criterion is labelled twice or not at all, a label / hack / field / operation is unknown,
a quote is not a verbatim part of a rollout, a wording phrase is not in its criterion's text, a
``<reference>`` does not carry a donor response from the memory (never the task's hidden
reference answer), an operation touches an anchor other than by reweight, a rejected (operation,
target) is retried, or the fields would exceed the cap. A rejected or failed call raises
``LLMEvolverError`` for the attributor (the controller records the task as not attributed this
step: no labels, no candidates — never a default label) and gives noop for the proposer; both
are counted (``stats()``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.methods.harness_rl.attributor import (
    HACKS,
    LABELS,
    CriterionLabel,
    PastGroup,
    RelatedEvidence,
    TaskAttribution,
    discriminative_mass,
    satisfied,
)
from rubric_rl.methods.harness_rl.interfaces import GUIDANCE_FIELDS
from rubric_rl.methods.harness_rl.proposer import (
    INTERFACES,
    Candidate,
    GuidanceOp,
    ProposalContext,
)
from rubric_rl.methods.harness_rl.rubric_ops import OPS, RubricOp, anchor_share_of, apply_ops
from rubric_rl.rubrics.llm import LLMClient, LLMError, SchemaCaller, strip_json_fence
from rubric_rl.rubrics.types import Criterion, Verifier

RESPONSE_CHARS = 600  # a rollout as shown to the model


class LLMEvolverError(RuntimeError):
    """The model's reply was unusable (client error or invalid reply)."""


@dataclasses.dataclass(frozen=True)
class EvolverTemplate:
    name: str
    version: int
    system: str

    @property
    def key(self) -> str:
        return f"{self.name}@v{self.version}"


ATTRIBUTE_V1 = EvolverTemplate(
    "harness_attribute",
    1,
    """\
You diagnose the rubric reward of a reinforcement-learning run. For one task you see its \
weighted criteria (a negative weight is a pitfall: "met" means the bad behaviour), how many of \
the current group's rollouts satisfy each now and in the task's earlier groups, the rollouts, \
and related criteria of other tasks. Label every criterion exactly once:
- "blind": no rollout satisfies it and none did before — out of the policy's reach;
- "saturated": every rollout satisfies it, now and in the recent groups;
- "spurious": it separates the rollouts, but the satisfying ones are not the better responses \
(superficial_compliance, length_gaming, partial_coverage, stance_gaming);
- "agree": it separates the rollouts in the direction of quality, or none of the above.
For each label give "hacks" (a subset of the four patterns, for spurious), "quotes" (up to two \
satisfying and two failing rollouts, copied verbatim, may be shortened to a verbatim part), \
"wording" (the phrase of the criterion's text that lets a surface response pass, or null) and a \
one-sentence "reason". Say whether the task is saturated (its criteria barely separate the \
group). Reply with JSON only, exactly:
{"labels": [{"id": "...", "label": "...", "hacks": [], "quotes": [], "wording": null, \
"reason": "..."}], "task_saturated": false}""",
)

PROPOSE_V1 = EvolverTemplate(
    "harness_propose",
    1,
    """\
You update the training harness of one task of a reinforcement-learning run, one candidate or \
null per interface, to fix the diagnosed failures:
- "sampling" (for a saturated task): {"level": k} moves the task to sampling level k (0 = full \
weight; higher = sampled less);
- "rollout" (for blind criteria): {"ops": [...]} with {"op": "add", "field": "criterion" | \
"reference" | "critique", "text": "...", "target": "<criterion id>"} or {"op": "drop", "field": \
"..."}; a "reference" must quote one of the listed donor responses verbatim; the fields mounted \
after your ops must not exceed the cap;
- "rubric" (for spurious criteria): {"ops": [...]} with {"op": "create" | "rewrite" | "delete" | \
"reweight" | "merge" | "split", "targets": ["<id>", ...], "new": [{"id": "...", "text": "...", \
"weight": w}], "weight": w}; anchors may only be reweighted; a rewrite must check something \
else, not only reword.
Never retry a listed rejected (operation, target). Reply with JSON only, exactly:
{"sampling": null, "rollout": null, "rubric": null}""",
)

ATTRIBUTE_SCHEMA = {
    "type": "object",
    "properties": {
        "labels": {"type": "array", "items": {"type": "object"}},
        "task_saturated": {"type": "boolean"},
    },
    "required": ["labels", "task_saturated"],
}
PROPOSE_SCHEMA = {"type": "object", "required": list(INTERFACES)}


def _parse(text: str, what: str) -> dict[str, Any]:
    try:
        out = json.loads(strip_json_fence(text))
    except (json.JSONDecodeError, TypeError) as e:
        raise LLMEvolverError(f"{what}: not JSON: {e}") from e
    if not isinstance(out, dict):
        raise LLMEvolverError(f"{what}: the reply is not a JSON object")
    return out


def _norm(s: str) -> str:
    return " ".join(s.split()).lower()


class _Caller(SchemaCaller):
    def call(self, template: EvolverTemplate, user: str, schema, seed: int) -> str:
        try:
            return self.ask(template, user, schema, seed)
        except LLMError as e:
            raise LLMEvolverError(str(e)) from e


class LLMAttributor(_Caller):
    """``attribute`` as the programmatic attributor's, answered by a model."""

    role = "HarnessRL LLM attributor"

    def __init__(
        self,
        client: LLMClient,
        *,
        temperature=0.0,
        max_tokens=2048,
        template=ATTRIBUTE_V1,
        max_failure_rate: float = 0.5,
    ):
        super().__init__(
            client, temperature=temperature, max_tokens=max_tokens,
            max_failure_rate=max_failure_rate,
        )  # fmt: skip
        self.template = template

    def attribute(
        self,
        task_id: str,
        criterion_ids: Sequence[str],
        weights: Sequence[float],
        texts: Sequence[str],
        met: np.ndarray,
        responses: Sequence[str],
        *,
        history: Sequence[PastGroup] = (),
        past_labels: Sequence[Mapping[str, str]] = (),
        related: Mapping[str, Sequence[RelatedEvidence]] | None = None,
        generic_pass: Mapping[str, bool] | None = None,
        next_level: float | None = None,
        seed: int = 0,
    ) -> TaskAttribution:
        ids = [str(i) for i in criterion_ids]
        w = np.asarray(weights, np.float64)
        met = np.asarray(met, np.float64).reshape(len(ids), len(responses))
        sat = satisfied(met, w)
        related, generic_pass = related or {}, generic_pass or {}
        user = self._prompt(ids, w, texts, sat, responses, history, related, generic_pass)
        try:
            reply = _parse(self.call(self.template, user, ATTRIBUTE_SCHEMA, seed), "attribute")
            labels, task_sat = self._validate(reply, ids, texts, sat, responses)
        except LLMEvolverError as e:
            self.reject(str(e))
            raise
        self.accept()
        out = []
        for m, cid in enumerate(ids):
            lab = labels[cid]
            row = sat[m][~np.isnan(sat[m])]
            k = 1
            for past in reversed(past_labels):
                if past.get(cid) != lab["label"]:
                    break
                k += 1
            evidence = tuple(self._side(q, responses, sat[m]) for q in lab["quotes"])
            out.append(
                CriterionLabel(
                    criterion_id=cid,
                    label=lab["label"],
                    confidence=1.0 - 2.0**-k,
                    satisfied_rate=float(row.mean()) if row.size else math.nan,
                    reason=str(lab.get("reason", "")),
                    hacks=tuple(lab["hacks"]),
                    evidence=evidence,
                    generic_pass=bool(generic_pass.get(cid, False)),
                    wording=lab["wording"],
                    related=tuple(r.key for r in related.get(cid, ())),
                )  # fmt: skip
            )
        return TaskAttribution(task_id, tuple(out), discriminative_mass(sat), task_sat)

    @staticmethod
    def _side(quote: str, responses: Sequence[str], sat_row: np.ndarray) -> str:
        for j, r in enumerate(responses):
            if _norm(quote) in _norm(r):
                return f"{'+' if sat_row[j] == 1.0 else '-'} {quote}"
        raise AssertionError("validated quotes come from a rollout")

    @staticmethod
    def _prompt(ids, w, texts, sat, responses, history, related, generic_pass) -> str:
        lines = ["## Criteria"]
        for m, cid in enumerate(ids):
            now = sat[m][~np.isnan(sat[m])]
            before = [
                int(np.nansum(g.met[g.criterion_ids.index(cid)]) > 0)
                for g in history if cid in g.criterion_ids
            ]  # fmt: skip
            lines.append(
                f"- id={cid} weight={w[m]:g} satisfied now={int(now.sum())}/{now.size} "
                f"earlier groups satisfying={sum(before)}/{len(before)} "
                f"generic_pass={bool(generic_pass.get(cid, False))} text={json.dumps(texts[m])}"
            )
            for r in related.get(cid, ()):
                lines.append(
                    f"  related: {r.key} (cosine {r.cosine:.2f}, spurious before: {r.was_spurious})"
                )
        lines.append("## Rollouts")
        for j, r in enumerate(responses):
            lines.append(f"[{j}] {json.dumps(r[:RESPONSE_CHARS])}")
        lines.append("Label every criterion. Return the JSON object now.")
        return "\n".join(lines)

    @staticmethod
    def _validate(reply, ids, texts, sat, responses) -> tuple[dict[str, dict], bool]:
        labels = reply.get("labels")
        task_sat = reply.get("task_saturated")
        if not isinstance(labels, list) or not isinstance(task_sat, bool):
            raise LLMEvolverError("attribute: 'labels' must be a list, 'task_saturated' a bool")
        out: dict[str, dict] = {}
        for i, lab in enumerate(labels):
            if not isinstance(lab, dict):
                raise LLMEvolverError(f"attribute: labels[{i}] is not an object")
            cid = lab.get("id")
            if cid not in ids:
                raise LLMEvolverError(f"attribute: labels[{i}]: unknown criterion id {cid!r}")
            if cid in out:
                raise LLMEvolverError(f"attribute: criterion {cid!r} labelled twice")
            if lab.get("label") not in LABELS:
                raise LLMEvolverError(f"attribute: {cid!r}: label {lab.get('label')!r}")
            hacks = lab.get("hacks") or []
            if not isinstance(hacks, list) or any(h not in HACKS for h in hacks):
                raise LLMEvolverError(f"attribute: {cid!r}: hacks {hacks!r} not in {HACKS}")
            quotes = lab.get("quotes") or []
            if not isinstance(quotes, list) or len(quotes) > 4:
                raise LLMEvolverError(f"attribute: {cid!r}: quotes must be a list of <= 4")
            for q in quotes:
                if (
                    not isinstance(q, str)
                    or not q.strip()
                    or not any(_norm(q) in _norm(r) for r in responses)
                ):
                    raise LLMEvolverError(f"attribute: {cid!r}: quote {q!r} is not in a rollout")
            wording = lab.get("wording")
            text = texts[ids.index(cid)]
            if wording is not None and (
                not isinstance(wording, str) or _norm(wording) not in _norm(text)
            ):
                raise LLMEvolverError(
                    f"attribute: {cid!r}: wording {wording!r} is not in the criterion's text"
                )
            out[cid] = {**lab, "hacks": hacks, "quotes": [q.strip() for q in quotes]}
        missing = [c for c in ids if c not in out]
        if missing:
            raise LLMEvolverError(f"attribute: criteria {missing} not labelled")
        return out, task_sat


class LLMProposer(_Caller):
    """``propose`` as the programmatic proposer's, answered by a model. New criteria are LLM
    criteria (judged by the LLM judge); the run's judge must grade them."""

    role = "HarnessRL LLM proposer"

    def __init__(
        self,
        client: LLMClient,
        *,
        interfaces: Sequence[str] = INTERFACES,
        temperature=0.0,
        max_tokens=2048,
        template=PROPOSE_V1,
        total: float = 100.0,
        max_failure_rate: float = 0.5,
    ):
        super().__init__(
            client, temperature=temperature, max_tokens=max_tokens,
            max_failure_rate=max_failure_rate,
        )  # fmt: skip
        bad = [i for i in interfaces if i not in INTERFACES]
        if bad:
            raise ValueError(f"harness.interfaces {bad}: expected a subset of {INTERFACES}")
        self.interfaces = tuple(interfaces)
        self.template = template
        self.total = total

    def propose(
        self, ctx: ProposalContext, att: TaskAttribution, seed: int = 0
    ) -> dict[str, Candidate | None]:
        none: dict[str, Candidate | None] = {i: None for i in INTERFACES}
        try:
            reply = _parse(self.call(self.template, self._prompt(ctx, att), PROPOSE_SCHEMA,
                                     seed), "propose")  # fmt: skip
            out = self._validate(reply, ctx, att)
        except LLMEvolverError as e:
            self.reject(str(e))
            return none
        self.accept()
        return {**none, **out}

    def _prompt(self, ctx: ProposalContext, att: TaskAttribution) -> str:
        labels = {c.criterion_id: c for c in att.labels}
        lines = [f"## Interfaces you may update: {', '.join(self.interfaces)}", "## Criteria"]
        for c in ctx.criteria:
            lab = labels.get(c.id)
            desc = "unlabelled" if lab is None else (
                f"{lab.label} (confidence {lab.confidence:.2f}, hacks {list(lab.hacks)}, "
                f"wording {lab.wording!r})"
            )  # fmt: skip
            lines.append(
                f"- id={c.id} weight={c.weight:g} anchor={c.anchor} label={desc} "
                f"text={json.dumps(c.text)}"
            )
        lines.append(
            f"## Sampling level {ctx.level} of {ctx.n_levels - 1}; task saturated: "
            f"{att.task_saturated}"
        )
        lines.append(f"## Guidance (cap {ctx.cap}): " + json.dumps(
            {f: v.get("text", "") for f, v in ctx.fields.items()}))  # fmt: skip
        lines.append("## Donor responses for <reference> (criterion id: response)")
        for cid, (text, donor) in ctx.donors.items():
            lines.append(f"- {cid}: {json.dumps(text[:RESPONSE_CHARS])} (from {donor or 'task'})")
        lines.append("## Rejected before (operation or field, target): " + json.dumps(
            sorted(list(x) for x in ctx.rejected)))  # fmt: skip
        lines.append("Return the JSON object now.")
        return "\n".join(lines)

    def _validate(self, reply, ctx: ProposalContext, att) -> dict[str, Candidate | None]:
        unknown = sorted(set(reply) - set(INTERFACES))
        if unknown:
            raise LLMEvolverError(f"propose: unknown interfaces {unknown}")
        for iface in INTERFACES:
            if reply.get(iface) is not None and iface not in self.interfaces:
                raise LLMEvolverError(f"propose: interface {iface!r} is not open to updates")
        out: dict[str, Candidate | None] = {}
        if reply.get("sampling") is not None:
            out["sampling"] = self._sampling(reply["sampling"], ctx)
        if reply.get("rollout") is not None:
            out["rollout"] = self._rollout(reply["rollout"], ctx, att)
        if reply.get("rubric") is not None:
            out["rubric"] = self._rubric(reply["rubric"], ctx, att)
        return out

    @staticmethod
    def _sampling(d, ctx: ProposalContext) -> Candidate:
        level = d.get("level") if isinstance(d, dict) else None
        if not isinstance(level, int) or not 0 <= level < ctx.n_levels or level == ctx.level:
            raise LLMEvolverError(f"propose: sampling level {level!r} (now {ctx.level})")
        return Candidate("sampling", ctx.task.id, "saturated", ctx.task.id, level=level)

    @staticmethod
    def _label(att: TaskAttribution, target: str | None, default: str) -> str:
        for c in att.labels:
            if c.criterion_id == target:
                return c.label
        return default

    def _rollout(self, d, ctx: ProposalContext, att: TaskAttribution) -> Candidate:
        ops = d.get("ops") if isinstance(d, dict) else None
        if not isinstance(ops, list) or not ops:
            raise LLMEvolverError("propose: rollout needs a non-empty 'ops' list")
        ids = {c.id for c in ctx.criteria}
        mounted = set(ctx.fields)
        donors = [t for t, _ in ctx.donors.values()]
        out = []
        for i, op in enumerate(ops):
            if not isinstance(op, dict) or op.get("field") not in GUIDANCE_FIELDS:
                raise LLMEvolverError(f"propose: rollout ops[{i}]: field of {op!r}")
            field = op["field"]
            if op.get("op") == "drop":
                if field not in mounted:
                    raise LLMEvolverError(f"propose: drop({field}) of a field not mounted")
                mounted.discard(field)
                out.append(GuidanceOp("drop", field, target=ctx.fields[field].get("target")))
                continue
            if op.get("op") != "add":
                raise LLMEvolverError(f"propose: rollout ops[{i}]: op {op.get('op')!r}")
            target, text = op.get("target"), op.get("text")
            if target not in ids or not isinstance(text, str) or not text.strip():
                raise LLMEvolverError(f"propose: add({field}) needs a text and a criterion id")
            if field in mounted:
                raise LLMEvolverError(f"propose: add({field}): the field is mounted")
            if (field, target) in ctx.rejected:
                raise LLMEvolverError(f"propose: add({field}) for {target!r} was rejected")
            donor = None
            if field == "reference":
                hit = [k for k, (t, _) in ctx.donors.items() if t.strip() and t.strip() in text]
                if not hit:
                    raise LLMEvolverError(
                        "propose: a <reference> must quote a donor response (donors: "
                        f"{len(donors)})"
                    )
                donor = ctx.donors[hit[0]][1]
            mounted.add(field)
            out.append(GuidanceOp("add", field, text.strip(), target, donor))
        if len(mounted) > ctx.cap:
            raise LLMEvolverError(f"propose: {len(mounted)} fields over the cap {ctx.cap}")
        adds = [g for g in out if g.op == "add"]
        target = adds[0].target if adds else out[0].target
        label = self._label(att, target, "agree") if adds else "agree"
        grounded = any(g.donor is not None for g in adds)
        return Candidate("rollout", ctx.task.id, label, target, tuple(out), grounded=grounded)

    def _rubric(self, d, ctx: ProposalContext, att: TaskAttribution) -> Candidate:
        ops_in = d.get("ops") if isinstance(d, dict) else None
        if not isinstance(ops_in, list) or not ops_in:
            raise LLMEvolverError("propose: rubric needs a non-empty 'ops' list")
        crit = {c.id: c for c in ctx.criteria}
        ops = []
        for i, op in enumerate(ops_in):
            if not isinstance(op, dict) or op.get("op") not in OPS:
                raise LLMEvolverError(f"propose: rubric ops[{i}]: op of {op!r}")
            name = op["op"]
            targets = tuple(op.get("targets") or ())
            bad = [t for t in targets if t not in crit]
            if bad:
                raise LLMEvolverError(f"propose: rubric ops[{i}]: unknown targets {bad}")
            if name != "reweight" and any(crit[t].anchor for t in targets):
                raise LLMEvolverError(f"propose: {name} of an anchor (anchors: reweight only)")
            for t in targets or ("",):
                if (name, t) in ctx.rejected:
                    raise LLMEvolverError(f"propose: {name} of {t!r} was rejected before")
            new = []
            for j, n in enumerate(op.get("new") or []):
                if not isinstance(n, dict) or not isinstance(n.get("text"), str):
                    raise LLMEvolverError(f"propose: rubric ops[{i}].new[{j}] needs a text")
                w = n.get("weight")
                if not isinstance(w, int | float) or isinstance(w, bool) or w == 0:
                    raise LLMEvolverError(f"propose: ops[{i}].new[{j}]: weight {w!r}")
                cid = f"llm:{n.get('id') or f'{name}{i}_{j}'}"
                new.append(Criterion(id=cid, text=n["text"].strip(), weight=float(w),
                                     verifier=Verifier(), origin=name,
                                     parent_id=targets[0] if targets else None))  # fmt: skip
            weight = op.get("weight") if name == "reweight" else None
            try:
                ops.append(RubricOp(name, targets, tuple(new), weight, reason="llm proposer"))
            except ValueError as e:
                raise LLMEvolverError(f"propose: rubric ops[{i}]: {e}") from e
        try:  # the operations must apply (anchors, duplicates, a rewrite that changes the check)
            share = anchor_share_of(ctx.criteria)
            apply_ops(ctx.criteria, ops, step=0, total=self.total, anchor_share=share)
        except (ValueError, KeyError) as e:
            raise LLMEvolverError(f"propose: rubric ops do not apply: {e}") from e
        first = ops[0]
        target = first.targets[0] if first.targets else first.new[0].id
        label = self._label(att, target, "saturated")
        return Candidate("rubric", ctx.task.id, label, target, rubric=tuple(ops))


__all__ = [
    "ATTRIBUTE_V1",
    "PROPOSE_V1",
    "LLMAttributor",
    "LLMEvolverError",
    "LLMProposer",
]
