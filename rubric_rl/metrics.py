"""Run-directory logging (CONVENTIONS.md "Run directory"): metrics, rollouts, controller events.

- ``metrics.jsonl``: one JSON object per logged step, always (the colabs read it).
- TensorBoard event files under ``<workdir>/tb`` when ``tensorboardX`` is installed; on resume
  the steps after the restored one are purged (TensorBoard's ``purge_step``), not shown twice.
- Weights & Biases when installed and enabled in the config.
- ``rollouts/step_XXXXXX.jsonl.gz``: sampled rollouts with their verdicts.
- ``controllers/<name>.jsonl``: controller event logs (pool lifecycle, labels, selections).

Multi-host: every writer takes ``primary``; only process 0 passes True, the others compute the
same rows but write nothing (one copy of each file, no two hosts appending to one file).

Secrets never reach these files: keys whose name looks like a credential are dropped from
anything written (``scrub``), and configs only ever hold the NAME of an env var with a key.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

_SECRET_KEY = re.compile(r"(api[_-]?key|secret|token|password|authorization)$", re.IGNORECASE)
# Keys that merely mention tokens as units, not credentials.
_NOT_SECRET = re.compile(r"(tokens?/|num_tokens|max_tokens|_env$|tokenizer)", re.IGNORECASE)


def _is_secret(key: str) -> bool:
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET.search(key)


def scrub(obj: Any) -> Any:
    """A copy of ``obj`` with credential-like keys removed (recursively)."""
    if isinstance(obj, Mapping):
        return {k: scrub(v) for k, v in obj.items() if not _is_secret(str(k))}
    if isinstance(obj, list | tuple):
        return [scrub(v) for v in obj]
    return obj


def to_jsonable(x: Any) -> Any:
    """numpy / jax scalars and arrays -> Python; non-finite floats stay floats (JSON NaN)."""
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_jsonable(v) for v in x]
    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, float):
        return x
    arr = np.asarray(x)
    if arr.ndim == 0:
        v = arr.item()
        return float(v) if isinstance(v, float) else v
    return arr.tolist()


def _import_summary_writer():
    """tensorboardX's ``SummaryWriter``, or None when tensorboardX is not installed.

    tensorboardX imports torch, when it is installed, only to accept torch tensors as values
    (1.3 s of every launch's start-up); we write Python floats. Unless torch is already
    imported, it is hidden for the duration of this import (a ``None`` entry in `sys.modules`
    makes ``import torch`` raise ImportError, the case tensorboardX handles), then restored."""
    import sys

    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    finally:
        if hide and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
    """``write(step, metrics)`` appends to metrics.jsonl (flushed) and mirrors scalars to
    TensorBoard / W&B. On resume, ``truncate_after(step)`` drops rows logged after the restored
    checkpoint so that the file equals the uninterrupted run's."""

    def __init__(
        self,
        workdir: str,
        *,
        tensorboard: bool = True,
        wandb_config: Mapping[str, Any] | None = None,
        primary: bool = True,
    ):
        self.workdir = workdir
        self.primary = primary
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._file = None
        self._tb = None  # opened at the first write: after truncate_after has set the purge step
        self._tb_writer = None
        self._tb_purge_step: int | None = None
        self._wandb = None
        if not primary:
            return
        os.makedirs(workdir, exist_ok=True)
        self._file = open(self.path, "a")
        if tensorboard:
            self._tb_writer = _import_summary_writer()
        if wandb_config is not None and wandb_config.get("enabled"):
            try:
                import wandb
            except ImportError:
                wandb = None
            if wandb is not None:
                self._wandb = wandb.init(
                    project=wandb_config.get("project", "rubric_rl"),
                    dir=workdir,
                    config=scrub(dict(wandb_config.get("config", {}))),
                    resume="allow",
                )

    @property
    def tensorboard_enabled(self) -> bool:
        return self._tb_writer is not None

    def _tensorboard(self):
        if self._tb is None and self._tb_writer is not None:
            purge = {} if self._tb_purge_step is None else {"purge_step": self._tb_purge_step}
            # tensorboardX names files by the second and opens them "wb": the pid keeps a file of
            # an earlier writer in the same second from being overwritten.
            self._tb = self._tb_writer(
                os.path.join(self.workdir, "tb"), filename_suffix=f".{os.getpid()}", **purge
            )
        return self._tb

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        row = {"step": int(step)}
        row.update(scrub(to_jsonable(dict(metrics))))
        if self._file is None:  # not the primary process
            return row
        self._file.write(json.dumps(row, sort_keys=True) + "\n")
        self._file.flush()
        scalars = {
            k: v
            for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
        }
        if (tb := self._tensorboard()) is not None:
            for k, v in scalars.items():
                tb.add_scalar(k, v, global_step=int(step))
            tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=int(step))
        return row

    def truncate_after(self, step: int) -> None:
        """Keep only rows with ``step <= step`` (resume after a kill: later rows are replayed);
        TensorBoard's events of later steps are purged by the next event file it writes."""
        if self._file is None:
            return
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self._tb_purge_step = int(step) + 1
        self._file.close()
        rows = read_metrics(self.path) if os.path.exists(self.path) else []
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            for r in rows:
                if r["step"] <= step:
                    f.write(json.dumps(r, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; a torn last line (killed mid-write) is ignored."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


class RolloutLogger:
    """Writes sampled rollouts with verdicts to ``<workdir>/rollouts/step_XXXXXX.jsonl.gz``."""

    def __init__(self, workdir: str, *, primary: bool = True):
        self.dir = os.path.join(workdir, "rollouts")
        self.primary = primary
        if primary:
            os.makedirs(self.dir, exist_ok=True)

    def path(self, step: int) -> str:
        return os.path.join(self.dir, f"step_{int(step):06d}.jsonl.gz")

    def write(self, step: int, records: Iterable[Mapping[str, Any]]) -> str:
        path = self.path(step)
        if not self.primary:
            return path
        tmp = path + ".tmp"
        with gzip.open(tmp, "wt") as f:
            for r in records:
                f.write(json.dumps(scrub(to_jsonable(dict(r))), sort_keys=True) + "\n")
        os.replace(tmp, path)  # readers never see a half-written file
        return path


def read_rollouts(path: str) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


class ControllerLog:
    """Event log of one controller: ``<workdir>/controllers/<name>.jsonl``."""

    def __init__(self, workdir: str, name: str, *, primary: bool = True):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"controller log name {name!r} must be [A-Za-z0-9_.-]+")
        d = os.path.join(workdir, "controllers")
        self.primary = primary
        if primary:
            os.makedirs(d, exist_ok=True)
        self.path = os.path.join(d, f"{name}.jsonl")

    def log(self, step: int, event: str, **fields: Any) -> None:
        row = {"step": int(step), "event": event}
        row.update(scrub(to_jsonable(fields)))
        if not self.primary:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")

    def truncate_after(self, step: int) -> None:
        if not self.primary or not os.path.exists(self.path):
            return
        rows = [r for r in read_metrics(self.path) if r["step"] <= step]
        with open(self.path + ".tmp", "w") as f:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        os.replace(self.path + ".tmp", self.path)


# Headline keys of the one-line summary and the progress bar, in display order.
HEADLINE = (
    ("reward/mean", "r", "{:.3f}"),
    ("reward/zero_variance_frac", "zv", "{:.2f}"),
    ("loss", "loss", "{:.4f}"),
    ("entropy", "H", "{:.3f}"),
    ("eval/heldout/score", "heldout", "{:.1f}"),
    ("eval/ood/score", "ood", "{:.1f}"),
    ("perf/tokens_per_s", "tok/s", "{:.0f}"),
    ("time/step", "s", "{:.2f}"),
)


def headline(metrics: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, short, fmt in HEADLINE:
        v = metrics.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[short] = fmt.format(v) if math.isfinite(v) else str(v)
    return out


def summary_line(step: int, metrics: Mapping[str, Any]) -> str:
    """``step 12 | r 0.612 | zv 0.25 | loss 0.0123 | ...`` — the per-step log line."""
    parts = [f"step {int(step)}"] + [f"{k} {v}" for k, v in headline(metrics).items()]
    return " | ".join(parts)


def progress_bar(total: int, initial: int = 0, enabled: bool = True, file=None):
    """A tqdm bar over training steps (``set_postfix(headline(metrics))`` per step); wrap the
    loop in ``logs_above(bar)`` so that log lines do not break it."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        disable=not enabled,
        desc="train",
        dynamic_ncols=True,
        file=file,
    )


class _AboveBar(logging.Handler):
    """Writes each record through ``tqdm.write``: the bar is cleared, the line printed, the bar
    redrawn below it."""

    def __init__(self, bar):
        super().__init__()
        self.bar = bar

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.bar.write(self.format(record), file=self.bar.fp)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def logs_above(bar):
    """While ``bar`` is shown, the root logger's absl handler (every ``absl.logging`` line) is
    replaced by one that prints above the bar, with the same format, level and filters."""
    if getattr(bar, "disable", True):
        yield
        return
    from absl import logging as absl_logging

    root = logging.getLogger()
    absl_handler = absl_logging.get_absl_handler()
    handler = _AboveBar(bar)
    handler.setFormatter(absl_logging.PythonFormatter())
    handler.setLevel(absl_handler.level)
    for f in absl_handler.filters:
        handler.addFilter(f)
    swapped = absl_handler in root.handlers
    if swapped:
        root.removeHandler(absl_handler)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        if swapped:
            root.addHandler(absl_handler)
