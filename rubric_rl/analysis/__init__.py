"""Reading run directories (CONVENTIONS.md "Run directory") into plain Python / numpy structures.

Used by ``launch/aggregate.py`` (results tables over seeds) and ``colabs/rubric_profiles.ipynb``
(ARISE's figures). Reads only the run directory::

    <run>/config.json             resolved config
    <run>/metrics.jsonl           one JSON object per logged step ("step" + metric keys)
    <run>/controllers/<name>.jsonl  controller events, e.g. arise.jsonl:
                                  {step, entry, event, from, to, evidence}
    <run>/rollouts/step_XXXXXX.jsonl.gz  sampled rollouts with verdicts
    <run>/checkpoints/<step>/run_state/metadata  orbax JsonSave of the run state (plain JSON)

A sweep lays runs out as ``<root>/<group>/seed<k>`` (``launch/sweep.py``); ``find_runs`` reads that.
No pandas: rows are dicts, curves are numpy arrays.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

# Metric keys (the trainer prefixes a controller's metrics with its name: "arise/...").
HELDOUT_SCORE = "eval/heldout/score"
EVAL_SPLITS = ("heldout", "validation", "ood")
EVAL_METRICS = ("score", "pass_rate", "oracle")
RUBRIC_REWARD = "reward/mean"  # the step's rubric reward (pool rubric under ARISE)
RUBRIC_PASS = "arise/rubric/pass_rate"  # pooled pass rate of the pool's criteria
TASK_PASS = "arise/task/pass_rate"  # task verifier pass rate of the training rollouts
ALL_FAIL = "arise/task/all_fail_groups"  # share of groups where no rollout passed the task
# The same share logged by every method's step (step_metrics); ARISE's own for older runs.
ALL_FAIL_KEYS = ("task/all_fail_groups", ALL_FAIL)
CRITERION_RE = re.compile(r"^arise/rubric/([^/]+)/pass_rate$")
SAMPLER_PREFIX = "arise/sampler/p/"  # + "<task type>/<capability>": P(cell), discovery excluded
POOL_EVENTS = "arise"  # controllers/arise.jsonl
FINISHED_MARKER = "SWEEP_DONE.json"  # written by launch/sweep.py when a run exits 0
SEED_DIR = re.compile(r"^seed(\d+)$")


# ------------------------------------------------------------------------------ files


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file. A torn LAST line (a run killed mid-write) is ignored; a bad line
    elsewhere is an error naming the file and line."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                continue
            raise ValueError(f"{path}:{i + 1}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i + 1}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def metrics_path(run_dir: str) -> str | None:
    """``<run>/metrics.jsonl``, else an archived run's ``metrics.jsonl.gz`` (``launch/archive.py``),
    else None."""
    for name in ("metrics.jsonl", "metrics.jsonl.gz"):
        if os.path.exists(os.path.join(run_dir, name)):
            return os.path.join(run_dir, name)
    return None


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """metrics.jsonl rows sorted by step; a step logged twice keeps its last row (a replay)."""
    path = metrics_path(run_dir)
    if path is None:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (not a run directory?)")
    by_step: dict[int, dict[str, Any]] = {}
    for i, row in enumerate(read_jsonl(path)):
        if "step" not in row:
            raise ValueError(f"{path}: row {i + 1} has no 'step' field")
        by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def read_config(run_dir: str) -> dict[str, Any]:
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_events(run_dir: str, name: str = POOL_EVENTS) -> list[dict[str, Any]]:
    """``controllers/<name>.jsonl`` (empty if the controller wrote none), sorted by step."""
    path = os.path.join(run_dir, "controllers", f"{name}.jsonl")
    if not os.path.exists(path):
        return []
    rows = read_jsonl(path)
    for i, r in enumerate(rows):
        if "step" not in r:
            raise ValueError(f"{path}: row {i + 1} has no 'step' field")
    return sorted(rows, key=lambda r: int(r["step"]))  # stable: same-step order kept


def iter_rollouts(run_dir: str) -> Iterator[dict[str, Any]]:
    """Every logged rollout (``rollouts/step_*.jsonl.gz``), in step order."""
    for path in sorted(glob.glob(os.path.join(run_dir, "rollouts", "step_*.jsonl.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


@dataclasses.dataclass(frozen=True)
class Run:
    """One run directory, loaded."""

    path: str
    config: Mapping[str, Any]
    metrics: tuple[dict[str, Any], ...]

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        return metric_series(self.metrics, key)

    def keys(self) -> list[str]:
        return sorted({k for r in self.metrics for k in r})


def load_run(run_dir: str) -> Run:
    if metrics_path(run_dir) is None:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (not a run directory?)")
    return Run(run_dir, read_config(run_dir), tuple(read_metrics(run_dir)))


def metric_series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows that log ``key`` with a number (NaN kept: it is a value)."""
    steps, vals = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            steps.append(int(r["step"]))
            vals.append(float(v))
    return np.asarray(steps, np.int64), np.asarray(vals, np.float64)


