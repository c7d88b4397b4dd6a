"""The peer workload side by side: rubric_rl vs Tunix vs TRL on one GRPO step; prints ONE JSON line.

    python benchmarks/peer_step.py [--rounds 3] [--steps 12] [--sides ours,tunix,trl]

The workload is shared/notes/peers.md's (3.3M-parameter Qwen3, 8 prompts x 4 completions of
exactly 64 tokens per step, AdamW, float32; ``benchmarks/peers/workload.py``). Each round runs every
side once, in the order of ``--sides`` (ours, Tunix, TRL, ours, ...), each in its own subprocess
with its own Python:

  ours   examples/peer_workload.py   the library's public API, run as a user would (this Python,
                                     PYTHONPATH = the repository)
  tunix  benchmarks/peers/tunix_side.py   <venvs>/tunix/bin/python  (google-tunix 0.1.7, jax 0.10.2)
  trl    benchmarks/peers/trl_side.py     <venvs>/trl/bin/python    (trl 1.16, torch 2.13 CPU)

Every JAX side sees ``--host_devices`` CPU devices (XLA's host-device count, default 1), or the
count its ``--sides`` entry names (``ours@2,tunix@1,tunix@2,trl``): each side may run in several
configurations in one run, and the ratios and goals compare each side at its best (lowest median
step), the configurations named in the line. Our side splits its batch over the devices
(data-parallel: one thread per device, which the decode's small dots need to use both cores);
Tunix's side puts them on its fsdp axis (parameters and batch sharded); torch ignores the flag.

``--venvs`` defaults to ``$PEER_VENVS`` or ``peer-venvs`` beside the repository; the install lines
are in ``benchmarks/peers/README.md``. A side whose Python (or script) is missing is reported as
skipped, not an error; a side that fails is reported with its exit code and the tail of its stderr.

Each side runs ``--warmup`` + ``--steps`` steps and prints the medians of its timed steps (whole
step = one step's parameters ready to the next's; generation; the rest). This script reports, per
side, the median over rounds of those per-run medians and every round's figures; for ours against
each peer the ratio of those medians (step, generation, train), the step ratio of each round, and
the goals: step <= 0.8x Tunix's and <= 0.5x TRL's. tcmalloc is preloaded for
every side alike when found (``rubric_rl.util.tcmalloc``), unless
``--tcmalloc=off``. Absolute times on a shared CPU mean little; the ratios from alternating rounds
are the figure.

The roofline (``--roofline=on``, the default): after each round ``benchmarks/peers/matmul_peak.py``
times this machine's float32 matmul rate with ``--python`` (one JAX device, every core); the
line's ``roofline`` holds the workload's model FLOPs (``workload.step_flops``: the least work any
side must do), ``bound_s`` = those FLOPs at the best rate measured, each side's ``peak_fraction``
(bound ÷ its median; step, generation and train) and ``peak_fraction_needed`` per goal (bound ÷
the goal's step time against the peer's best configuration): a goal needing more than the
fraction any side reaches is a statement about the machine as much as about the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "benchmarks", "peers")
FIGURES = ("step_s_median", "gen_s_median", "train_s_median")
# The goals: our whole step at most this fraction of the peer's.
GOALS = {"tunix": 0.8, "trl": 0.5}
PARAMS, NEW_TOKENS = 3_279_616, 64  # workload.PARAMS / NEW_TOKENS (checked by the test)


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the comparison: which Python runs which script, with which extra environment."""

    name: str
    python: str
    script: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    devices: int | None = None  # CPU devices JAX sees (XLA's host-device count); None: as given

    @property
    def base(self) -> str:
        """The side without its device count: "tunix" for "tunix@2"."""
        return base_name(self.name)


def base_name(name: str) -> str:
    """A side's name without its device count: "tunix" for "tunix@2" and for "tunix"."""
    return name.split("@")[0]


def default_sides(venvs: str, python: str = sys.executable) -> dict[str, Side]:
    """ours (``python``, PYTHONPATH = the repository); tunix and trl (their venvs in ``venvs``)."""
    return {
        "ours": Side(
            "ours", python, os.path.join(ROOT, "examples", "peer_workload.py"), {"PYTHONPATH": ROOT}
        ),
        "tunix": Side(
            "tunix",
            os.path.join(venvs, "tunix", "bin", "python"),
            os.path.join(PEERS, "tunix_side.py"),
        ),
        "trl": Side(
            "trl", os.path.join(venvs, "trl", "bin", "python"), os.path.join(PEERS, "trl_side.py")
        ),
    }


