"""Where the SGLang servers and the trainer run, from ``config.rollout.sglang``.

A node's GPUs are split between jax (the trainer) and the SGLang server the run starts:
``rollout.sglang.gpus`` (e.g. "6,7") are the server's, the rest the trainer's. Both sides are
told before either touches a GPU: the launcher passes the trainer's to
``jax.distributed.initialize(local_device_ids=...)`` / ``jax_cuda_visible_devices``, and the
server process gets ``CUDA_VISIBLE_DEVICES``. Indices count the GPUs this process can see: when
the launch environment already restricts them (``CUDA_VISIBLE_DEVICES=4,5,6,7``, as SLURM sets
it), index 0 is physical GPU 4, and the server's variable is written in physical ids.

The server uses all of its GPUs: ``tp_size`` of them per model replica (``--tp-size``), and
``len(gpus) / tp_size`` replicas (``--dp-size``, SGLang's own data parallelism) — ours; SGLang
would otherwise use only the first ``tp_size``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rubric_rl.rollout.sglang_server import SGLangServerConfig

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


def split_list(value: Any, field: str) -> tuple[str, ...]:
    """A comma-separated config string (or a sequence) as a tuple of non-empty items."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(v).strip() for v in value]
    else:
        raise ValueError(f"{field}: expected a comma-separated string, got {value!r}")
    return tuple(v for v in items if v)


def parse_gpus(value: Any, field: str = "rollout.sglang.gpus") -> tuple[int, ...]:
    """GPU indices from "6,7" ("" = none); an error names ``field``."""
    out = []
    for item in split_list(value, field):
        try:
            idx = int(item)
        except ValueError:
            raise ValueError(f"{field}: {item!r} is not a GPU index (e.g. gpus='6,7')") from None
        if idx < 0:
            raise ValueError(f"{field}: GPU index {idx} is negative")
        out.append(idx)
    if len(set(out)) != len(out):
        raise ValueError(f"{field}: repeated GPU index in {value!r}")
    return tuple(out)


def visible_gpus(environ: Mapping[str, str], proc_dir: Path = NVIDIA_PROC) -> list[str] | None:
    """The physical ids this process may use, without initialising CUDA: the entries of
    ``CUDA_VISIBLE_DEVICES`` when set, else one per GPU the NVIDIA driver lists in ``proc_dir``;
    None when neither says (no driver: a CPU machine)."""
    env = environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [v.strip() for v in env.split(",") if v.strip()]
    if proc_dir.is_dir():
        n = len([p for p in proc_dir.iterdir() if p.is_dir()])
        return [str(i) for i in range(n)] if n else None
    return None


def trainer_gpus(config: Any, environ: Mapping[str, str], proc_dir: Path = NVIDIA_PROC):
    """The local GPU indices jax gets (every visible one but the servers'), or None when no GPU
    of this node is the servers' (``rollout.sglang.gpus`` empty): then jax's default applies.
    ``gpus`` are reserved on every node of the run, for the server the run starts (no ``url``:
    on process 0's node) or for servers started beside it (``url`` lists them), so every
    process keeps the same number of devices."""
    s = config.rollout.sglang
    if config.rollout.engine != "sglang" or s.get("device") == "cpu":
        return None
    server = parse_gpus(s.gpus)
    if not server:
        return None
    visible = visible_gpus(environ, proc_dir)
    if visible is None:
        raise ValueError(
            f"rollout.sglang.gpus={s.gpus!r}: this machine shows no GPUs (no CUDA_VISIBLE_DEVICES, "
            f"no {proc_dir}); leave it empty on a CPU machine"
        )
    if max(server) >= len(visible):
        raise ValueError(
            f"rollout.sglang.gpus={s.gpus!r}: index {max(server)} but this process sees "
            f"{len(visible)} GPUs (indices count the visible GPUs: {','.join(visible)})"
        )
    rest = [i for i in range(len(visible)) if i not in server]
    if not rest:
        raise ValueError(
            f"rollout.sglang.gpus={s.gpus!r} takes every visible GPU; the trainer needs one"
        )
    return rest


