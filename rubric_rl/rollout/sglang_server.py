"""Starting, watching and stopping SGLang server processes (the GPU rollout path, also run on CPU).

The server runs in its own Python environment (third_party/sglang_cpu/install.sh builds one for
CPU): SGLang pins its own torch/transformers, which must not meet the trainer's. We only talk to it
over HTTP. On `device="cpu"` the launch adds the flags and environment measured to work
(shared notes sglang-on-cpu.md): torch_native attention, pytorch sampling, no overlap schedule,
`OMP_NUM_THREADS=1` (else throughput swings 40×: the scheduler spins a core),
`SGLANG_USE_CPU_ENGINE=1`, and our adapters (stand-in sgl_kernel, torchvision schema shim) on
PYTHONPATH. On every device the scheduler sleeps when idle (`--sleep-on-idle`, default on — ours;
SGLang's default is off): without it each scheduler busy-polls one core at ~100 % between
requests, which an RL loop's trainer phase, sharing the host, pays for (measured on the test
server: see `sleep_on_idle`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SGLANG_CPU_DIR = REPO_ROOT / "third_party" / "sglang_cpu"


def default_server_python() -> Path:
    """The server venv's python: `$SGLANG_VENV/bin/python`, default `<repo>/.venv-sglang`."""
    venv = os.environ.get("SGLANG_VENV") or str(REPO_ROOT / ".venv-sglang")
    return Path(venv) / "bin" / "python"


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A free port BELOW the ephemeral range: the server binds it only after tens of seconds of
    start-up, and an ephemeral port would meanwhile be handed out to outgoing connections (ours
    included: the health polls) — a collision we saw on a busy machine."""
    lo = _ephemeral_range()[0]
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, lo - 12000), lo)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise SGLangServerError(f"no free port below {lo} on {host}")


@dataclasses.dataclass(frozen=True)
class SGLangServerConfig:
    """How to launch one `python -m sglang.launch_server` process.

    `port=0` picks a free port at each start. `python=None` uses `default_server_python()`.
    `extra_flags` are appended verbatim (e.g. `("--enable-deterministic-inference",)`).
    `sleep_on_idle` (ours, default on; SGLang's is off) makes an idle scheduler block on its
    request sockets instead of spinning: SGLang's `IdleSleeper` polls them with a 1 s timeout and
    wakes as soon as a request arrives, so a request waits no longer; what it saves is the core
    an idle scheduler otherwise holds (a whole one per tensor-parallel rank) while the trainer
    runs between rollout phases.
    """

    model_path: str
    host: str = "127.0.0.1"
    port: int = 0
    device: str = "cpu"
    tp_size: int = 1
    dtype: str = "auto"
    mem_fraction_static: float | None = 0.1
    max_total_tokens: int | None = 8192
    skip_tokenizer_init: bool = True
    weight_version: int = 0
    random_seed: int | None = 0
    sleep_on_idle: bool = True
    extra_flags: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    python: str | None = None
    startup_timeout_s: float = 240.0
    log_path: str | None = None

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"SGLangServerConfig.tp_size must be >= 1, got {self.tp_size}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static <= 1:
            raise ValueError(
                "SGLangServerConfig.mem_fraction_static must be in (0, 1], got "
                f"{self.mem_fraction_static}"
            )
        object.__setattr__(self, "extra_flags", tuple(self.extra_flags))
        object.__setattr__(self, "extra_env", tuple(tuple(kv) for kv in self.extra_env))


class SGLangServerError(RuntimeError):
    """The server failed to start or died; the message carries the tail of its log."""


class SGLangServer:
    """One managed server process: `start()`, `stop()`, `restart()`, `url`, `alive()`.

    The process is its own process group, so stopping it (SIGTERM, then SIGKILL after a grace
    period) also ends the scheduler/detokenizer children SGLang forks.
    """

    def __init__(self, config: SGLangServerConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen | None = None
        self._port: int | None = None
        self._log_file = None
        self.log_path = Path(config.log_path) if config.log_path else None
        self.start_seconds: float | None = None
        self.restarts = 0

    # ---------------------------------------------------------------- launch
    @property
    def python(self) -> Path:
        return Path(self.config.python) if self.config.python else default_server_python()

    @property
    def url(self) -> str:
        if self._port is None:
            raise SGLangServerError("SGLangServer.url: the server has not been started")
        return f"http://{self.config.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self, port: int) -> list[str]:
        c = self.config
        cmd = [str(self.python), "-m", "sglang.launch_server", "--model-path", c.model_path]
        cmd += ["--host", c.host, "--port", str(port), "--device", c.device]
        cmd += ["--tp-size", str(c.tp_size), "--dtype", c.dtype]
        if c.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(c.mem_fraction_static)]
        if c.max_total_tokens is not None:
            cmd += ["--max-total-tokens", str(c.max_total_tokens)]
        if c.skip_tokenizer_init:
            cmd += ["--skip-tokenizer-init"]
        if c.random_seed is not None:
            cmd += ["--random-seed", str(c.random_seed)]
        cmd += ["--weight-version", str(c.weight_version)]
        if c.sleep_on_idle:
            cmd += ["--sleep-on-idle"]
        if c.device == "cpu":
            cmd += ["--attention-backend", "torch_native", "--sampling-backend", "pytorch"]
            cmd += ["--disable-overlap-schedule"]
        cmd += list(c.extra_flags)
        return cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The trainer's venv must not leak into the server's interpreter.
        for key in ("PYTHONHOME", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS"):
            env.pop(key, None)
        if self.config.device == "cpu":
            env["OMP_NUM_THREADS"] = "1"
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            site = str(SGLANG_CPU_DIR / "site")
            env["PYTHONPATH"] = site + (
                os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else ""
            )
        env["PYTHONUNBUFFERED"] = "1"
        env.update(dict(self.config.extra_env))
        return env

    def start(self) -> SGLangServer:
        """Launches the process and blocks until `/health` answers 200 (or raises). With `port=0`
        a start that lost its port to another process is retried on a new port (twice)."""
        if self.alive():
            return self
        for attempt in range(3):
            try:
                return self._start_once()
            except SGLangServerError as exc:
                if self.config.port or attempt == 2 or "address already in use" not in str(exc):
                    raise
                logger.warning("SGLang server lost its port; retrying on another one")
        raise AssertionError("unreachable")

    def _start_once(self) -> SGLangServer:
        if not self.python.exists():
            raise SGLangServerError(
                f"SGLang server python not found at {self.python}: run "
                "third_party/sglang_cpu/install.sh (or set SGLANG_VENV / SGLangServerConfig.python)"
            )
        if not Path(self.config.model_path).exists():
            raise SGLangServerError(
                f"SGLangServerConfig.model_path {self.config.model_path!r} does not exist"
            )
        port = self.config.port or free_port(self.config.host)
        if self.log_path is None:
            import tempfile

            fd, name = tempfile.mkstemp(prefix="sglang_server_", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 — lives as long as the process
        self._log_file.write(f"\n=== start {time.strftime('%H:%M:%S')} port {port} ===\n".encode())
        self._log_file.flush()
        cmd = self.command(port)
        logger.info("starting SGLang server: %s (log %s)", " ".join(cmd), self.log_path)
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.environment(),
            start_new_session=True,  # its own process group: stop() reaches SGLang's children
        )
        self._port = port
        try:
            self._wait_healthy(self.config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        logger.info("SGLang server healthy at %s after %.1f s", self.url, self.start_seconds)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise SGLangServerError(
                    f"SGLang server (model {self.config.model_path!r}) exited with code "
                    f"{self._proc.returncode} during start-up; log {self.log_path} ends:\n"
                    + self.log_tail()
                )
            if self.health(timeout_s=2.0):
                return
            tail = self.log_tail(15)
            if "error while attempting to bind" in tail:  # uvicorn may hang instead of exiting
                raise SGLangServerError(
                    f"SGLang server could not bind {self.url} (address already in use); log "
                    f"{self.log_path} ends:\n{tail}"
                )
            time.sleep(0.5)
        raise SGLangServerError(
            f"SGLang server at {self.url} not healthy after {timeout_s:.0f} s; log {self.log_path} "
            "ends:\n" + self.log_tail()
        )

    # ---------------------------------------------------------------- status
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def health(self, timeout_s: float = 5.0) -> bool:
        if self._port is None:
            return False
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout_s) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, errors="replace") as f:
            return "".join(collections.deque(f, maxlen=lines))

    # ---------------------------------------------------------------- stop
    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to the server's whole process group (tests use this to simulate a crash)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s`; idempotent."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                self.kill(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self.kill(signal.SIGKILL)
                    proc.wait(timeout=grace_s)
            # Children may outlive the leader (e.g. a scheduler still tearing down).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._proc = None

    def restart(
        self, model_path: str | None = None, weight_version: int | None = None
    ) -> SGLangServer:
        """Stops and starts again (on a fresh free port when `port=0`), optionally from newer
        weights: a crashed server must come back serving the last synced version, not the
        checkpoint it was first launched with."""
        self.stop()
        changes: dict[str, object] = {}
        if model_path is not None:
            changes["model_path"] = str(model_path)
        if weight_version is not None:
            changes["weight_version"] = int(weight_version)
        if changes:
            self.config = dataclasses.replace(self.config, **changes)
        self.restarts += 1
        return self.start()

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            if self.alive():
                self.stop(grace_s=2.0)
        except Exception:  # interpreter shutdown: best effort
            print("SGLangServer: could not stop the server at exit", file=sys.stderr)
