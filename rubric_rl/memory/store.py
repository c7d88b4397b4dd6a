"""The harness memory M (HarnessRL §1, §2.3, §3 "Implementation"): a time index keyed by task and
a semantic index over criterion texts, both in one persistent ChromaDB inside the run directory.

The seed's §2.2 (memory) is empty; what follows is our reading of what the attributor, proposer
and critic retrieve from it (§2.3: "the task history in E^time and related criteria in E^sem"):

- **Time index** (``record`` / ``history``): per task, records stamped with the step that wrote
  them, of a ``kind``: ``group`` (the task's rollouts, criterion ids, the K×J score matrix S, with
  None where the judge failed, rewards, mounted guidance), ``labels`` (the attributor's labels
  with evidence and confidence), ``update`` (a proposed update: interface, operations, status
  proposed / accepted / rejected, the critic's measurement and band), ``outcome`` (what followed
  an accepted update). Records are fetched by metadata (``where`` on task and kind), never by
  similarity: Chroma stores every record with an embedding, so time records carry a constant
  one-dimensional placeholder.
- **Semantic index** (``index_criteria`` / ``related``): one entry per criterion *version* (task,
  criterion id, the step it was written, text, sign of its weight, anchor), embedded explicitly by
  ``Embedder`` (Chroma's default embedding function downloads a model; it is never used). A
  rewrite adds a version; a delete adds a tombstone version. ``related`` returns, per query text,
  the top-k (k = 4) current criteria whose cosine with it is at least the floor η: Chroma's HNSW
  index proposes candidates, their cosines are recomputed exactly from the stored embeddings
  (float64) and the floor is applied to those, so a criterion exactly at the floor is retrieved.
  With up to ``candidates`` entries the search is exhaustive; beyond, HNSW's recall applies.

Rollback (``rollback(step)``): on resume from a checkpoint at step s, every record and every
criterion version written after s is deleted, so a resumed run's memory equals an uninterrupted
run's at s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.memory.embedder import Embedder, floor_for

KINDS = ("group", "labels", "update", "outcome")
TIME = "harness-time"
SEMANTIC = "harness-semantic"


@dataclasses.dataclass(frozen=True)
class TimeRecord:
    task_id: str
    step: int
    kind: str
    data: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class CriterionEntry:
    """A criterion version to index (``deleted``: a tombstone, the criterion left the rubric)."""

    task_id: str
    criterion_id: str
    text: str
    weight: float = 1.0
    anchor: bool = False
    deleted: bool = False


@dataclasses.dataclass(frozen=True)
class Neighbour:
    """A related criterion: its current version, and its cosine with the query text."""

    task_id: str
    criterion_id: str
    text: str
    cosine: float
    step: int
    weight: float
    anchor: bool


def _chroma():
    try:
        import chromadb
        from chromadb.config import Settings
    except ImportError as e:
        raise ImportError("the harness memory needs ChromaDB: pip install -e '.[harness]'") from e
    return chromadb, Settings


class HarnessMemory:
    """Time index + semantic index in a persistent ChromaDB at ``path`` (module docstring)."""

    def __init__(
        self,
        path: str,
        embedder: Embedder,
        *,
        top_k: int = 4,
        floor: float | None = None,
        candidates: int = 32,
    ):
        if int(top_k) < 1:
            raise ValueError(f"memory.top_k={top_k}: must be >= 1")
        if int(candidates) < int(top_k):
            raise ValueError(f"memory.candidates={candidates}: must be >= top_k ({top_k})")
        chromadb, Settings = _chroma()
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)
        self.embedder = embedder
        self.top_k = int(top_k)
        self.floor = floor_for(embedder, floor)
        self.candidates = int(candidates)
        self._client = chromadb.PersistentClient(
            path=self.path, settings=Settings(anonymized_telemetry=False, allow_reset=False)
        )
        self._time = self._client.get_or_create_collection(TIME, embedding_function=None)
        self._sem = self._client.get_or_create_collection(
            SEMANTIC,
            configuration={"hnsw": {"space": "cosine"}},
            embedding_function=None,
            metadata={"embedder": embedder.name, "dim": int(embedder.dim)},
        )
        stored = (self._sem.metadata or {}).get("embedder")
        if stored is not None and stored != embedder.name:
            raise ValueError(
                f"{self.path}: the semantic index was built with embedder {stored!r}, not "
                f"{embedder.name!r}; a run keeps one embedder (set memory.embedder to match)"
            )
        self._cache: dict[str, np.ndarray] = {}
        self._seq: dict[int, int] = {}
        # (task, criterion) -> (id of its current version, whether that version is a tombstone)
        self._latest: dict[tuple[str, str], tuple[str, bool]] = {}
        # (task, criterion) -> its current version's (text, weight, anchor, deleted)
        self._current_version: dict[tuple[str, str], tuple[str, float, bool, bool]] = {}
        self._load_latest()

    # ------------------------------------------------------------------ time index

    def record(self, step: int, task_id: str, kind: str, data: Mapping[str, Any]) -> str:
        """Appends one time record; returns its id."""
        return self.record_many(step, [(task_id, kind, data)])[0]

    def record_many(
        self, step: int, rows: Sequence[tuple[str, str, Mapping[str, Any]]]
    ) -> list[str]:
        """Appends ``(task_id, kind, data)`` records written at ``step`` in one Chroma call."""
        step = int(step)
        ids, docs, metas = [], [], []
        for task_id, kind, data in rows:
            if kind not in KINDS:
                raise ValueError(f"memory record kind {kind!r}: expected one of {KINDS}")
            try:
                doc = json.dumps(data, sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"memory record ({task_id!r}, {kind!r}, step {step}): data is not JSON: {e}"
                ) from e
            seq = self._seq.get(step, 0)
            self._seq[step] = seq + 1
            ids.append(f"{step:09d}|{seq:07d}")
            docs.append(doc)
            metas.append({"task_id": str(task_id), "kind": kind, "step": step, "seq": seq})
        if ids:
            self._time.add(
                ids=ids, documents=docs, metadatas=metas, embeddings=np.ones((len(ids), 1))
            )
        return ids

    def history(
        self,
        task_id: str,
        *,
        kinds: Iterable[str] | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> list[TimeRecord]:
        """The task's records, oldest first (steps in ``[since, until]`` when given)."""
        clauses: list[dict[str, Any]] = [{"task_id": str(task_id)}]
        if kinds is not None:
            kinds = list(kinds)
            bad = [k for k in kinds if k not in KINDS]
            if bad:
                raise ValueError(f"memory history kinds {bad}: expected a subset of {KINDS}")
            clauses.append({"kind": {"$in": kinds}})
        if since is not None:
            clauses.append({"step": {"$gte": int(since)}})
        if until is not None:
            clauses.append({"step": {"$lte": int(until)}})
        where = clauses[0] if len(clauses) == 1 else {"$and": clauses}
        got = self._time.get(where=where, include=["documents", "metadatas"])
        rows = sorted(
            zip(got["metadatas"], got["documents"], strict=True),
            key=lambda md: (md[0]["step"], md[0]["seq"]),
        )
        return [TimeRecord(m["task_id"], int(m["step"]), m["kind"], json.loads(d)) for m, d in rows]

    # ------------------------------------------------------------------ semantic index

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts`` (cached by text: criterion texts repeat across steps)."""
        todo = sorted({t for t in texts if t not in self._cache})
        if todo:
            for t, v in zip(todo, self.embedder.embed(todo), strict=True):
                self._cache[t] = np.asarray(v, np.float32)
        if not texts:
            return np.zeros((0, int(self.embedder.dim)), np.float32)
        return np.stack([self._cache[t] for t in texts])

    def index_criteria(self, step: int, entries: Sequence[CriterionEntry]) -> None:
        """Adds criterion versions written at ``step``. An entry whose text, weight sign, anchor
        flag and deletion equal its current version's is skipped (nothing changed)."""
        step = int(step)
        rows = []
        for e in entries:
            if not e.text:
                raise ValueError(
                    f"memory: criterion {e.criterion_id!r} of task {e.task_id!r} has empty text"
                )
            key = (str(e.task_id), str(e.criterion_id))
            cur = self._current_version.get(key)
            # Chroma's metadata floats come back within an ulp: weights compare approximately.
            if cur is not None and (cur[0], cur[2], cur[3]) == (e.text, e.anchor, e.deleted):
                if math.isclose(cur[1], float(e.weight), rel_tol=1e-9, abs_tol=1e-12):
                    continue
            rows.append(e)
        if not rows:
            return
        vecs = self.embed([e.text for e in rows])
        ids, metas = [], []
        for e in rows:
            seq = self._seq.get(step, 0)
            self._seq[step] = seq + 1
            ids.append(f"{step:09d}|{seq:07d}")
            metas.append(
                {
                    "task_id": str(e.task_id),
                    "criterion_id": str(e.criterion_id),
                    "step": step,
                    "weight": float(e.weight),
                    "anchor": bool(e.anchor),
                    "deleted": bool(e.deleted),
                }
            )
            key = (str(e.task_id), str(e.criterion_id))
            self._latest[key] = (ids[-1], bool(e.deleted))
            self._current_version[key] = (e.text, float(e.weight), bool(e.anchor), bool(e.deleted))
        self._sem.add(ids=ids, embeddings=vecs, documents=[e.text for e in rows], metadatas=metas)

    def related(
        self,
        texts: Sequence[str],
        *,
        exclude_task: str | Sequence[str | None] | None = None,
        k: int | None = None,
    ) -> list[list[Neighbour]]:
        """Per query text, up to ``k`` (default top_k) current criteria with cosine ≥ floor, most
        similar first; ``exclude_task`` (one id, or one per text) leaves a task's own out."""
        k = self.top_k if k is None else int(k)
        texts = list(texts)
        if isinstance(exclude_task, str) or exclude_task is None:
            excl = [exclude_task] * len(texts)
        else:
            excl = list(exclude_task)
            if len(excl) != len(texts):
                raise ValueError("memory.related: exclude_task needs one entry per text")
        total = self._sem.count()
        if not texts:
            return []
        if total == 0:
            return [[] for _ in texts]
        q = self.embed(texts)
        n = min(total, self.candidates)
        out: list[list[Neighbour]] = [[] for _ in texts]
        # One Chroma query per distinct exclusion, all its texts at once.
        by_excl: dict[str | None, list[int]] = {}
        for i, ex in enumerate(excl):
            by_excl.setdefault(None if ex is None else str(ex), []).append(i)
        for ex, rows in by_excl.items():
            where = {"deleted": False} if ex is None else {
                "$and": [{"deleted": False}, {"task_id": {"$ne": ex}}]
            }  # fmt: skip
            got = self._sem.query(
                query_embeddings=q[rows].astype(np.float64),
                n_results=n,
                where=where,
                include=["embeddings", "documents", "metadatas"],
            )
            for r, qi in enumerate(rows):
                out[qi] = self._rank(q[qi], got, r, k)
        return out

    def _rank(self, vec: np.ndarray, got: Mapping[str, Any], r: int, k: int) -> list[Neighbour]:
        """Query result ``r``: current versions with exact cosine ≥ floor, best ``k``."""
        embs = got["embeddings"][r]
        if embs is None or len(embs) == 0:
            return []
        cos = np.asarray(embs, np.float64) @ np.asarray(vec, np.float64)
        best: dict[tuple[str, str], Neighbour] = {}
        hits = zip(cos, got["ids"][r], got["documents"][r], got["metadatas"][r], strict=True)
        for c, i, d, m in hits:
            key = (m["task_id"], m["criterion_id"])
            if self._latest.get(key) != (i, False):
                continue  # a superseded version, or the criterion is deleted
            if c < self.floor:
                continue
            best[key] = Neighbour(
                m["task_id"], m["criterion_id"], d, float(c), int(m["step"]),
                float(m["weight"]), bool(m["anchor"]),
            )  # fmt: skip
        ranked = sorted(best.values(), key=lambda nb: (-nb.cosine, nb.task_id, nb.criterion_id))
        return ranked[:k]

    # ------------------------------------------------------------------ lifecycle

    def _load_latest(self) -> None:
        self._latest = {}
        self._current_version = {}
        got = self._sem.get(include=["metadatas", "documents"])
        rows = sorted(zip(got["ids"], got["metadatas"], got["documents"], strict=True))
        for i, m, d in rows:
            key = (m["task_id"], m["criterion_id"])
            self._latest[key] = (i, bool(m["deleted"]))
            self._current_version[key] = (
                d,
                float(m["weight"]),
                bool(m["anchor"]),
                bool(m["deleted"]),
            )
        self._seq = {}
        for col in (self._time, self._sem):
            for i in col.get(include=[])["ids"]:
                s, q = (int(x) for x in i.split("|"))
                self._seq[s] = max(self._seq.get(s, 0), q + 1)

    def rollback(self, step: int) -> dict[str, int]:
        """Deletes every record and criterion version written after ``step``; returns how many
        of each were removed."""
        step = int(step)
        removed = {}
        for name, col in (("time", self._time), ("semantic", self._sem)):
            later = col.get(where={"step": {"$gt": step}}, include=[])["ids"]
            if later:
                col.delete(ids=later)
            removed[name] = len(later)
        self._load_latest()
        return removed

    def counts(self) -> dict[str, int]:
        live = sum(1 for _, deleted in self._latest.values() if not deleted)
        return {
            "time_records": int(self._time.count()),
            "criterion_versions": int(self._sem.count()),
            "criteria_live": live,
        }


__all__ = ["KINDS", "CriterionEntry", "HarnessMemory", "Neighbour", "TimeRecord"]