def missing(side: Side) -> str | None:
    """Why ``side`` cannot run here (its Python or its script is missing), or None."""
    if not (os.path.isfile(side.python) and os.access(side.python, os.X_OK)):
        return f"no Python at {side.python}"
    if not os.path.isfile(side.script):
        return f"no script at {side.script}"
    return None


def last_json_line(stdout: str, *keys: str) -> dict | None:
    """The last line of ``stdout`` that is a JSON object with ``keys`` (default: the step
    figures), or None."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and all(k in row for k in keys or FIGURES):
            return row
    return None


def run_side(
    side: Side, *, steps: int, warmup: int, workdir: str, env: Mapping[str, str], timeout_s: float
) -> dict:
    """One run of ``side``: its JSON line plus ``status`` "ok", or ``status`` "failed" with why."""
    os.makedirs(workdir, exist_ok=True)
    cmd = [
        side.python,
        side.script,
        f"--steps={steps}",
        f"--warmup={warmup}",
        f"--workdir={workdir}",
    ]
    env = {**env, **side.env}
    if side.devices is not None:
        env = with_host_devices(env, side.devices)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return dict(
            status="failed",
            error=f"{side.name}: timed out after {timeout_s:.0f} s: {' '.join(cmd)}",
        )
    wall_s = time.perf_counter() - start
    row = last_json_line(proc.stdout) if proc.returncode == 0 else None
    if row is None:
        tail = (proc.stderr or proc.stdout)[-2000:]
        why = (
            f"exit code {proc.returncode}"
            if proc.returncode
            else "no JSON line with " + ", ".join(FIGURES)
        )
        return dict(status="failed", error=f"{side.name}: {why}: {' '.join(cmd)}\n{tail}")
    return dict(row, status="ok", wall_s=wall_s, given_devices=side.devices)


def workload_checks(row: Mapping, tokenizer_digest: str | None = None) -> dict:
    """Did the run do the workload: exactly 64 new tokens per completion, rewards in [0, 1],
    3,279,616 parameters, weights that moved, the tokenizer ``tokenizer_digest`` names, on the
    ``given_devices`` CPU devices its environment set (a side that does not report a field is not
    judged on it)."""
    checks = {}
    if row.get("devices") is not None and row.get("given_devices") is not None:
        checks["devices"] = row["devices"] == row["given_devices"]
    if "completion_tokens_mean" in row:
        lengths = [
            row.get(k, row["completion_tokens_mean"])
            for k in ("completion_tokens_min", "completion_tokens_max")
        ]
        checks["tokens_64"] = row["completion_tokens_mean"] == NEW_TOKENS and set(lengths) == {
            NEW_TOKENS
        }
    if "reward_mean" in row:
        low, high = (row.get(k, row["reward_mean"]) for k in ("reward_min", "reward_max"))
        checks["reward_in_0_1"] = 0.0 <= low <= high <= 1.0
    if "params" in row:
        checks["params"] = row["params"] == PARAMS
    if "max_param_change" in row:  # the optimizer stepped (AdamW moves a weight ~lr per step)
        checks["params_updated"] = row["max_param_change"] > 0
    if "tokenizer_digest" in row and tokenizer_digest is not None:
        checks["tokenizer"] = row["tokenizer_digest"] == tokenizer_digest
    return checks


def aggregate(
    runs: Mapping[str, Sequence[dict]],
    skipped: Mapping[str, str],
    tokenizer_digest: str | None = None,
) -> dict:
    """The JSON line: per side the median over its ok rounds of each figure and every round's
    figures; for ours against each peer the ratios of those medians, the step ratio per round
    (rounds where both ran) and the goal booleans (None when either side has no figures).

    A side may run in several configurations (``tunix@1``, ``tunix@2``: its CPU device counts);
    the ratios and goals compare each side at its best — the configuration with the lowest
    median step of ours against the peer's (``sides`` names them) — and ``step_by_side`` gives
    ours' best over every configuration of the peer."""
    out: dict = {"sides": {}}
    for name, reason in skipped.items():
        out["sides"][name] = dict(status="skipped", reason=reason)
    for name, rows in runs.items():
        ok = [r for r in rows if r.get("status") == "ok"]
        side: dict = dict(status="ok" if ok else "failed", rounds_ok=len(ok), rounds=len(rows))
        for f in FIGURES:
            side[f] = statistics.median(r[f] for r in ok) if ok else None
            side[f.replace("_median", "_per_round")] = [r.get(f) for r in rows]
        side["errors"] = [r["error"] for r in rows if r.get("status") != "ok"]
        checks: dict[str, bool] = {}
        for r in ok:
            for k, v in workload_checks(r, tokenizer_digest).items():
                checks[k] = checks.get(k, True) and v
        side["checks"] = checks
        side["runs"] = [
            {k: v for k, v in r.items() if k not in FIGURES and k != "error"} for r in rows
        ]
        out["sides"][name] = side
    out["failed"] = sorted(n for n, side in out["sides"].items() if side["status"] == "failed")
    out["skipped"] = sorted(skipped)
    ours_name = _best(out["sides"], "ours")
    ours = out["sides"].get(ours_name, {})
    for peer, goal in GOALS.items():
        peer_name = _best(out["sides"], peer)
        theirs = out["sides"].get(peer_name, {})
        ratios = {}
        for f in FIGURES:
            a, b = ours.get(f), theirs.get(f)
            ratios[f.replace("_s_median", "")] = a / b if a is not None and b else None
        pairs = zip(runs.get(ours_name, []), runs.get(peer_name, []))
        per_round = [
            a["step_s_median"] / b["step_s_median"]
            for a, b in pairs
            if a.get("status") == b.get("status") == "ok"
        ]
        mine = ours.get("step_s_median")
        timed = _timed(out["sides"], peer)
        by_side = {} if mine is None else {name: mine / t for name, t in timed.items() if t}
        out[f"ours_over_{peer}"] = dict(
            ratios, step_per_round=per_round, sides=[ours_name, peer_name], step_by_side=by_side
        )
        out[f"goal_step_le_{goal}x_{peer}"] = (
            None if ratios["step"] is None else ratios["step"] <= goal
        )
    return out


