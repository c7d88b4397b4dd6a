"""HarnessRL's harness attributor (§2.3): one label per criterion in V = {blind, saturated,
spurious, agree}, routed to the interface whose update can address it.

The seed's three questions, as the programmatic attributor answers them (every threshold is
ours unless marked; the LLM attributor asks the same questions of a judge model):

(i) **Reach.** A criterion no rollout satisfies in the current group is *blind* when no earlier
    recorded group of the task satisfied it either, and *agree* ("noise") when one did. A
    positive criterion whose text names a surface cue (``SURFACE_CUE_PATTERNS``: a length
    floor, praise, a compliance claim) is never blind when unmet (agree; ours): guidance towards
    it would teach the cue. Blind → rollout interface.
(ii) **Training stage.** A criterion every rollout satisfies, now and in the task's previous
    ``saturated_window − 1`` recorded groups, is *saturated* (with fewer recorded groups it is
    agree: one group is no "recent steps"). The task's *discriminative mass* is the share of its
    criteria that separate the group (satisfied by some rollouts and not others). The task is
    diagnosed saturated — routed to the sampling interface — when it has a saturated criterion
    and its discriminative mass is below the next sampling level (``next_level``): its weight is
    higher than its signal (ours; the seed: "when such criteria lower the task's discriminative
    mass"). A criterion that a content-free response also satisfies (``generic_pass``, measured
    by the caller on ``GENERIC_PROBES`` through the judge) is flagged so the proposer can tighten
    it with a secondary rubric operation.
(iii) **Reward hacking.** For a separating criterion the satisfying rollouts A are compared with
    the failing ones B on surface features (``SurfaceFeatures``): *superficial compliance* (the
    share with a compliance/praise surface form is ≥ ``fluff_gap`` higher in A), *length gaming*
    (A is longer by ≥ ``length_gap`` of the group's mean length and ≥ 3 words), *partial
    coverage* (A meets ≤ ``coverage_gap`` less of the rest of the rubric than B — the weighted
    share of the task's other positive criteria), *stance gaming* (A refuses or hedges more, by
    ``fluff_gap``). The criterion is *spurious* — routed to the rubric interface — when a pattern
    holds and A is not better than B on the rest of the rubric (coverage(A) ≤ coverage(B) +
    ``quality_margin``); otherwise agree. Positive responses of semantically related criteria
    (the memory's semantic index) enter as cross-task evidence: a related criterion labelled
    spurious before adds one unit of persistence to a spurious label (below), and the related
    criteria are listed in the label's evidence.

Every label quotes up to two satisfying and two failing rollouts. Its confidence rises while
it persists: 1 − 2^−k after k consecutive recorded groups with the same label (this one
included). The rubric-wording check (``wording_phrase``) names the phrase of the criterion's
text that permits a surface form or a generic pass, for the proposer's rewrite.

The programmatic attributor never reads the oracle, a task's hidden parameters or the
criteria's ``class:`` tags: only the group's scores, its responses, the criteria's texts and
weights, and the memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rubric_rl.envs.base import SurfaceFeatures

LABELS = ("blind", "saturated", "spurious", "agree")
ROUTES = {"blind": "rollout", "spurious": "rubric", "saturated": "sampling"}
HACKS = ("superficial_compliance", "length_gaming", "partial_coverage", "stance_gaming")
# Content-free responses: a criterion one of them satisfies passes on generic content (§2.3:
# "met by every rollout through generic content, such as a disclaimer or polite closing").
GENERIC_PROBES = (
    "great question !",
    "all requirements are met .",
    "i hope this helps .",
    "as an ai i cannot be sure .",
)
# Phrases that permit a surface form or a generic pass (the wording check), matched in order.
WORDING_PATTERNS = (
    (r"\bat least \d+ words\b", "a length floor rewards padding"),
    (r"\bdetailed\b", "'detailed' is judged by length alone"),
    (r"\bsays that all requirements are met\b", "a compliance claim is a surface form"),
    (r"\bpraising the question\b", "a praise opener is a surface form"),
    (r"\bgreat question\b", "a praise opener is a surface form"),
    (r"\bis not empty\b", "any content passes"),
    (r"\bat most \d+ words\b", "any short response passes"),
    (r"\bevery rule of the task\b", "a global claim is judged without the rules"),
)
# The wording patterns that name a surface cue a response can show without doing the task (a
# length floor, praise, a compliance claim). An unmet positive cue is never *blind*: guidance
# towards it would steer the policy to the cue (ours; the seed's blind label is about reach).
SURFACE_CUE_PATTERNS = WORDING_PATTERNS[:5]


@dataclasses.dataclass(frozen=True)
class AttributorConfig:
    saturated_window: int = 2  # groups (the current one included) a saturated criterion spans
    fluff_gap: float = 0.5
    length_gap: float = 0.3
    coverage_gap: float = 0.2
    quality_margin: float = 0.05
    quotes: int = 2
    quote_chars: int = 160

    def __post_init__(self):
        if self.saturated_window < 1:
            raise ValueError(f"attributor.saturated_window={self.saturated_window}: must be >= 1")
        for f in ("fluff_gap", "length_gap", "coverage_gap", "quality_margin"):
            if not 0 <= getattr(self, f) <= 1:
                raise ValueError(f"attributor.{f}={getattr(self, f)}: must lie in [0, 1]")


@dataclasses.dataclass(frozen=True)
class CriterionLabel:
    criterion_id: str
    label: str
    confidence: float
    satisfied_rate: float  # share of valid rollouts satisfying it now (NaN: no valid verdict)
    reason: str
    hacks: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()  # quoted rollouts: "+ …" satisfying, "- …" failing
    generic_pass: bool = False
    wording: str | None = None
    related: tuple[str, ...] = ()  # "task/criterion" of related criteria consulted

    @property
    def route(self) -> str | None:
        """The interface a criterion's label goes to (a saturated criterion routes its task to
        sampling through ``TaskAttribution.task_saturated``, not itself)."""
        return {"blind": "rollout", "spurious": "rubric"}.get(self.label)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["satisfied_rate"] = None if math.isnan(self.satisfied_rate) else self.satisfied_rate
        return d


@dataclasses.dataclass(frozen=True)
class TaskAttribution:
    task_id: str
    labels: tuple[CriterionLabel, ...]
    discriminative_mass: float
    task_saturated: bool

    def by_label(self, label: str) -> tuple[str, ...]:
        return tuple(c.criterion_id for c in self.labels if c.label == label)

    def routes(self) -> dict[str, tuple[str, ...]]:
        """Interface -> the criteria (or, for sampling, the task) routed to it."""
        return {
            "rollout": self.by_label("blind"),
            "rubric": self.by_label("spurious"),
            "sampling": (self.task_id,) if self.task_saturated else (),
        }


@dataclasses.dataclass(frozen=True)
class PastGroup:
    """An earlier recorded group of the task: its criterion ids, weights and met matrix."""

    step: int
    criterion_ids: tuple[str, ...]
    weights: tuple[float, ...]
    met: np.ndarray  # [K, J] float, NaN = judge failure


@dataclasses.dataclass(frozen=True)
class RelatedEvidence:
    """A semantically related criterion of another task, with what the memory says of it."""

    key: str  # "task/criterion"
    cosine: float
    was_spurious: bool = False


def satisfied(met: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """[K, J] satisfied matrix: met for a positive criterion, not met for a pitfall; NaN kept."""
    met = np.asarray(met, np.float64)
    w = np.asarray(weights, np.float64)[:, None]
    return np.where(np.isnan(met), np.nan, np.where(w > 0, met, 1.0 - met))


def discriminative_mass(met: np.ndarray) -> float:
    """The share of criteria that separate the group: satisfied by some valid rollouts and
    not others (a criterion with no valid verdict does not separate)."""
    met = np.asarray(met, np.float64)
    if met.shape[0] == 0:
        return 0.0
    lo = np.nanmin(np.where(np.isnan(met), np.inf, met), axis=1)
    hi = np.nanmax(np.where(np.isnan(met), -np.inf, met), axis=1)
    return float(np.mean((hi > lo) & np.isfinite(lo) & np.isfinite(hi)))


def wording_phrase(text: str, patterns=WORDING_PATTERNS) -> tuple[str, str] | None:
    """(phrase, why) of the first wording pattern found in a criterion's text, or None."""
    low = text.lower()
    for pattern, why in patterns:
        m = re.search(pattern, low)
        if m:
            return m.group(0), why
    return None