def server_cuda_visible(gpus: tuple[int, ...], environ: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the server: ``gpus`` (indices among this process's visible
    GPUs) in physical ids."""
    env = environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not env.strip():
        return ",".join(str(g) for g in gpus)
    physical = [v.strip() for v in env.split(",") if v.strip()]
    if max(gpus) >= len(physical):
        raise ValueError(
            f"rollout.sglang.gpus: index {max(gpus)} but CUDA_VISIBLE_DEVICES={env!r} lists "
            f"{len(physical)} GPUs"
        )
    return ",".join(physical[g] for g in gpus)


def server_flags(s: Any) -> tuple[str, ...]:
    """The extra command-line flags of ``rollout.sglang``: ``--dp-size`` (all of ``gpus`` used),
    ``--enable-deterministic-inference`` (``deterministic_inference``: per-sample seeds are
    honoured, so a rerun samples the same tokens), then ``extra_flags`` (shell-split)."""
    gpus = parse_gpus(s.gpus)
    tp = int(s.tp_size)
    flags: list[str] = []
    if gpus:
        if len(gpus) % tp:
            raise ValueError(
                f"rollout.sglang.gpus={s.gpus!r}: {len(gpus)} GPUs do not split into replicas of "
                f"tp_size={tp}"
            )
        if len(gpus) // tp > 1:
            flags += ["--dp-size", str(len(gpus) // tp)]
    if bool(s.deterministic_inference):
        flags.append("--enable-deterministic-inference")
    extra = s.extra_flags
    try:
        flags += shlex.split(extra) if isinstance(extra, str) else [str(f) for f in extra]
    except ValueError as exc:
        raise ValueError(f"rollout.sglang.extra_flags={extra!r}: {exc}") from None
    return tuple(flags)


def server_config(
    config: Any,
    model_path: str,
    *,
    log_path: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> SGLangServerConfig:
    """The ``SGLangServerConfig`` of the server a run starts, from ``config.rollout.sglang``."""
    environ = os.environ if environ is None else environ
    s = config.rollout.sglang
    tp = int(s.tp_size)
    if tp < 1:
        raise ValueError(f"rollout.sglang.tp_size must be >= 1, got {tp}")
    fraction = float(s.mem_fraction)
    if not 0 < fraction <= 1:
        raise ValueError(f"rollout.sglang.mem_fraction must be in (0, 1], got {fraction}")
    gpus = parse_gpus(s.gpus)
    env: tuple[tuple[str, str], ...] = ()
    if gpus:
        env = (("CUDA_VISIBLE_DEVICES", server_cuda_visible(gpus, environ)),)
    return SGLangServerConfig(
        model_path=model_path,
        host=str(s.host),
        port=int(s.port),
        device=str(s.device),
        tp_size=tp,
        dtype=str(s.dtype),
        mem_fraction_static=fraction,
        max_total_tokens=int(s.max_total_tokens) or None,
        sleep_on_idle=bool(s.sleep_on_idle),
        extra_flags=server_flags(s),
        extra_env=env,
        log_path=log_path,
    )


def check_shared_gpus(config: Any, environ: Mapping[str, str], proc_dir: Path = NVIDIA_PROC):
    """Refuses a server started on the trainer's own GPUs unless both memory shares are chosen:
    jax takes 75 % of every GPU it sees at start (``XLA_PYTHON_CLIENT_MEM_FRACTION``), and the
    server then asks for ``mem_fraction`` of the same GPU — together more than the GPU holds.
    Ours: an error naming both settings, not an out-of-memory crash minutes into the run."""
    s = config.rollout.sglang
    if config.rollout.engine != "sglang" or str(s.url) or s.get("device") == "cpu":
        return
    if parse_gpus(s.gpus) or visible_gpus(environ, proc_dir) is None:
        return
    if environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() == "false":
        jax_share = None  # jax allocates as it goes: the user chose to share
    else:
        raw = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
        if raw is None:
            raise ValueError(
                "rollout.sglang.gpus is empty: the SGLang server would start on the trainer's "
                "GPUs, where jax already holds 75 % of each. Give the server GPUs of its own "
                "(e.g. --config.rollout.sglang.gpus=4,5,6,7), point the run at external servers "
                "(rollout.sglang.url), or share them explicitly: XLA_PYTHON_CLIENT_MEM_FRACTION "
                "plus rollout.sglang.mem_fraction below 0.95 together (docs/gpu.md)"
            )
        jax_share = float(raw)
    if jax_share is not None and jax_share + float(s.mem_fraction) > 0.95:
        raise ValueError(
            f"rollout.sglang.mem_fraction={s.mem_fraction} + XLA_PYTHON_CLIENT_MEM_FRACTION="
            f"{jax_share} exceed 0.95 of GPUs that jax and the SGLang server share"
        )


def local_device_ids(
    config: Any, environ: Mapping[str, str], proc_dir: Path = NVIDIA_PROC
) -> list[int] | None:
    """The GPUs jax uses in this process: the trainer's share when the run starts a server on
    GPUs of its own (``trainer_gpus``); every visible GPU under SLURM with one task per node
    (launch/slurm.sh: jax's SLURM detection would otherwise give each process the single GPU
    numbered by its local task id); else None (jax's default)."""
    trainer = trainer_gpus(config, environ, proc_dir)
    if trainer is not None:
        return trainer
    check_shared_gpus(config, environ, proc_dir)
    slurm_multi = int(environ.get("SLURM_NTASKS", "1") or 1) > 1
    # SLURM_NTASKS_PER_NODE is set with --ntasks-per-node; SLURM_TASKS_PER_NODE in every step
    # ("1(x2)": one task on each of 2 nodes).
    one_per_node = environ.get("SLURM_NTASKS_PER_NODE") == "1" or bool(
        re.fullmatch(r"1(\(x\d+\))?", environ.get("SLURM_TASKS_PER_NODE", ""))
    )
    if slurm_multi and one_per_node:
        visible = visible_gpus(environ, proc_dir)
        return list(range(len(visible))) if visible else None
    return None
