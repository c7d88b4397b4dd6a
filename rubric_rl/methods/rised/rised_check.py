"""RISED's mechanism checked on the scripted policy (``rubric_rl/checks/controller_check.py``): the
real RISED stages and controllers (tagger, selection, teacher contexts) on responses whose
per-constraint success is scripted, scored against the script's truth (``ScriptedPolicy.kept``,
which no controller reads). Used by ``benchmarks/rised_mechanism.py`` and the CI tests.

Figures (``rised_figures``), over the trained groups of ``steps`` steps:

- ``sd_reach``: share with at least one teacher prompt (a self-distillation term);
  ``success_share``: share with at least one rollout passing the task verifier. The seed's SD
  "does not provide privileged behavioural context to groups without positive rubrics", and
  positives come from successes only, so an outcome-conditioned tagger gives them equal
  (``reach_matches_success``: 1.0 when they are equal group by group);
- ``failed_with_positive``: share of failed rollouts (all candidates) carrying a positive
  behaviour tag;
- hints, over trained groups with successes and failures: a hint (one of the group's top-n
  teacher rubrics, ``RisedController.group_hints``) *separates* when, by the script's truth, its
  requirement was met in the group's successes at least ``SEPARATES`` more often than in its
  failures. ``hint_precision``: separating hints / hints; ``hint_precision_at_available``:
  separating hints / Σ min(hints, separating requirements of the group) (1.0: every hint that
  could name a separating requirement does); ``hint_top1_precision``: groups whose first hint
  separates; ``hint_contrast``: the script's success/failure gap of the hints, averaged;
  ``hint_saturated``: hints whose requirement every rollout of the group met;
- ``anti_env_share``: share of environment-steps whose next prompts get an anti-patterns block;
- ``selected/*`` and ``random/*``: zero-variance share and mean within-group variance (task
  verifier) of the trained groups and of a uniformly random choice of as many candidates.

Ours throughout: the seed defines none of these checks.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.methods.rised import rised_selection as sel
from rubric_rl.methods.rised.rised import RisedController
from rubric_rl.step import VERIFIER_SIGNAL

# The embedded vocabulary's behaviour tags that stand for an implicit requirement
# (constraint_spec.implicit_constraints); a stated check's positive is "<kind>_followed".
IMPLICIT = {"distinct_items": "distinct", "answer_alone": "plain"}
# Successes meet every requirement, so a gap of 0.5 means the group's failures met it at most
# half of the time.
SEPARATES = 0.5
SUCCESS = 0.5  # the task verifier's reward at or above which a rollout succeeded
# ``config.rised`` values that give back the behaviour before outcome-conditioned tags, contrast
# hints, presence profiles, untagged groups picked last and Var-Target ∝ variance.
PREVIOUS_FLAGS = {
    "tagging": "unconditioned",
    "hint_rank": "count",
    "profile_counts": "raw",
    "batch_profile": "sum",
    "untagged": "score0",
    "variance_targeting": "pool_multiple",
}


def requirement_of(rubric_id: str) -> str | None:
    """The requirement kind a positive rubric of the embedded vocabulary names (None: none)."""
    if rubric_id in IMPLICIT:
        return IMPLICIT[rubric_id]
    kind, _, outcome = rubric_id.rpartition("_")
    return kind if outcome == "followed" else None


def script_contrast(req: str | None, kept: Sequence[frozenset[str]], ok: np.ndarray) -> float:
    """P(the script met ``req`` | success) − P(met | failure), over one group's rollouts."""
    if req is None:
        return 0.0
    has = np.array([req in k for k in kept])
    return float(has[ok].mean() - has[~ok].mean())


