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
  the top-k (k = 4) current criteria whose cosine with it is at least the floor η, most similar
  first (ties by task and criterion id). Chroma is the store of record; the search itself is
  exact and exhaustive over an in-process mirror of the current versions' embeddings (one row
  per criterion, rebuilt from Chroma on open and rollback): one matrix product per call ranks
  every current criterion in float32, and the cosines of those that can reach the top k are
  recomputed in float64, so a criterion exactly at the floor is retrieved. (Chroma's own HNSW index
  with a metadata filter per task is approximate beyond 32 candidates, and was most of the
  memory's time.)

Writes (``record_many``, ``index_criteria``) are validated, numbered and mirrored at once, and
handed to one background thread that adds them to Chroma in order (ours: Chroma's ``add`` costs
~2 ms a record, and the next step's generation overlaps it). Every Chroma read (``history``,
``histories``, ``counts``, ``rollback``) and ``flush`` waits for the pending writes first and
raises the first one that failed; the harness controller flushes in ``state_dict``, so a
checkpoint never precedes its step's memory. ``background_writes=False`` writes in the caller.

Rollback (``rollback(step)``): on resume from a checkpoint at step s, every record and every
criterion version written after s is deleted, so a resumed run's memory equals an uninterrupted
run's at s.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
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


@dataclasses.dataclass(frozen=True)
class _Version:
    """A criterion's current version, as the mirror of the semantic index keeps it."""

    task_id: str
    criterion_id: str
    text: str
    step: int
    weight: float
    anchor: bool
    deleted: bool

    @classmethod
    def of(cls, meta: Mapping[str, Any], text: str) -> _Version:
        return cls(
            str(meta["task_id"]), str(meta["criterion_id"]), text, int(meta["step"]),
            float(meta["weight"]), bool(meta["anchor"]), bool(meta["deleted"]),
        )  # fmt: skip


class _Current:
    """The current version of every criterion, one row per criterion, and one embedding per
    distinct text (criteria of many tasks share a text): the exact search behind
    ``HarnessMemory.related``."""

    def __init__(self, dim: int):
        self._rows: dict[tuple[str, str], int] = {}
        self._versions: list[_Version] = []
        self._alive = np.zeros(64, bool)
        self._task = np.zeros(64, np.int64)  # task code per row
        self._text = np.zeros(64, np.int64)  # text code per row
        self._codes: dict[str, int] = {}
        self._task_rows: dict[int, list[int]] = {}
        self._texts: dict[str, int] = {}
        self._t32 = np.zeros((64, dim), np.float32)  # per text: the ranking's copy
        self._t64 = np.zeros((64, dim), np.float64)  # per text: the exact cosines' copy
        self._rank = np.zeros(0, np.int64)

    def version(self, key: tuple[str, str]) -> _Version | None:
        r = self._rows.get(key)
        return None if r is None else self._versions[r]

    def live(self) -> int:
        return int(self._alive[: len(self._versions)].sum())

    @staticmethod
    def _grown(a: np.ndarray, n: int) -> np.ndarray:
        return a if n < len(a) else np.concatenate([a, np.zeros_like(a)])

    def set(self, v: _Version, vec: np.ndarray) -> None:
        """Makes ``v`` its criterion's current version; a text keeps its first embedding."""
        key = (v.task_id, v.criterion_id)
        r = self._rows.get(key)
        if r is None:
            r = len(self._versions)
            self._alive, self._task, self._text = (
                self._grown(a, r) for a in (self._alive, self._task, self._text)
            )
            self._rows[key] = r
            self._versions.append(v)
            code = self._codes.setdefault(v.task_id, len(self._codes))
            self._task[r] = code
            self._task_rows.setdefault(code, []).append(r)
        else:
            self._versions[r] = v
        t = self._texts.get(v.text)
        if t is None:
            t = len(self._texts)
            self._t32, self._t64 = self._grown(self._t32, t), self._grown(self._t64, t)
            self._t32[t] = vec
            self._t64[t] = self._t32[t]
            self._texts[v.text] = t
        self._text[r] = t
        self._alive[r] = not v.deleted

    def _name_rank(self) -> np.ndarray:
        """Per row, the rank of its (task, criterion) in sorted order: the tie-break."""
        n = len(self._versions)
        if len(self._rank) != n:
            keys = sorted(self._rows)
            self._rank = np.zeros(n, np.int64)
            self._rank[[self._rows[key] for key in keys]] = np.arange(n)
        return self._rank

    def search(
        self, q: np.ndarray, exclude: Sequence[str | None], *, k: int, floor: float,
        block: int = 256,
    ) -> list[list[Neighbour]]:  # fmt: skip
        """Per row of ``q``: the best ``k`` live criteria (not of the row's excluded task) with
        cosine ≥ ``floor``, ties broken by (task, criterion). Ranked in float32 over every
        criterion; the cosines of the distinct texts within 1e-4 of the k-th best (and of the
        floor) are recomputed in float64, each text's sum on its own (the same value whatever
        else is recomputed)."""
        n, u = len(self._versions), len(self._texts)
        out: list[list[Neighbour]] = [[] for _ in range(len(q))]
        if n == 0 or not self._alive[:n].any():
            return out
        text, dead = self._text[:n], ~self._alive[:n]
        rank = self._name_rank()
        excl = [None if e is None else self._codes.get(str(e)) for e in exclude]
        slack = 1e-4  # far above float32's error on unit vectors of a few hundred dimensions
        kk = min(k, n)
        for b0 in range(0, len(q), block):
            sims = (q[b0 : b0 + block] @ self._t32[:u].T)[:, text]
            sims[:, dead] = -np.inf
            for r, code in enumerate(excl[b0 : b0 + block]):
                if code is not None:
                    sims[r, self._task_rows[code]] = -np.inf
            kth = -np.partition(-sims, kk - 1, axis=1)[:, kk - 1]
            for r in range(len(sims)):
                cols = np.flatnonzero(sims[r] >= max(float(kth[r]), floor) - slack)
                if not cols.size:
                    continue
                texts, which = np.unique(text[cols], return_inverse=True)
                cos = (self._t64[texts] * q[b0 + r].astype(np.float64)).sum(axis=1)[which]
                keep = cos >= floor
                cols, cos = cols[keep], cos[keep]
                best = np.lexsort((rank[cols], -cos))[:k]
                hits = []
                for c, cs in zip(cols[best], cos[best], strict=True):
                    v = self._versions[c]
                    hits.append(Neighbour(
                        v.task_id, v.criterion_id, v.text, float(cs), v.step, v.weight, v.anchor
                    ))  # fmt: skip
                out[b0 + r] = hits
        return out


def _chroma():
    try:
        import chromadb
        from chromadb.config import Settings
    except ImportError as e:
        raise ImportError("the harness memory needs ChromaDB: pip install -e '.[harness]'") from e
    return chromadb, Settings


DB_FILE = "chroma.sqlite3"  # the ChromaDB file of record inside the memory's directory


class HarnessMemoryError(RuntimeError):
    """ChromaDB failed on the memory's files: the message names the file and the cause."""


def _is_store_error(e: BaseException) -> bool:
    import sqlite3

    return isinstance(e, sqlite3.Error) or type(e).__module__.split(".")[0] == "chromadb"


@contextlib.contextmanager
def _naming_file(path: str, what: str):
    """Re-raises a ChromaDB / SQLite error (whose text names no file: ``database disk image is
    malformed``) as ``HarnessMemoryError`` naming the memory's database file and what was being
    done; other errors pass through unchanged."""
    try:
        yield
    except Exception as e:
        if not _is_store_error(e):
            raise
        raise HarnessMemoryError(
            f"{os.path.join(path, DB_FILE)}: the harness memory's ChromaDB failed while {what}: "
            f"{type(e).__name__}: {e} (a damaged run directory: restore controllers/ from a "
            "copy, or resume with --rebuild_controller_files after moving it aside)"
        ) from e


class HarnessMemory:
    """Time index + semantic index in a persistent ChromaDB at ``path`` (module docstring)."""

    def __init__(
        self,
        path: str,
        embedder: Embedder,
        *,
        top_k: int = 4,
        floor: float | None = None,
        background_writes: bool = True,
    ):
        if int(top_k) < 1:
            raise ValueError(f"memory.top_k={top_k}: must be >= 1")
        chromadb, Settings = _chroma()
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)
        self.embedder = embedder
        self.top_k = int(top_k)
        self.floor = floor_for(embedder, floor)
        with _naming_file(self.path, "opening it"):
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
        self._current = _Current(int(embedder.dim))
        self._writer = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="harness-memory")
            if background_writes
            else None
        )
        self._pending: list[concurrent.futures.Future] = []
        with _naming_file(self.path, "reading it"):
            self._load_latest()

    def _write(self, add, **kwargs) -> None:
        if self._writer is None:
            add(**kwargs)
        else:
            self._pending.append(self._writer.submit(add, **kwargs))

    def flush(self) -> None:
        """Waits for the pending Chroma writes; raises the first that failed (module docstring)."""
        pending, self._pending = self._pending, []
        errors = [e for e in (f.exception() for f in pending) if e is not None]
        if errors:
            if _is_store_error(errors[0]):
                with _naming_file(self.path, "writing records"):
                    raise errors[0]
            raise RuntimeError(f"{self.path}: a harness memory write failed") from errors[0]

    def close(self) -> None:
        """Flushes and stops the writer thread."""
        self.flush()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

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
            self._write(
                self._time.add,
                ids=ids, documents=docs, metadatas=metas, embeddings=np.ones((len(ids), 1)),
            )  # fmt: skip
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
        return self.histories([task_id], kinds=kinds, since=since, until=until)[str(task_id)]

    def histories(
        self,
        task_ids: Iterable[str],
        *,
        kinds: Iterable[str] | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[str, list[TimeRecord]]:
        """``history`` of several tasks in one Chroma read: task id -> its records, oldest
        first (an empty list for a task with none)."""
        ids = sorted({str(t) for t in task_ids})
        out: dict[str, list[TimeRecord]] = {t: [] for t in ids}
        if not ids:
            return out
        clauses: list[dict[str, Any]] = [
            {"task_id": ids[0]} if len(ids) == 1 else {"task_id": {"$in": ids}}
        ]
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
        self.flush()
        with _naming_file(self.path, "reading task histories"):
            got = self._time.get(where=where, include=["documents", "metadatas"])
        rows = sorted(
            zip(got["metadatas"], got["documents"], strict=True),
            key=lambda md: (md[0]["step"], md[0]["seq"]),
        )
        for m, d in rows:
            out[m["task_id"]].append(
                TimeRecord(m["task_id"], int(m["step"]), m["kind"], json.loads(d))
            )
        return out

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
            cur = self._current.version((str(e.task_id), str(e.criterion_id)))
            # Chroma's metadata floats come back within an ulp: weights compare approximately.
            if cur is not None and (cur.text, cur.anchor, cur.deleted) == (
                e.text, e.anchor, e.deleted
            ):  # fmt: skip
                if math.isclose(cur.weight, float(e.weight), rel_tol=1e-9, abs_tol=1e-12):
                    continue
            rows.append(e)
        if not rows:
            return
        vecs = self.embed([e.text for e in rows])
        ids, metas = [], []
        for e, vec in zip(rows, vecs, strict=True):
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
            self._current.set(_Version.of(metas[-1], e.text), vec)
        self._write(
            self._sem.add, ids=ids, embeddings=vecs, documents=[e.text for e in rows],
            metadatas=metas,
        )  # fmt: skip

    def related(
        self,
        texts: Sequence[str],
        *,
        exclude_task: str | Sequence[str | None] | None = None,
        k: int | None = None,
    ) -> list[list[Neighbour]]:
        """Per query text, up to ``k`` (default top_k) current criteria with cosine ≥ floor, most
        similar first; ``exclude_task`` (one id, or one per text) leaves a task's own out. All the
        texts are searched at once: pass a whole step's queries in one call."""
        k = self.top_k if k is None else int(k)
        texts = list(texts)
        if isinstance(exclude_task, str) or exclude_task is None:
            excl = [exclude_task] * len(texts)
        else:
            excl = list(exclude_task)
            if len(excl) != len(texts):
                raise ValueError("memory.related: exclude_task needs one entry per text")
        if not texts:
            return []
        return self._current.search(self.embed(texts), excl, k=k, floor=self.floor)

    # ------------------------------------------------------------------ lifecycle

    def _load_latest(self) -> None:
        """Rebuilds the mirror of the current versions and the id counters from Chroma."""
        self.flush()
        self._current = _Current(int(self.embedder.dim))
        got = self._sem.get(include=["metadatas", "documents", "embeddings"])
        order = sorted(range(len(got["ids"])), key=lambda i: got["ids"][i])
        for i in order:
            v = _Version.of(got["metadatas"][i], got["documents"][i])
            vec = np.asarray(got["embeddings"][i], np.float32)
            self._current.set(v, vec)
            # A reopened memory embeds a known text as the run did (the first stored vector).
            self._cache.setdefault(v.text, vec)
        self._seq = {}
        for col in (self._time, self._sem):
            for i in col.get(include=[])["ids"]:
                s, q = (int(x) for x in i.split("|"))
                self._seq[s] = max(self._seq.get(s, 0), q + 1)

    def rollback(self, step: int) -> dict[str, int]:
        """Deletes every record and criterion version written after ``step``; returns how many
        of each were removed."""
        step = int(step)
        self.flush()
        removed = {}
        with _naming_file(self.path, f"rolling back to step {step}"):
            for name, col in (("time", self._time), ("semantic", self._sem)):
                later = col.get(where={"step": {"$gt": step}}, include=[])["ids"]
                if later:
                    col.delete(ids=later)
                removed[name] = len(later)
            self._load_latest()
        return removed

    def counts(self) -> dict[str, int]:
        live = self._current.live()
        self.flush()
        with _naming_file(self.path, "counting records"):
            return {
                "time_records": int(self._time.count()),
                "criterion_versions": int(self._sem.count()),
                "criteria_live": live,
            }


__all__ = [
    "KINDS",
    "CriterionEntry",
    "HarnessMemory",
    "HarnessMemoryError",
    "Neighbour",
    "TimeRecord",
]
