"""Who owns a run directory, and its config record (CONVENTIONS.md "Run directory").

- ``lock(workdir)``: an exclusive ``flock`` on ``<workdir>/.lock``, held for the life of the
  process. The kernel drops it when the process exits or is killed, so a lock left by a dead run
  never blocks; a second run into a live run's workdir fails at once, naming the holder's pid.
- ``default_workdir(config_arg)``: ``runs/<config>-<variant>-<UTC time to the microsecond>``,
  created exclusively (``-2``, ``-3``... on a collision), so two launches never share one.
- ``claim(workdir, config, resume=..., allow_changes=...)``: the launch's checks, in the order
  that loses nothing: the path is a directory; ``--resume`` has a checkpoint to continue; the
  lock; a fresh run does not land on another run's checkpoints; a resumed run's config equals
  the recorded one except for the keys it is allowed to change. Only then is ``config.json``
  written: a refused launch leaves the directory as it found it. Allowed changes are appended to
  ``config_changes.jsonl`` (each key's old and new value), so the earlier record is never lost.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any

CONFIG = "config.json"
CONFIG_CHANGES = "config_changes.jsonl"
LOCK = ".lock"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")
_held: dict[str, int] = {}  # workdir -> the lock file's descriptor, open until the process exits


class RunDirError(RuntimeError):
    """A launch refused before it wrote anything (the message says why and what to do)."""


def checkpoint_steps(workdir: str) -> list[int]:
    """Complete checkpoint steps under ``<workdir>/checkpoints`` (orbax's temporary directories,
    ``<step>.orbax-checkpoint-tmp-*``, are not steps)."""
    d = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(d):
        return []
    return sorted(int(n) for n in os.listdir(d) if n.isdigit() and os.path.isdir(f"{d}/{n}"))


def writes_no_checkpoint(checkpoint: Mapping[str, Any]) -> bool:
    """A run whose ``checkpoint`` section (config or record) saves no step: ``every=0`` and
    ``final=False``."""
    return int(checkpoint.get("every", 1)) == 0 and checkpoint.get("final", True) is False


def checkpoint_due(checkpoint: Mapping[str, Any], step: int, total: int) -> bool:
    """Whether step ``step`` of a ``total``-step run saves a checkpoint: every
    ``checkpoint.every`` steps (0: never) and, with ``checkpoint.final``, the last one."""
    every = int(checkpoint.get("every", 1))
    final = bool(checkpoint.get("final", True))
    return (every > 0 and step % every == 0) or (final and step == total)


# ------------------------------------------------------------------------------ naming


def default_workdir(
    config_arg: str, root: str = "runs", now: datetime.datetime | None = None
) -> str:
    """A new, empty directory ``<root>/<config>[-<variant>]-<YYYYmmdd-HHMMSS-ffffff>`` for
    ``--config=<file>[:<variant>]``, created here (exclusively: never one another launch made)."""
    path, _, variant = config_arg.partition(":")
    name = os.path.splitext(os.path.basename(path))[0]
    if variant:
        name += "-" + _UNSAFE.sub("_", variant.replace(",", "+").replace("=", "_")).strip("_")
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%d-%H%M%S-%f")
    base = os.path.join(root, f"{name}-{stamp}")
    os.makedirs(root, exist_ok=True)
    for n in range(1, 1000):
        candidate = base if n == 1 else f"{base}-{n}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise RunDirError(f"no free run directory name under {root!r} for {base!r}")


# ------------------------------------------------------------------------------ lock


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        text = ""
    return text or "pid unknown (it is starting up)"


def lock(workdir: str) -> str:
    """Takes the exclusive lock on ``workdir`` (created if missing) for this process; returns
    the lock file's path. Raises ``RunDirError`` naming the holder when another process has it."""
    workdir = os.path.abspath(workdir)
    if workdir in _held:
        return os.path.join(workdir, LOCK)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirError(
            f"--workdir {workdir} is in use by another run ({_holder(path)}); wait for it to "
            "finish, stop it, or choose another --workdir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[workdir] = fd
    return path


def lock_holder(workdir: str) -> str | None:
    """Who holds ``workdir``'s lock (``"pid N on host"``), or None when no live process does (no
    lock file, or one whose holder has exited). Probes with a non-blocking ``flock`` it releases
    at once, so it never takes a run directory from anyone."""
    path = os.path.join(workdir, LOCK)
    if os.path.abspath(workdir) in _held:
        return _holder(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(path)
    finally:
        os.close(fd)  # closing drops the probe's lock when it got one
    return None


ASIDE = ".replaced-"  # <workdir>.replaced-<UTC time>: a forced rerun's earlier run, kept


def set_aside(workdir: str, now: datetime.datetime | None = None) -> str | None:
    """Moves ``workdir`` to ``<workdir>.replaced-<UTC time>`` beside it (returned; None when
    there is no such directory) so a forced rerun starts empty without deleting the earlier
    run. Raises ``RunDirError`` naming the holder's pid when a live run holds its lock; the
    lock is held across the rename, so no run can claim the directory between check and move.
    The new name does not match ``seed<k>``, so aggregation never mixes it into a group."""
    workdir = os.path.abspath(workdir)
    if not os.path.isdir(workdir):
        return None
    fd = os.open(os.path.join(workdir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(
                f"{workdir} is in use by a live run ({_holder(os.path.join(workdir, LOCK))}); "
                "not moved or deleted: wait for it to finish or stop it first"
            ) from None
        stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%d-%H%M%S-%f")
        dest = f"{workdir}{ASIDE}{stamp}"
        os.rename(workdir, dest)  # same parent: atomic, never a copy-and-delete
        return dest
    finally:
        os.close(fd)


def unlock(workdir: str) -> None:
    """Releases this process's lock on ``workdir`` (process exit releases it too)."""
    fd = _held.pop(os.path.abspath(workdir), None)
    if fd is not None:
        os.close(fd)


# ------------------------------------------------------------------------------ config record


def config_record(config: Any) -> dict[str, Any]:
    """The config as ``config.json`` holds it: credential-like keys dropped, a key pasted into an
    ``*_env`` setting redacted (``validate_config`` refuses one first), JSON types."""
    from rubric_rl.metrics import scrub
    from rubric_rl.rubrics.llm import redact_env_settings

    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return json.loads(json.dumps(redact_env_settings(scrub(data)), sort_keys=True, default=list))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}`` (lists are values, not branches)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


_ABSENT = "(absent)"


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old, new)}`` for every key whose value differs (``"(absent)"`` when a
    side lacks it)."""
    a, b = flatten(old), flatten(new)
    return {
        k: (a.get(k, _ABSENT), b.get(k, _ABSENT))
        for k in sorted(set(a) | set(b))
        if a.get(k, _ABSENT) != b.get(k, _ABSENT)
    }


def _allowed(key: str, allow: Iterable[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allow)


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"{path}: the run's config record is not valid JSON ({e})") from None


def _write_json(path: str, data: Any) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


def check_config_change(
    workdir: str, record: Mapping[str, Any], allow: Iterable[str] = ()
) -> dict[str, tuple[Any, Any]]:
    """The allowed changes of ``record`` against ``<workdir>/config.json`` (empty when there is
    no record yet), keys new since the record included; raises ``RunDirError`` with the diff when
    a recorded key outside ``allow`` changed or is gone, or when an allowed key is not a config
    key (a typo would allow nothing)."""
    allow = [a.strip() for a in allow if a.strip()]
    keys = set(flatten(record))
    for a in allow:
        if not any(_allowed(k, [a]) for k in keys):
            raise RunDirError(f"--allow_config_change={a}: no such config key")
    path = os.path.join(workdir, CONFIG)
    if not os.path.exists(path):
        return {}
    diff = config_diff(_read_json(path), record)
    # A key the record lacks was added to the configs after the run started (a new option, at
    # its default unless the launch sets it): taken as it is now, warned and recorded as a
    # change, not refused — else every run recorded before a new option could never resume.
    refused = {k: v for k, v in diff.items() if not _allowed(k, allow) and v[0] != _ABSENT}
    if refused:
        lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise RunDirError(
            f"--resume: the config differs from the run's record {path}:\n{lines}\n"
            "resume with the recorded config, or allow the change with "
            f"--allow_config_change={','.join(refused)}"
        )
    return diff


def record_config(workdir: str, record: Mapping[str, Any], changes=None, step=None) -> str:
    """Writes ``config.json``; allowed changes of a resumed run are appended first to
    ``config_changes.jsonl`` (old and new value per key, the checkpoint step resumed from)."""
    if changes:
        row = {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "resumed_from_step": step,
            "changes": {k: {"old": old, "new": new} for k, (old, new) in changes.items()},
        }
        with open(os.path.join(workdir, CONFIG_CHANGES), "a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    path = os.path.join(workdir, CONFIG)
    _write_json(path, dict(record))
    return path


def claim(
    workdir: str,
    config: Any,
    *,
    resume: bool = False,
    allow_changes: Iterable[str] = (),
) -> dict[str, tuple[Any, Any]]:
    """The launch's checks and the config record (module docstring), in that order; returns the
    allowed config changes. Raises ``RunDirError`` before anything is written."""
    workdir = os.path.abspath(workdir)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise RunDirError(f"--workdir {workdir} is a file, not a directory; choose another path")
    if resume and not checkpoint_steps(workdir):
        if not os.path.exists(workdir):
            what = "does not exist"
        elif os.path.exists(os.path.join(workdir, CONFIG)):
            ck = _read_json(os.path.join(workdir, CONFIG)).get("checkpoint", {})
            if writes_no_checkpoint(ck):
                what = "holds a run whose config writes none (checkpoint.every=0, final=False)"
            else:
                what = "holds a run that stopped before its first checkpoint was complete"
        else:
            what = "holds no checkpoint"
        raise RunDirError(
            f"--resume: nothing to resume, {workdir} {what} (checkpoints/<step>); "
            "run without --resume to start a new run there"
        )
    lock(workdir)
    steps = checkpoint_steps(workdir)
    if steps and not resume:
        raise RunDirError(
            f"--workdir {workdir} already holds checkpoints (latest step {steps[-1]}); "
            "pass --resume to continue it or choose a new --workdir"
        )
    record = config_record(config)
    changes = check_config_change(workdir, record, allow_changes) if resume else {}
    record_config(workdir, record, changes, steps[-1] if steps else None)
    return changes


__all__ = [
    "RunDirError",
    "check_config_change",
    "checkpoint_steps",
    "claim",
    "config_diff",
    "config_record",
    "default_workdir",
    "lock",
    "lock_holder",
    "record_config",
    "set_aside",
    "unlock",
    "writes_no_checkpoint",
]


def main(argv: list[str] | None = None) -> int:
    """``python -m rubric_rl.runs.run_dir --set-aside W``: ``set_aside`` from a shell (the commands
    ``launch/sweep.py --print --force`` writes); exit 1 naming the holder when W is live."""
    import argparse
    import sys

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--set-aside", required=True, metavar="WORKDIR", help="the run to move aside")
    args = p.parse_args(argv)
    try:
        dest = set_aside(args.set_aside)
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if dest:
        print(f"moved {os.path.abspath(args.set_aside)} aside to {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
