"""Files that controllers write into the run directory, and their rollback on resume.

Each controller owns ``<workdir>/controllers/<name>/`` (``Controller.run_dir``). Files there
follow one convention, so that a resumed run ends with the same files as an uninterrupted one
(as ``metrics.jsonl`` does): a JSONL file's rows carry the ``step`` that wrote them, and any
other file written at a step carries that step in its name or in a parent folder's name
(``step_000123``, ``step-7``, ``...step12...``). On resume from a checkpoint at step s
(``rollback(root, s)``), rows with ``step > s`` are dropped and such files (or folders) of later
steps are deleted: the step watermark. Files without a step are kept as they are.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

STEP_NAME = re.compile(r"step[_-]?(\d+)")


def step_of(name: str) -> int | None:
    """The step a file or folder name carries (``step_12.json`` -> 12), or None."""
    m = STEP_NAME.search(name)
    return int(m.group(1)) if m else None


def step_path(root: str, step: int, name: str) -> str:
    """``<root>/step_<step:06d>/<name>``, its folder created: a file written at ``step``."""
    d = os.path.join(root, f"step_{int(step):06d}")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


def append_jsonl(path: str, step: int, row: dict) -> None:
    """One row, stamped with the step that wrote it, appended to a JSONL file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({**row, "step": int(step)}, sort_keys=True) + "\n")


def _truncate_jsonl(path: str, step: int) -> None:
    keep = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a killed run
            s = row.get("step") if isinstance(row, dict) else None
            if s is None or int(s) <= step:
                keep.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(keep)
    os.replace(tmp, path)


def rollback(root: str, step: int) -> list[str]:
    """Removes what was written under ``root`` after ``step`` (module docstring); returns the
    paths deleted."""
    removed: list[str] = []
    if not os.path.isdir(root):
        return removed
    for dirpath, dirnames, filenames in os.walk(root, topdown=True):
        for d in list(dirnames):
            s = step_of(d)
            if s is not None and s > step:
                shutil.rmtree(os.path.join(dirpath, d))
                removed.append(os.path.join(dirpath, d))
                dirnames.remove(d)
        for f in filenames:
            p = os.path.join(dirpath, f)
            s = step_of(f)
            if s is not None and s > step:
                os.remove(p)
                removed.append(p)
            elif f.endswith(".jsonl"):
                _truncate_jsonl(p, step)
    return removed


# Files a store rewrites or removes on its own between checkpoints (SQLite's write-ahead log and
# journal, atomic-write temporaries, locks): their absence says nothing about lost state.
TRANSIENT = ("-wal", "-shm", "-journal", ".tmp", ".lock")


def _rows(path: str) -> int:
    """Complete JSONL rows in ``path`` (newline-terminated; a torn last line is not one)."""
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


class ControllerFilesError(RuntimeError):
    """A resume whose controllers' files do not match the checkpoint's manifest (the message
    names each file or store, and how to continue)."""


def manifest(root: str, records: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """What the controllers hold on disk when a checkpoint is written: every file under
    ``root`` (``<workdir>/controllers``) by relative path, with its row count for JSONL files
    (None for others), and each controller's record counts in stores that files alone do not
    describe (``Controller.disk_records``: the harness memory's ChromaDB). ``verify`` checks a
    resumed run's directory against it."""
    files: dict[str, int | None] = {}
    if os.path.isdir(root):
        for dirpath, _, filenames in os.walk(root):
            for f in filenames:
                if f.endswith(TRANSIENT):
                    continue
                p = os.path.join(dirpath, f)
                files[os.path.relpath(p, root)] = _rows(p) if f.endswith(".jsonl") else None
    return {"files": dict(sorted(files.items())), "records": dict(records or {})}


def verify(
    root: str, saved: dict[str, Any], records: dict[str, dict[str, int]] | None = None
) -> list[str]:
    """What of the checkpoint's ``manifest`` is missing or short under ``root`` now (after the
    resume's ``rollback``), one line each naming the file or store: a file gone, a JSONL file
    with fewer rows than it had, a controller store with fewer records. Empty when intact."""
    problems = []
    for rel, rows in saved.get("files", {}).items():
        p = os.path.join(root, rel)
        if not os.path.isfile(p):
            problems.append(f"{p}: missing")
        elif rows is not None and (now := _rows(p)) < rows:
            problems.append(f"{p}: {now} rows, the checkpoint was written with {rows}")
    records = records or {}
    for name, counts in saved.get("records", {}).items():
        for what, n in counts.items():
            now = records.get(name, {}).get(what, 0)
            if now < n:
                problems.append(
                    f"{os.path.join(root, name)}: {now} {what}, the checkpoint was written with {n}"
                )
    return problems


__all__ = [
    "ControllerFilesError",
    "append_jsonl",
    "manifest",
    "rollback",
    "step_of",
    "step_path",
    "verify",
]
