"""Weight sync by disk: versioned Hugging Face safetensors directories + SGLang's
`/update_weights_from_disk` (DESIGN.md §8: the first transport for external engines).

    sync = WeightSync(root="/shared/ckpts/run1", keep_last=2)
    metrics = sync.sync(engine, model, version=step)  # export, pause, flush, update, continue

`<root>/v{version}/` holds one exported version; it is written to a temporary directory and
renamed into place, so a server never reads a half-written checkpoint. Only the last `keep_last`
versions stay on disk (a restarted server reloads the newest one).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import httpx

logger = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"^v(\d+)$")


class WeightSyncError(RuntimeError):
    """A server refused or failed a weight update; the message names the server and endpoint."""


def export_checkpoint(model_or_dir: Any, path: str | os.PathLike, dtype: str = "") -> Path:
    """Writes `model_or_dir` as a HF safetensors checkpoint at `path` (atomically).

    Accepts a rubric_rl `Qwen3ForCausalLM` (exported by `rubric_rl.models.save_pretrained`, its
    tensors cast to `dtype` unless ""), any object with a `save_pretrained(path)` method (a
    `transformers` model), or a ready checkpoint directory (copied).

    Several processes (jax.distributed): every process calls this (the parameters' gathers are
    collective), process 0 alone writes, and all leave together (`multihost.barrier`), so no
    process reads `path` before it is complete. On several hosts `path` must be on a shared
    filesystem for servers on other hosts to load it.
    """
    import jax

    if jax.process_count() > 1:
        from rubric_rl.rollout import multihost

        path = Path(path)
        if jax.process_index() == 0:
            _export(model_or_dir, path, dtype)
        elif not isinstance(model_or_dir, str | os.PathLike):
            from rubric_rl.models import save_pretrained

            save_pretrained(model_or_dir, str(path) + ".tmp", dtype=dtype or None)  # gathers only
        multihost.barrier(f"export {path}")
        return path
    return _export(model_or_dir, Path(path), dtype)


def _export(model_or_dir: Any, path: Path, dtype: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(model_or_dir, str | os.PathLike):
        src = Path(model_or_dir)
        if not (src / "config.json").is_file():
            raise FileNotFoundError(
                f"export_checkpoint: {src} has no config.json (not a HF checkpoint)"
            )
        shutil.copytree(src, tmp)
    elif hasattr(model_or_dir, "save_pretrained"):
        model_or_dir.save_pretrained(str(tmp))
    else:
        from rubric_rl.models import save_pretrained

        save_pretrained(model_or_dir, str(tmp), dtype=dtype or None)
    if not (tmp / "config.json").is_file():
        raise RuntimeError(f"export_checkpoint: writing {tmp} produced no config.json")
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def _post(client: httpx.Client, url: str, endpoint: str, payload: dict[str, Any]) -> Any:
    try:
        resp = client.post(url + endpoint, json=payload)
    except httpx.HTTPError as exc:
        raise WeightSyncError(f"{url}{endpoint}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise WeightSyncError(f"{url}{endpoint} answered {resp.status_code}: {resp.text[:500]}")
    try:
        return resp.json()
    except ValueError:
        return resp.text


def probe_weight_version(client: httpx.Client, url: str) -> str:
    """The weight version a fresh one-token `/generate` reports (0.5.23 has no
    `/get_weight_version`; the version rides on every response)."""
    out = _post(
        client,
        url,
        "/generate",
        {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}},
    )
    item = out[0] if isinstance(out, list) else out
    return str(item["meta_info"]["weight_version"])


def update_servers_from_disk(
    urls: list[str],
    model_path: str,
    version: int,
    *,
    pause_mode: str = "retract",
    timeout_s: float = 600.0,
) -> dict[str, float]:
    """For each server: pause → flush_cache → update_weights_from_disk → continue, then check
    that the next `/generate` reports `version`. Returns timing metrics (seconds).

    `pause_mode="retract"` keeps in-flight requests: they go back to the queue and resume on the
    new weights after `continue` (each token's log-prob is still from the weights that sampled
    it). Generation is continued even when the update fails, and the error is raised.
    """
    if not Path(model_path, "config.json").is_file():
        raise FileNotFoundError(f"update_servers_from_disk: {model_path} has no config.json")
    totals = {"pause_s": 0.0, "flush_s": 0.0, "update_s": 0.0, "continue_s": 0.0, "verify_s": 0.0}
    t_all = time.monotonic()
    with httpx.Client(timeout=timeout_s) as client:
        for url in urls:
            url = url.rstrip("/")
            t = time.monotonic()
            _post(client, url, "/pause_generation", {"mode": pause_mode})
            totals["pause_s"] += time.monotonic() - t
            try:
                t = time.monotonic()
                _post(client, url, "/flush_cache", {})
                totals["flush_s"] += time.monotonic() - t
                t = time.monotonic()
                _post(
                    client,
                    url,
                    "/update_weights_from_disk",
                    {"model_path": str(model_path), "weight_version": str(int(version))},
                )
                totals["update_s"] += time.monotonic() - t
            finally:
                t = time.monotonic()
                _post(client, url, "/continue_generation", {})
                totals["continue_s"] += time.monotonic() - t
            t = time.monotonic()
            seen = probe_weight_version(client, url)
            totals["verify_s"] += time.monotonic() - t
            if seen != str(int(version)):
                raise WeightSyncError(
                    f"{url}: after update_weights_from_disk({model_path}, {version}) /generate "
                    f"reports weight_version {seen!r}"
                )
    totals["total_s"] = time.monotonic() - t_all
    return totals


class WeightSync:
    """Exports versions under `root` and pushes them to an engine; keeps the last `keep_last`."""

    def __init__(self, root: str | os.PathLike, keep_last: int = 2, dtype: str = "") -> None:
        if keep_last < 1:
            raise ValueError(f"WeightSync.keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.dtype = dtype  # the exported tensors' dtype ("" = the parameters')
        self.history: list[dict[str, float]] = []

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{int(version)}"

    def versions(self) -> list[int]:
        """Versions on disk, ascending."""
        if not self.root.is_dir():
            return []
        found = (_VERSION_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def export(self, model_or_dir: Any, version: int) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return export_checkpoint(model_or_dir, self.version_dir(version), self.dtype)

    def cleanup(self) -> list[int]:
        """Deletes all but the newest `keep_last` versions; returns the deleted ones."""
        old = self.versions()[: -self.keep_last]
        for v in old:
            shutil.rmtree(self.version_dir(v), ignore_errors=True)
        return old

    def sync(self, engine: Any, model_or_dir: Any, version: int) -> dict[str, float]:
        """Exports `model_or_dir` as `version` and makes `engine` serve it
        (`engine.update_weights(path, version)`). Returns timing metrics."""
        if version < 0:
            raise ValueError(f"WeightSync.sync: version must be >= 0, got {version}")
        import jax

        writer = jax.process_index() == 0  # several processes: one writes, the rest wait
        # Versions above this one come from an abandoned timeline (a run resumed from an older
        # checkpoint): drop them so cleanup and restarts never pick them up.
        for stale in (v for v in self.versions() if v > version and writer):
            logger.warning("WeightSync: deleting stale export v%d (> v%d)", stale, version)
            shutil.rmtree(self.version_dir(stale), ignore_errors=True)
        t = time.monotonic()
        path = self.export(model_or_dir, version)
        export_s = time.monotonic() - t
        metrics = dict(engine.update_weights(str(path), version) or {})
        metrics["export_s"] = export_s
        metrics["deleted_versions"] = float(len(self.cleanup()) if writer else 0)
        self.history.append(metrics)
        return metrics