def rised_figures(config: Any, steps: int, workdir: str, *, seed: int = 0) -> dict[str, float]:
    """Runs ``steps`` steps of ``config`` (a RISED config) with a ``ScriptedPolicy(seed)`` and
    returns the figures of the module docstring."""
    policy = ScriptedPolicy(seed=seed)
    run = scripted_run(config, policy, workdir)
    ctl = next(x for x in run.controllers.controllers if isinstance(x, RisedController))
    n: collections.Counter = collections.Counter()
    stats = collections.defaultdict(list)
    rng = np.random.default_rng(seed)
    matches = []
    for step in range(1, steps + 1):
        r, ctx = run.step(step)
        stats["anti_env_share"].append(ctx.metrics["rised/anti/env_share"])
        contexts = ctl.teacher_contexts(r)
        rewards = np.array(
            [[t.signals.get(VERIFIER_SIGNAL, np.nan) for t in g.trajectories] for g in r.groups]
        )
        keep = np.array([g.selected for g in r.groups])
        rand = np.zeros(len(keep), bool)
        rand[rng.choice(len(keep), size=int(keep.sum()), replace=False)] = True
        for name, mask in (("selected", keep), ("random", rand)):
            s = sel.selection_stats(rewards, mask)
            stats[f"{name}/zero_variance_frac"].append(s["selected/zero_variance_frac"])
            stats[f"{name}/variance_mean"].append(s["selected/variance_mean"])
        for gi, (g, tags, row) in enumerate(zip(r.groups, ctl._tags, contexts, strict=True)):
            ok = rewards[gi] >= SUCCESS
            for tg, o in zip(tags, ok, strict=True):
                if not o:
                    n["failed"] += 1
                    n["failed_with_positive"] += any(
                        ctl.vocab.entry(x).polarity == "positive" and ctl._behaviour(x)
                        for x in tg.counts
                    )
            if not g.selected:
                continue
            reached = any(p is not None for p in row)
            n["groups"] += 1
            n["success"] += bool(ok.any())
            n["reach"] += reached
            matches.append(reached == bool(ok.any()))
            if not (ok.any() and (~ok).any()):
                continue
            _score_hints(n, ctl.group_hints(gi), [policy.kept[(g.task.id, step, j)]
                                                  for j in range(len(ok))], ok)  # fmt: skip
    out = {
        "sd_reach": n["reach"] / n["groups"],
        "success_share": n["success"] / n["groups"],
        "reach_matches_success": float(np.mean(matches)),
        "failed_with_positive": n["failed_with_positive"] / max(n["failed"], 1),
        "hint_precision": n["hints_separating"] / max(n["hints"], 1),
        "hint_precision_at_available": n["hints_separating"] / max(n["hint_slots"], 1),
        "hint_top1_precision": n["hint_top1"] / max(n["hint_groups"], 1),
        "hint_contrast": n["hint_contrast"] / max(n["hints"], 1),
        "hint_saturated": n["hints_saturated"] / max(n["hints"], 1),
        "hints": float(n["hints"]),
        "hint_groups": float(n["hint_groups"]),
    }
    for key, v in sorted(stats.items()):
        out[key] = float(np.mean(v))
    return out


def _score_hints(n: collections.Counter, hints: list[str], kept, ok: np.ndarray) -> None:
    met_by_all = set.intersection(*map(set, kept))
    reqs = {q for k in kept for q in k}
    separating = [q for q in reqs if script_contrast(q, kept, ok) >= SEPARATES]
    n["hint_slots"] += min(len(hints), len(separating))
    n["hint_groups"] += 1
    if hints:
        n["hint_top1"] += script_contrast(requirement_of(hints[0]), kept, ok) >= SEPARATES
    for h in hints:
        req = requirement_of(h)
        gap = script_contrast(req, kept, ok)
        n["hints"] += 1
        n["hints_separating"] += gap >= SEPARATES
        n["hint_contrast"] += gap
        n["hints_saturated"] += req in met_by_all


__all__ = ["PREVIOUS_FLAGS", "SEPARATES", "requirement_of", "rised_figures", "script_contrast"]