def _timed(sides: Mapping[str, Mapping], base: str) -> dict[str, float]:
    """The median step of each configuration of side ``base`` ("tunix", "tunix@2", ...) that
    has one."""
    return {
        name: side["step_s_median"]
        for name, side in sides.items()
        if base_name(name) == base and side.get("step_s_median") is not None
    }


def _best(sides: Mapping[str, Mapping], base: str) -> str:
    """The configuration of side ``base`` with the lowest median step (``base`` itself when none
    has figures)."""
    timed = _timed(sides, base)
    return min(timed, key=lambda name: (timed[name], name)) if timed else base


def matmul_peak(python: str, env: Mapping[str, str], timeout_s: float = 300) -> dict:
    """``benchmarks/peers/matmul_peak.py``'s line (the machine's float32 matmul rate) run with
    ``python`` on one JAX device, or ``{"error": ...}``."""
    cmd = [python, os.path.join(PEERS, "matmul_peak.py")]
    try:
        proc = subprocess.run(
            cmd,
            env=with_host_devices(env, 1),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s: {' '.join(cmd)}"}
    except OSError as e:  # no such Python
        return {"error": f"{type(e).__name__}: {e}: {' '.join(cmd)}"}
    row = last_json_line(proc.stdout, "matmul_flops_s") if proc.returncode == 0 else None
    if row is None:
        return {"error": f"exit code {proc.returncode}: {' '.join(cmd)}\n{proc.stderr[-1000:]}"}
    return row


def roofline(
    sides: Mapping[str, Mapping], flops: Mapping[str, int], rates: Sequence[float]
) -> dict:
    """The workload's model FLOPs (``workload.step_flops``) at the best matmul rate measured in
    the run (``rates``: one per round): the seconds a step could take if every FLOP ran at that
    rate (``bound_s``), the fraction of it each side reaches (``peak_fraction``: bound ÷ its
    median step, generation and train parts likewise), and the fraction a side would need to
    meet each goal against the peer's best configuration (``peak_fraction_needed``: above 1 the
    goal is out of reach on this machine whatever the implementation)."""
    out: dict = {"flops": dict(flops), "matmul_flops_s_per_round": list(rates)}
    if not rates:
        return out
    rate = max(rates)
    parts = dict(zip(("step", "generation", "train"), FIGURES, strict=True))  # part -> figure
    bound = {part: flops[part] / rate for part in parts}
    out.update(matmul_flops_s=rate, bound_s=bound, peak_fraction={}, peak_fraction_needed={})
    for name, side in sides.items():
        figures = {part: side.get(figure) for part, figure in parts.items()}
        if figures["step"]:
            out["peak_fraction"][name] = {
                p: bound[p] / t if t else None for p, t in figures.items()
            }
    for peer, goal in GOALS.items():
        theirs = sides.get(_best(sides, peer), {}).get("step_s_median")
        if theirs:
            out["peak_fraction_needed"][peer] = bound["step"] / (goal * theirs)
    return out


def _workload():
    """benchmarks/peers/workload.py (stdlib at import; tokenizers only inside its functions)."""
    spec = importlib.util.spec_from_file_location(
        "peer_workload_shared", os.path.join(PEERS, "workload.py")
    )
    workload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workload)  # no dataclasses: needs no sys.modules entry
    return workload


