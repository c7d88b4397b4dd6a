"""RG-SED's programmatic coach for the embedded constraint domain (seed 002 §3.2, eq. 10).

The seed's coach is an LLM that summarises a group's attempts into role-specific memory m (App. E,
figs. 17 and 21; the authors' solver coach lists each attempt's unmet rubric items) and writes it
for EVERY group. On the embedded domain the same feedback is turned into m by rule
(``COACH_RULES``):

* ``"every_group"`` (the default, as the seed's coach): the criteria ANY of the group failed to
  satisfy, most-missed first (share of valid verdicts unsatisfied; ties to the larger |weight|,
  then rubric order), at most ``max_hints``; when the group missed none, its best rollout's
  behaviours — the criteria it satisfied, largest |weight| first — so the memory restates what
  worked. Only a group with no valid verdict at all gets no memory (nothing to summarise).
* ``"majority"``: only the criteria that MOST of the group missed (share > ``miss_share``); none
  → no memory. Kept as the labelled alternative: on the 1M policy it wrote memory for about one
  solver group in nine, so RG-SED almost never applied.

Each criterion is stated and the memory written by the domain's ``Style`` (``style.hint``,
``style.coach``; the Domain contract's renderer family): on the embedded domain as its corpus
states guidance ("avoid : text" for a pitfall) and writes ``<coach>`` text ("remember : h1 ;
remember : h2"), so every word is in the domain vocabulary and in the wording the warm start
taught. The block is added where the memory is mounted (``style.add_block`` with kind "coach").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rubric_rl.envs.base import GENERIC_STYLE, Style
from rubric_rl.methods.harness_rl.attributor import satisfied
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.scores import VerdictLike, verdict_met
from rubric_rl.rubrics.types import Task, Verdict

MISS_SHARE = 0.5  # "majority" rule: strictly more than half of the valid verdicts
COACH_RULES = ("every_group", "majority")
# The warm-start corpus's coach blocks name one or two requirements (constraint_corpus).
MAX_HINTS = 2

VerdictRow = Mapping[str, VerdictLike] | Sequence[Verdict]


def _row_mapping(row: VerdictRow, ids: set[str], where: str) -> dict[str, bool | None]:
    if isinstance(row, Mapping):
        items = [(cid, verdict_met(v, f"{where}, criterion {cid!r}")) for cid, v in row.items()]
    else:
        items = [(v.criterion_id, v.met) for v in row]
    unknown = sorted({cid for cid, _ in items} - ids)
    if unknown:
        raise ValueError(f"{where}: verdicts for criteria not in the task's rubric: {unknown}")
    return dict(items)


def missed_shares(task: Task, verdict_rows: Sequence[VerdictRow]) -> np.ndarray:
    """[C] share of the group's valid verdicts on each rubric criterion that are unsatisfied (a
    pitfall: its bad behaviour present); NaN where no verdict is valid (failed or missing)."""
    crits = tuple(task.rubric)
    ids = {c.id for c in crits}
    met = np.full((len(crits), len(verdict_rows)), np.nan)
    for j, row in enumerate(verdict_rows):
        got = _row_mapping(row, ids, f"task {task.id!r}, response {j}")
        for i, c in enumerate(crits):
            m = got.get(c.id)
            if m is not None:
                met[i, j] = float(m)
    sat = satisfied(met, [c.weight for c in crits])
    valid = (~np.isnan(sat)).sum(axis=1)
    unsat = np.where(np.isnan(sat), 0.0, 1.0 - sat).sum(axis=1)
    return np.where(valid > 0, unsat / np.maximum(valid, 1), np.nan)


def coach_memory(
    task: Task,
    responses: Sequence[str],
    verdict_rows: Sequence[VerdictRow],
    *,
    rule: str = "every_group",
    miss_share: float = MISS_SHARE,
    max_hints: int = MAX_HINTS,
    style: Style = GENERIC_STYLE,
) -> str | None:
    """The group's memory m as ``<coach>`` text (module docstring: ``rule``), or None when the
    rule writes none (``"every_group"``: only a group without any valid verdict).

    ``verdict_rows``: one row per response (a ``{criterion_id: met}`` mapping or a trajectory's
    ``Verdict`` tuple). ``responses`` are what an LLM coach would read; this coach needs only the
    verdicts, and checks that there is one row per response."""
    if len(responses) != len(verdict_rows):
        raise ValueError(
            f"coach_memory: task {task.id!r} has {len(responses)} responses but "
            f"{len(verdict_rows)} verdict rows"
        )
    if rule not in COACH_RULES:
        raise ValueError(f"coach_memory: rule must be one of {COACH_RULES}, got {rule!r}")
    if not 0.0 <= miss_share < 1.0:
        raise ValueError(f"coach_memory: miss_share must be in [0, 1), got {miss_share}")
    if max_hints < 1:
        raise ValueError(f"coach_memory: max_hints must be >= 1, got {max_hints}")
    crits = tuple(task.rubric)
    shares = missed_shares(task, verdict_rows)
    floor = miss_share if rule == "majority" else 0.0
    named = [i for i in range(len(crits)) if not np.isnan(shares[i]) and shares[i] > floor]
    named.sort(key=lambda i: (-shares[i], -abs(crits[i].weight), i))
    if not named and rule == "every_group":
        # Nothing missed: every valid verdict of every rollout is satisfied, so any rollout is
        # the best one; its behaviours are the criteria with a valid verdict.
        named = [i for i in range(len(crits)) if not np.isnan(shares[i])]
        named.sort(key=lambda i: (-abs(crits[i].weight), i))
    if not named:
        return None
    return style.coach([style.hint(crits[i].text, crits[i].weight) for i in named[:max_hints]])


def coach_memories(rollouts: Rollouts, **options) -> list[str | None]:
    """``coach_memory`` of every group of a judged step, from its trajectories' verdicts."""
    return [
        coach_memory(
            g.task,
            [t.response for t in g.trajectories],
            [t.verdicts for t in g.trajectories],
            **options,
        )
        for g in rollouts.groups
    ]