# ------------------------------------------------------------------------------ sweeps


def is_finished(run_dir: str) -> bool:
    """A run is finished when the sweep wrote its marker, or its config's final step has a
    complete checkpoint (orbax renames ``<step>.orbax-checkpoint-tmp`` to ``<step>`` on commit)."""
    if os.path.exists(os.path.join(run_dir, FINISHED_MARKER)):
        return True
    steps = read_config(run_dir).get("train", {}).get("steps")
    return steps is not None and int(steps) in checkpoint_steps(run_dir)


def stopped_short(run: Run) -> str | None:
    """``"step s of n"`` when the run's last logged step is below its config's ``train.steps``
    (its metrics stop short even if a final checkpoint exists), else None."""
    want = run.config.get("train", {}).get("steps")
    last = max((int(r["step"]) for r in run.metrics if "step" in r), default=None)
    if want is not None and (last is None or last < int(want)):
        return f"step {last} of {int(want)}"
    return None


def skipped_dirs(root: str) -> list[tuple[str, str]]:
    """Every directory under ``root`` that ``find_runs`` does not take as a run, with why: a
    group-level directory with no ``seed<k>`` run, a ``seed<k>`` without metrics, a run set
    aside by ``sweep.py --force`` (``<wd>.replaced-<time>``), a negative seed's ``seed-<k>``,
    any other name."""
    out = []
    for group in sorted(os.listdir(root)):
        gdir = os.path.join(root, group)
        if not os.path.isdir(gdir):
            continue
        names = sorted(n for n in os.listdir(gdir) if os.path.isdir(os.path.join(gdir, n)))
        runs = [n for n in names if SEED_DIR.match(n)]
        if not any(n.startswith("seed") for n in names):
            out.append((gdir, "no seed<k> run directory in it"))
            continue
        for name in names:
            path = os.path.join(gdir, name)
            if name in runs:
                if metrics_path(path) is None:
                    out.append((path, "no metrics.jsonl (the run never logged a step)"))
            elif ".replaced-" in name:
                out.append((path, "an earlier run set aside by sweep.py --force"))
            elif re.fullmatch(r"seed-\d+", name):
                out.append((path, "a negative seed (sweep.py refuses them; not tabulated)"))
            else:
                out.append((path, "not a seed<k> directory"))
    return out


def checkpoint_steps(run_dir: str) -> list[int]:
    """Complete checkpoint steps under ``<run>/checkpoints`` (temporary directories ignored)."""
    d = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(d):
        return []
    return sorted(int(n) for n in os.listdir(d) if n.isdigit() and os.path.isdir(f"{d}/{n}"))


def find_runs(root: str) -> dict[str, dict[int, str]]:
    """``<root>/<group>/seed<k>`` -> {group: {seed: run dir}} (directories with metrics only)."""
    out: dict[str, dict[int, str]] = {}
    for group in sorted(os.listdir(root)):
        gdir = os.path.join(root, group)
        if not os.path.isdir(gdir):
            continue
        for name in sorted(os.listdir(gdir)):
            m = SEED_DIR.match(name)
            if m and metrics_path(os.path.join(gdir, name)) is not None:
                out.setdefault(group, {})[int(m.group(1))] = os.path.join(gdir, name)
    return out


def seed_curves(runs: Sequence[Run], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values [n_seeds, n_steps]) over the steps EVERY seed logged ``key`` at; seeds
    that stopped early shorten the curve rather than biasing its tail."""
    series = [r.series(key) for r in runs]
    if not series:
        return np.zeros(0, np.int64), np.zeros((0, 0))
    common = set(series[0][0].tolist())
    for s, _ in series[1:]:
        common &= set(s.tolist())
    steps = np.asarray(sorted(common), np.int64)
    vals = np.stack([v[np.searchsorted(s, steps)] for s, v in series]) if steps.size else None
    return steps, (vals if vals is not None else np.zeros((len(runs), 0)))


def mean_std(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std (ddof = 1) over seeds; the std of a single seed is NaN (undefined)."""
    values = np.asarray(values, np.float64)
    mean = values.mean(axis=axis)
    if values.shape[axis] < 2:
        return mean, np.full_like(mean, np.nan)
    return mean, values.std(axis=axis, ddof=1)


