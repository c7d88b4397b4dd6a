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


__all__ = ["append_jsonl", "rollback", "step_of", "step_path"]
