"""What the harness memory supplies for one task at one step (§2.3: "the task history in
E^time and related criteria in E^sem"): the task's earlier groups and labels, the candidates
rejected within the last draws (they return to the proposer with their measurement), donors for
``<reference>`` (a response that satisfied the criterion in this task's history or, through the
semantic index, a related criterion of another task), and related criteria with whether they
were labelled spurious."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rubric_rl.methods.harness_rl.attributor import PastGroup, RelatedEvidence, satisfied


@dataclasses.dataclass
class TaskEvidence:
    history: list[PastGroup] = dataclasses.field(default_factory=list)
    past_labels: list[dict[str, str]] = dataclasses.field(default_factory=list)
    related: dict[str, list[RelatedEvidence]] = dataclasses.field(default_factory=dict)
    donors: dict[str, tuple[str, str | None]] = dataclasses.field(default_factory=dict)
    rejected: frozenset[tuple[str, str]] = frozenset()


def _met(rows) -> np.ndarray:
    return np.array([[np.nan if x is None else x for x in row] for row in rows], float)


def prefetch(memory, tasks: Sequence[tuple[str, Sequence[str]]], *, semantic: bool):
    """A step's reads, batched (the memory does not change while a step's evidence is
    gathered): ``tasks`` = (task id, criterion texts) per task. Returns the related criteria of
    every text (one search, each task's own excluded; None without the semantic index) and the
    histories of the tasks and of their neighbours' tasks (one read), for ``gather``."""
    if memory is None:
        return None, {}
    related = None
    if semantic:
        texts = [t for _, ts in tasks for t in ts]
        hits = memory.related(texts, exclude_task=[tid for tid, ts in tasks for _ in ts])
        related, i = {}, 0
        for tid, ts in tasks:
            related[tid], i = hits[i : i + len(ts)], i + len(ts)
    wanted = {tid for tid, _ in tasks}
    for rows in (related or {}).values():
        wanted.update(nb.task_id for nbs in rows for nb in nbs)
    return related, memory.histories(wanted)


def gather(
    memory,
    task_id: str,
    criterion_ids: Sequence[str],
    *,
    last_label: Mapping[str, str],
    draws: int,
    retry_after: int,
    cache: dict | None = None,
    related: Sequence[Sequence] | None = None,
) -> TaskEvidence:
    """The task's evidence (module docstring); ``memory`` None gives none. ``cache``: task id ->
    its history, shared by the calls of one step (the memory does not change within them);
    ``related``: the texts' neighbours from ``prefetch`` (None without the semantic index)."""
    ev = TaskEvidence()
    if memory is None:
        return ev
    cache = {} if cache is None else cache
    rejected: set[tuple[str, str]] = set()
    for rec in _history(memory, task_id, cache):
        d = rec.data
        if rec.kind == "group":
            met = _met(d["met"]).reshape(len(d["criterion_ids"]), -1)
            ev.history.append(
                PastGroup(rec.step, tuple(d["criterion_ids"]), tuple(d["weights"]), met)
            )
            sat = satisfied(met, d["weights"])
            for m, cid in enumerate(d["criterion_ids"]):
                hit = np.flatnonzero(sat[m] == 1.0)
                if len(hit):
                    ev.donors[cid] = (d["responses"][int(hit[0])], None)
        elif rec.kind == "labels":
            ev.past_labels.append({k: v["label"] for k, v in d.items()})
        elif rec.kind == "update":
            if d.get("status") != "rejected" or draws - d.get("draw", 0) > retry_after:
                continue
            cand = d["candidate"]
            for g in cand["guidance"]:
                rejected.add((g["field"], g["target"]))
            for op in cand["rubric"]:
                for t in op["targets"] or [n["id"] for n in op["new"]]:
                    rejected.add((op["op"], t))
    ev.rejected = frozenset(rejected)
    if related is not None:
        for cid, nbs in zip(criterion_ids, related, strict=True):
            ev.related[cid] = [
                RelatedEvidence(
                    f"{nb.task_id}/{nb.criterion_id}",
                    nb.cosine,
                    last_label.get(f"{nb.task_id}/{nb.criterion_id}") == "spurious",
                )
                for nb in nbs
            ]
            if cid not in ev.donors:
                donor = cross_task_donor(memory, nbs, cache)
                if donor is not None:
                    ev.donors[cid] = donor
    return ev


def _history(memory, task_id: str, cache: dict) -> list:
    if task_id not in cache:
        cache[task_id] = memory.history(task_id)
    return cache[task_id]


def cross_task_donor(memory, neighbours, cache: dict | None = None) -> tuple[str, str] | None:
    """A response of another task that satisfied a related criterion (its latest group first)."""
    cache = {} if cache is None else cache
    for nb in neighbours:
        for rec in reversed(_history(memory, nb.task_id, cache)):
            if rec.kind != "group":
                continue
            ids = rec.data["criterion_ids"]
            if nb.criterion_id not in ids:
                continue
            m = ids.index(nb.criterion_id)
            w = rec.data["weights"][m]
            for r, x in zip(rec.data["responses"], rec.data["met"][m], strict=False):
                if x is not None and (x == 1.0) == (w > 0):
                    return r, f"{nb.task_id}/{nb.criterion_id}"
    return None


__all__ = ["TaskEvidence", "cross_task_donor", "gather", "prefetch"]
