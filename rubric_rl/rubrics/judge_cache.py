"""Content-addressed sqlite cache of judge verdicts.

Key = sha256 of (judge model, template name@version, sampling parameters, criterion text, title,
weight sign and choices, task text and reference answer, response). Re-grading an unchanged
(criterion, response) pair is therefore free — the HarnessRL just-in-time critic re-grades the same
pairs every time a rubric is edited. The criterion *id* is not in the key (a renamed criterion
with the same text reuses its verdicts). Failed verdicts (``met is None``) are never stored: a
failure must be retried next time, not replayed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Mapping
from typing import Any

from rubric_rl.rubrics.types import Criterion, Task, Verdict

_SCHEMA = """CREATE TABLE IF NOT EXISTS verdicts (
    key TEXT PRIMARY KEY,
    verdict TEXT NOT NULL,
    created REAL NOT NULL DEFAULT (julianday('now'))
)"""


def cache_key(
    *,
    model: str,
    template: str,
    sampling: Mapping[str, Any],
    criterion: Criterion,
    task: Task,
    response: str,
) -> str:
    payload = {
        "model": model,
        "template": template,
        "sampling": dict(sorted(sampling.items())),
        "criterion": {
            "text": criterion.text,
            "title": criterion.title,
            "sign": 1 if criterion.weight > 0 else -1,
            "choices": list(criterion.choices),
        },
        "task": [m.to_dict() for m in task.prompt],
        "reference": task.reference_answer,
        "response": response,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """sqlite-backed verdict cache; ``":memory:"`` (default) or a file path. Thread-safe: one
    connection guarded by a lock (sqlite calls are short; judges await the network, not this)."""

    def __init__(self, path: str | os.PathLike[str] = ":memory:"):
        self.path = str(path)
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(_SCHEMA)
        self.hits = 0
        self.misses = 0

    def get(self, key: str, *, criterion_id: str) -> Verdict | None:
        """The cached verdict re-labelled with ``criterion_id`` (usage empty: it cost nothing)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT verdict FROM verdicts WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        data = json.loads(row[0])
        return Verdict(
            criterion_id=criterion_id,
            met=bool(data["met"]),
            explanation=data.get("explanation", ""),
            judge_model=data.get("judge_model", ""),
            prompt_hash=data.get("prompt_hash", ""),
        )

    def put(self, key: str, verdict: Verdict) -> bool:
        """Stores a successful verdict; returns False (and stores nothing) for a failure."""
        if verdict.met is None:
            return False
        blob = json.dumps(
            {
                "met": verdict.met,
                "explanation": verdict.explanation,
                "judge_model": verdict.judge_model,
                "prompt_hash": verdict.prompt_hash,
            },
            ensure_ascii=False,
        )
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO verdicts (key, verdict) VALUES (?, ?)", (key, blob)
            )
        return True

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"JudgeCache(path={self.path!r}, hits={self.hits}, misses={self.misses})"