# Two-sided 95 % critical values of Student's t, df = 1..30 (standard tables, 3 decimals).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964


def t_critical_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: the table up to 30, then
    the Cornish-Fisher expansion in 1/df (within 1e-3 of the exact value there)."""
    if df < 1:
        raise ValueError(f"t_critical_975: df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95 % confidence interval, n) over seeds: t_{0.975, n-1} · s / √n
    with the sample std (ddof = 1). NaN values are left out; one value has no interval (NaN)."""
    x = np.asarray(values, np.float64)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return math.nan, math.nan, 0
    if x.size == 1:
        return float(x[0]), math.nan, 1
    half = t_critical_975(x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(half), int(x.size)


def run_seed(run: Run) -> int | None:
    """The seed a run directory stands for (``.../seed<k>``), or None."""
    m = SEED_DIR.match(os.path.basename(os.path.normpath(run.path)))
    return int(m.group(1)) if m else None


def final_value(run: Run, key: str) -> tuple[int, float] | None:
    """(step, value) of the last row logging ``key``, or None."""
    steps, vals = run.series(key)
    return (int(steps[-1]), float(vals[-1])) if steps.size else None


def best_index(curve: np.ndarray) -> int:
    """Index of the best (max) point of a curve, the earliest among ties; NaN points skipped."""
    curve = np.asarray(curve, np.float64)
    if curve.size == 0 or np.all(np.isnan(curve)):
        raise ValueError("best_index: empty or all-NaN curve")
    return int(np.nanargmax(curve))


def first_reach(steps: np.ndarray, curve: np.ndarray, target: float) -> int | None:
    """First step at which ``curve >= target`` (None if never)."""
    hit = np.flatnonzero(np.asarray(curve, np.float64) >= target)
    return int(np.asarray(steps)[hit[0]]) if hit.size else None


# ------------------------------------------------------------------------------ ARISE pool


def pool_dynamics(
    events: Sequence[Mapping[str, Any]], steps: Sequence[int] | None = None
) -> dict[str, np.ndarray]:
    """Replays lifecycle events into counts after each step: ``added`` / ``retired`` (cumulative),
    ``active`` (live = added − retired: evaluated rubrics), ``skill_active`` (skill injected),
    ``hidden``, ``refined`` (cumulative). ``steps`` defaults to the steps with events."""
    state: dict[str, str] = {}
    totals = {"added": 0, "retired": 0, "refined": 0}
    ev_steps = sorted({int(e["step"]) for e in events})
    grid = sorted(set(int(s) for s in steps)) if steps is not None else ev_steps
    out = {k: [] for k in ("added", "retired", "active", "skill_active", "hidden", "refined")}
    i = 0
    evs = sorted(events, key=lambda e: int(e["step"]))
    for s in grid:
        while i < len(evs) and int(evs[i]["step"]) <= s:
            e = evs[i]
            kind, entry = e["event"], str(e["entry"])
            if kind == "add":
                totals["added"] += 1
            elif kind == "retire":
                totals["retired"] += 1
            elif kind == "refine":
                totals["refined"] += 1
            state[entry] = e["to"]
            i += 1
        states = list(state.values())
        out["added"].append(totals["added"])
        out["retired"].append(totals["retired"])
        out["refined"].append(totals["refined"])
        out["active"].append(sum(st != "retired" for st in states))
        out["skill_active"].append(sum(st == "active" for st in states))
        out["hidden"].append(sum(st == "hidden" for st in states))
    res = {k: np.asarray(v, np.int64) for k, v in out.items()}
    res["step"] = np.asarray(grid, np.int64)
    return res


POOL_METRICS = {  # pool_dynamics key -> the ARISE controller's per-step metric
    "added": "arise/pool/added_total",
    "retired": "arise/pool/retired_total",
    "refined": "arise/pool/refined_total",
    "active": "arise/pool/live",
    "skill_active": "arise/pool/skill_active",
    "hidden": "arise/pool/skill_hidden",
}


def pool_dynamics_from_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The same counts as ``pool_dynamics`` from the controller's ``arise/pool/*`` metrics (for
    runs without an event log), over the steps that logged them all."""
    usable = [r for r in rows if all(k in r for k in POOL_METRICS.values())]
    out = {k: np.asarray([int(r[m]) for r in usable], np.int64) for k, m in POOL_METRICS.items()}
    out["step"] = np.asarray([int(r["step"]) for r in usable], np.int64)
    return out


def run_pool_dynamics(run: Run) -> dict[str, np.ndarray]:
    """Pool counts after each training step: replayed from ``controllers/arise.jsonl`` when the
    run has events, else read from its ``arise/pool/*`` metrics (empty arrays if neither)."""
    events = read_events(run.path)
    if events:
        return pool_dynamics(events, [int(r["step"]) for r in run.metrics if int(r["step"]) >= 1])
    return pool_dynamics_from_metrics(run.metrics)


def events_by_entry(events: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, str]]]:
    """{entry: [(step, event), ...]} for marking lifecycle events on trajectories."""
    out: dict[str, list[tuple[int, str]]] = {}
    for e in events:
        out.setdefault(str(e["entry"]), []).append((int(e["step"]), str(e["event"])))
    return out


def criterion_trajectories(
    rows: Sequence[Mapping[str, Any]],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{criterion id: (steps, pass rates)} from ``arise/rubric/<id>/pass_rate`` keys."""
    ids = sorted({m.group(1) for r in rows for k in r if (m := CRITERION_RE.match(k))})
    return {cid: metric_series(rows, f"arise/rubric/{cid}/pass_rate") for cid in ids}


def sampling_cells(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(task type, capability) cells that ever had a logged sampling probability."""
    cells = set()
    for r in rows:
        for k in r:
            if k.startswith(SAMPLER_PREFIX):
                tail = k[len(SAMPLER_PREFIX) :]
                if "/" not in tail:
                    raise ValueError(f"metric {k!r}: expected {SAMPLER_PREFIX}<type>/<capability>")
                t, c = tail.split("/", 1)
                cells.add((t, c))
    return sorted(cells)


def stage_bounds(last_step: int, n_stages: int = 3) -> list[tuple[int, int]]:
    """Steps 1..last split into ``n_stages`` equal inclusive ranges (ARISE: 1–50, 51–100,
    101–150 of 150)."""
    if last_step < n_stages:
        raise ValueError(f"stage_bounds: {last_step} steps cannot make {n_stages} stages")
    edges = [round(last_step * k / n_stages) for k in range(n_stages + 1)]
    return [(edges[k] + 1, edges[k + 1]) for k in range(n_stages)]


def stage_heatmap(
    rows: Sequence[Mapping[str, Any]], lo: int, hi: int
) -> tuple[list[str], list[str], np.ndarray]:
    """(task types, capabilities, P [types, capabilities]) averaged over the stage's steps that
    logged any sampling probability. A cell absent at a step (too little evidence) counts 0 at
    that step; a cell absent at every step of the stage is NaN (a blank heatmap cell)."""
    cells = sampling_cells(rows)
    types = sorted({t for t, _ in cells})
    caps = sorted({c for _, c in cells})
    acc = np.zeros((len(types), len(caps)))
    seen = np.zeros((len(types), len(caps)), bool)
    n = 0
    for r in rows:
        if not lo <= int(r["step"]) <= hi:
            continue
        present = [(k, v) for k, v in r.items() if k.startswith(SAMPLER_PREFIX)]
        if not present:
            continue
        n += 1
        for k, v in present:
            t, c = k[len(SAMPLER_PREFIX) :].split("/", 1)
            acc[types.index(t), caps.index(c)] += float(v)
            seen[types.index(t), caps.index(c)] = True
    out = acc / n if n else acc
    out[~seen] = np.nan
    return types, caps, out


def final_pool_state(run_dir: str, controller: str = POOL_EVENTS) -> dict[str, Any]:
    """The ARISE pool of the run's LAST complete checkpoint (``state["pool"]`` of the controller
    named ``controller``), for the frozen-rubrics ablation (``AriseController.load_pool``).

    Read from ``checkpoints/<step>/run_state/metadata`` (orbax JsonSave writes plain JSON), so no
    orbax or model is needed. Replaying ``controllers/arise.jsonl`` cannot rebuild a pool: its
    events carry ids and transitions, not the rubric/skill texts."""
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoint under checkpoints/")
    path = os.path.join(run_dir, "checkpoints", str(steps[-1]), "run_state", "metadata")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: checkpoint has no run_state")
    with open(path, encoding="utf-8") as f:
        state = json.load(f)
    ctrls = state.get("controllers", {})
    if controller not in ctrls or "pool" not in ctrls[controller]:
        raise ValueError(
            f"{path}: no '{controller}' controller pool in the run state (controllers: "
            f"{sorted(ctrls)}); was it an ARISE run?"
        )
    return ctrls[controller]["pool"]