def reference_digest(workdir: str) -> str | None:
    """The workload tokenizer's digest as this Python trains it (the one ours runs with by default),
    or None when this Python lacks ``tokenizers``/``transformers``."""
    workload = _workload()
    try:
        return workload.tokenizer_digest(workload.byte_bpe(os.path.join(workdir, "reference-bpe")))
    except ImportError:
        return None


HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def with_host_devices(env: Mapping[str, str], n: int) -> dict[str, str]:
    """``env`` with XLA's host-device count set to ``n`` (any count already in XLA_FLAGS replaced,
    its other flags kept): each JAX side then sees ``n`` CPU devices (torch ignores it)."""
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(HOST_DEVICES_FLAG)]
    return {**env, "XLA_FLAGS": " ".join([*flags, f"{HOST_DEVICES_FLAG}={n}"])}


def side_env(tcmalloc: bool, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment every side starts with: this one, tcmalloc preloaded if asked and found."""
    if tcmalloc:
        sys.path.insert(0, ROOT)
        from rubric_rl.util.tcmalloc import preload_env  # stdlib only

        env = preload_env(environ)
        if env is not None:
            return env
    return dict(environ)


def parse_sides(
    text: str, known: Mapping[str, Side], host_devices: int
) -> tuple[list[Side], list[str]]:
    """``--sides``: comma-separated ``name`` or ``name@N`` (N CPU devices, or ``cores``) ->
    the sides in order, each with its device count (``host_devices`` when not given), and the
    entries that are not valid (unknown names, bad or repeated counts)."""
    sides, bad = [], []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, _, count = entry.partition("@")
        devices = _devices(count) if count else host_devices
        if name not in known or devices < 1:
            bad.append(entry)
            continue
        sides.append(dataclasses.replace(known[name], name=entry, devices=devices))
    names = [s.name for s in sides]
    bad += sorted({n for n in names if names.count(n) > 1})
    return sides, bad


def _devices(text: str) -> int:
    """A device count: a positive integer or ``cores`` (os.cpu_count()); 0 when neither."""
    if text == "cores":
        return os.cpu_count() or 1
    try:
        return int(text)
    except ValueError:
        return 0


def run_rounds(
    sides: Sequence[Side],
    *,
    rounds: int,
    steps: int,
    warmup: int,
    workdir: str,
    env: Mapping[str, str],
    timeout_s: float,
    tokenizer_digest: str | None = None,
    log=None,
    calibrate: str | None = None,
) -> dict:
    """``rounds`` rounds over the sides that can run, in order; the aggregated JSON object
    (``tokenizer_digest``: the workload tokenizer's, to check the sides' against). With
    ``calibrate`` (a Python with jax) each round ends with `matmul_peak` and the line gets the
    `roofline`."""
    skipped = {s.name: why for s in sides if (why := missing(s))}
    runnable = [s for s in sides if s.name not in skipped]
    runs: dict[str, list[dict]] = {s.name: [] for s in runnable}
    peaks: list[dict] = []
    for i in range(rounds):
        for s in runnable:
            row = run_side(
                s,
                steps=steps,
                warmup=warmup,
                workdir=os.path.join(workdir, f"{s.name}-{i}"),
                env=env,
                timeout_s=timeout_s,
            )
            runs[s.name].append(dict(row, round=i))
            if log is not None:
                brief = {k: row.get(k) for k in ("status", *FIGURES)}
                print(f"round {i} {s.name}: {json.dumps(brief)}", file=log, flush=True)
        if calibrate:
            peaks.append(matmul_peak(calibrate, env))
            if log is not None:
                print(f"round {i} matmul_peak: {json.dumps(peaks[-1])}", file=log, flush=True)
    out = aggregate(runs, skipped, tokenizer_digest)
    if calibrate:
        rates = [p["matmul_flops_s"] for p in peaks if "matmul_flops_s" in p]
        out["roofline"] = roofline(out["sides"], _workload().step_flops(), rates)
        out["roofline"]["errors"] = [p["error"] for p in peaks if "error" in p]
    out.update(
        rounds=rounds,
        steps=steps,
        warmup=warmup,
        order=[s.name for s in runnable],
        tokenizer_digest=tokenizer_digest,
    )
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them (compilation)")
    p.add_argument(
        "--sides",
        default="ours,tunix,trl",
        help="comma-separated, run in this order each round; name@N runs that side with N CPU "
        "devices (e.g. ours@2,tunix@1,tunix@2,trl)",
    )
    venvs = os.environ.get("PEER_VENVS", os.path.join(os.path.dirname(ROOT), "peer-venvs"))
    p.add_argument(
        "--venvs", default=venvs, help="folder holding the tunix/ and trl/ virtual environments"
    )
    p.add_argument("--python", default=sys.executable, help="the Python that runs our side")
    p.add_argument(
        "--tcmalloc",
        choices=("auto", "off"),
        default="auto",
        help="preload tcmalloc for every side",
    )
    p.add_argument(
        "--host_devices",
        default="1",
        help="CPU devices each JAX side sees unless its --sides entry says @N (XLA_FLAGS' "
        "host-device count; 'cores' = os.cpu_count()); ours runs data-parallel over them, "
        "Tunix's side puts them all on its fsdp axis; TRL's side is unaffected",
    )
    p.add_argument(
        "--roofline",
        choices=("on", "off"),
        default="on",
        help="after each round time the machine's float32 matmul rate with --python "
        "(benchmarks/peers/matmul_peak.py) and report the workload's FLOP bound",
    )
    p.add_argument("--timeout_s", type=float, default=1800, help="per run of one side")
    p.add_argument("--workdir", default=None, help="run directories (default: a temporary folder)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.steps < 1 or a.warmup < 1:
        p.error(
            f"--rounds ({a.rounds}), --steps ({a.steps}) and --warmup ({a.warmup}) must be >= 1"
        )
    known = default_sides(a.venvs, a.python)
    host_devices = _devices(a.host_devices)
    if host_devices < 1:
        p.error(f"--host_devices ({a.host_devices!r}) must be an integer >= 1 or 'cores'")
    sides, bad = parse_sides(a.sides, known, host_devices)
    if bad:
        p.error(
            f"--sides: {bad} not valid: each entry is a side ({sorted(known)}) with an optional "
            "@N (N >= 1 CPU devices, or @cores), each configuration once"
        )
    env = side_env(a.tcmalloc == "auto")
    with tempfile.TemporaryDirectory(prefix="peer_step_") as tmp:
        out = run_rounds(
            sides,
            rounds=a.rounds,
            steps=a.steps,
            warmup=a.warmup,
            workdir=a.workdir or tmp,
            env=env,
            timeout_s=a.timeout_s,
            tokenizer_digest=reference_digest(a.workdir or tmp),
            log=sys.stderr,
            calibrate=a.python if a.roofline == "on" else None,
        )
    out["tcmalloc"] = env.get("LD_PRELOAD") if "tcmalloc" in env.get("LD_PRELOAD", "") else None
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