def _quote(text: str, n: int) -> str:
    t = " ".join(text.split())
    return t if len(t) <= n else t[: n - 1] + "…"


class ProgrammaticAttributor:
    """The attributor for rule-judged domains (module docstring); ``features`` reads a
    response's surface features (the domain's ``Domain.surface_features``, or common English
    phrases for a domain without its own)."""

    def __init__(
        self,
        config: AttributorConfig | None = None,
        features: Callable[[str], SurfaceFeatures] | None = None,
    ):
        if features is None:
            raise TypeError(
                "ProgrammaticAttributor: features (a response's surface features) is required"
            )
        self.config = config or AttributorConfig()
        self.features = features

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
    ) -> TaskAttribution:
        """Labels for one task's group.

        ``met``: [K, J] (1 met, 0 not, NaN judge failure; a pitfall's "met" is its bad behaviour);
        ``history``: the task's earlier groups, oldest first; ``past_labels``: the labels of the
        task's earlier groups, oldest first; ``related``: per criterion id, related criteria of
        other tasks; ``generic_pass``: per criterion id, whether a content-free response
        satisfies it; ``next_level``: the task's next lower sampling weight (None at the lowest).
        """
        cfg = self.config
        ids = [str(i) for i in criterion_ids]
        w = np.asarray(weights, np.float64)
        met = np.asarray(met, np.float64)
        k, j = met.shape if met.ndim == 2 else (len(ids), 0)
        if met.ndim != 2 or k != len(ids) or len(w) != k or len(texts) != k:
            raise ValueError(
                f"attributor: task {task_id!r}: met {met.shape} for {len(ids)} criteria, "
                f"{len(w)} weights, {len(texts)} texts"
            )
        if len(responses) != j:
            raise ValueError(f"attributor: task {task_id!r}: {len(responses)} responses, J={j}")
        sat = satisfied(met, w)
        dm = discriminative_mass(sat)
        feats = [self.features(r) for r in responses]
        related = related or {}
        generic_pass = generic_pass or {}
        labels = []
        for m, cid in enumerate(ids):
            row = sat[m]
            valid = ~np.isnan(row)
            rate = float(row[valid].mean()) if valid.any() else float("nan")
            hacks: tuple[str, ...] = ()
            rel = tuple(related.get(cid, ()))
            if not valid.any():
                label, reason = "agree", "no valid verdict (judge failures): no evidence"
            elif rate == 0.0:
                met_before = self._met_before(cid, history)
                cue = wording_phrase(texts[m], SURFACE_CUE_PATTERNS) if w[m] > 0 else None
                if cue is not None:
                    label, reason = "agree", f"unmet surface cue {cue[0]!r}: not guided towards"
                elif met_before is None:
                    label, reason = "blind", "unmet now and in every earlier group"
                else:
                    label, reason = "agree", f"unmet now but met at step {met_before}: noise"
            elif rate == 1.0:
                span = self._all_met_span(cid, history)
                if span + 1 >= cfg.saturated_window:
                    label, reason = (
                        "saturated",
                        f"met by every rollout in the last {span + 1} groups",
                    )
                else:
                    label, reason = "agree", "met by every rollout, but no earlier group yet"
            else:
                hacks = self._hacks(m, sat, w, feats)
                if hacks:
                    label, reason = "spurious", "satisfying rollouts differ by " + ", ".join(hacks)
                else:
                    label, reason = "agree", "separates the group and tracks the rest of the rubric"
            gp = bool(generic_pass.get(cid, False))
            wp = wording_phrase(texts[m]) if (label == "spurious" or gp) else None
            persist = 1 + self._persistence(cid, label, past_labels)
            if label == "spurious" and any(r.was_spurious for r in rel):
                persist += 1
            labels.append(
                CriterionLabel(
                    criterion_id=cid,
                    label=label,
                    confidence=1.0 - 2.0**-persist,
                    satisfied_rate=rate,
                    reason=reason,
                    hacks=hacks,
                    evidence=self._quotes(row, responses),
                    generic_pass=gp,
                    wording=None if wp is None else f"{wp[0]!r}: {wp[1]}",
                    related=tuple(r.key for r in rel),
                )
            )
        saturated_any = any(c.label == "saturated" for c in labels)
        task_sat = bool(saturated_any and next_level is not None and dm < float(next_level))
        return TaskAttribution(str(task_id), tuple(labels), dm, task_sat)

    # ------------------------------------------------------------------ the three questions

    @staticmethod
    def _met_before(cid: str, history: Sequence[PastGroup]) -> int | None:
        """The latest earlier step at which some rollout satisfied ``cid``, or None."""
        for g in reversed(history):
            if cid in g.criterion_ids:
                m = g.criterion_ids.index(cid)
                row = satisfied(g.met[m : m + 1], g.weights[m : m + 1])[0]
                if np.nansum(row) > 0:
                    return g.step
        return None

    @staticmethod
    def _all_met_span(cid: str, history: Sequence[PastGroup]) -> int:
        """How many of the most recent earlier groups carrying ``cid`` had every valid rollout
        satisfy it (consecutively, newest first)."""
        n = 0
        for g in reversed(history):
            if cid not in g.criterion_ids:
                continue
            m = g.criterion_ids.index(cid)
            row = satisfied(g.met[m : m + 1], g.weights[m : m + 1])[0]
            valid = ~np.isnan(row)
            if valid.any() and row[valid].min() == 1.0:
                n += 1
            else:
                break
        return n

    def _hacks(self, m: int, sat: np.ndarray, w: np.ndarray, feats) -> tuple[str, ...]:
        cfg = self.config
        row = sat[m]
        a = np.flatnonzero(row == 1.0)
        b = np.flatnonzero(row == 0.0)
        coverage = self._coverage(m, sat, w)
        ca, cb = coverage[a][~np.isnan(coverage[a])], coverage[b][~np.isnan(coverage[b])]
        # No other positive criterion: quality cannot be compared, the surface checks decide.
        cov_a, cov_b = (ca.mean(), cb.mean()) if len(ca) and len(cb) else (0.0, 0.0)
        if cov_a > cov_b + cfg.quality_margin:
            return ()  # meeting it goes with meeting the rest of the rubric: it tracks quality
        fluff = np.array([f.fluff for f in feats], float)
        stance = np.array([f.stance for f in feats], float)
        length = np.array([f.length for f in feats], float)
        out = []
        if fluff[a].mean() - fluff[b].mean() >= cfg.fluff_gap:
            out.append("superficial_compliance")
        gap = length[a].mean() - length[b].mean()
        if gap >= 3 and gap >= cfg.length_gap * max(length.mean(), 1.0):
            out.append("length_gaming")
        if cov_a < cov_b - cfg.coverage_gap:
            out.append("partial_coverage")
        if stance[a].mean() - stance[b].mean() >= cfg.fluff_gap:
            out.append("stance_gaming")
        return tuple(out)

    @staticmethod
    def _coverage(m: int, sat: np.ndarray, w: np.ndarray) -> np.ndarray:
        """[J] weighted share of the task's other positive criteria each rollout satisfies."""
        others = [n for n in range(len(w)) if n != m and w[n] > 0]
        if not others:
            return np.full(sat.shape[1], np.nan)
        s = sat[others]
        ww = np.broadcast_to(w[others][:, None], s.shape)
        valid = ~np.isnan(s)
        den = (ww * valid).sum(0)
        num = (ww * np.where(valid, s, 0.0)).sum(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)

    @staticmethod
    def _persistence(cid: str, label: str, past_labels: Sequence[Mapping[str, str]]) -> int:
        """Consecutive earlier label records (newest first) giving ``cid`` the same label."""
        n = 0
        for rec in reversed(past_labels):
            if cid not in rec:
                continue
            if rec[cid] != label:
                break
            n += 1
        return n

    def _quotes(self, row: np.ndarray, responses: Sequence[str]) -> tuple[str, ...]:
        cfg = self.config
        yes = [i for i in range(len(row)) if row[i] == 1.0][: cfg.quotes]
        no = [i for i in range(len(row)) if row[i] == 0.0][: cfg.quotes]
        return tuple(
            [f"+ {_quote(responses[i], cfg.quote_chars)}" for i in yes]
            + [f"- {_quote(responses[i], cfg.quote_chars)}" for i in no]
        )


__all__ = [
    "GENERIC_PROBES",
    "HACKS",
    "LABELS",
    "ROUTES",
    "AttributorConfig",
    "CriterionLabel",
    "PastGroup",
    "ProgrammaticAttributor",
    "RelatedEvidence",
    "SurfaceFeatures",
    "TaskAttribution",
    "discriminative_mass",
    "satisfied",
    "SURFACE_CUE_PATTERNS",
    "wording_phrase",
]
