"""Results tables over a sweep's run directories (``<root>/<group>/seed<k>``, see sweep.py), as
``benchmarks/protocol.md`` pre-registers them.

    python launch/aggregate.py runs/protocol --reference arise-protocol --match outcome [--out D]
    python launch/aggregate.py runs/protocol_h --reference harness_rl-protocol --dynamics \
        --cost-reference grpo-protocol

Writes to ``--out`` (default ``<root>``) ``results.md`` (every table below) and one CSV per table:

- ``results.csv`` — per group and evaluation set (every ``eval/<set>/...`` prefix: heldout,
  validation, ood), each metric at each run's FINAL step (pre-registered: no checkpoint is chosen
  on a test set), mean ± 95 % CI over seeds (Student's t, ddof = 1): ``pass_rate`` (the task
  verifier, primary), ``oracle`` (the hidden quality, primary), ``env_mean/pass_rate`` (the
  unweighted mean over environments), ``score`` (the seed rubric, secondary). Every ± in a CSV
  is the 95 % CI half-width (``<metric>_mean``, ``<metric>_ci95``). A run that stopped before
  its ``train.steps`` is an error naming it (``--allow-incomplete``: tabulated at its last step
  and listed);
- ``rise.csv`` — per group, each held-out metric at step 0 (the warm start, before the first
  update) and its change to the final step on each seed (± CI; how many seeds rose);
- ``env.csv`` — per group, each environment's held-out pass rate at the final step (± CI);
- ``paired.csv`` (``--reference``) — per group, the paired difference to the reference group on
  the seeds both ran (seed k with seed k: one warm start each), mean ± 95 % CI and how many
  seeds favour the group;
- ``first_reach.csv`` (``--match``) — the first evaluated step at which each group's seed-mean
  held-out pass rate reaches the ``--match`` group's final seed-mean pass rate, and its ratio to
  that group's final step (ARISE: outcome-only RL's step-150 level by step 50, ratio 1/3);
- ``pool.csv`` / ``pool_dynamics.csv`` — ARISE pool counts (added / active / retired) at the end
  (± CI) and over steps, from ``controllers/arise.jsonl`` (else the ``arise/pool/*`` metrics);
  groups whose pool never held an entry are left out;
- ``all_fail.csv`` — the rate of all-failure rollout groups (``task/all_fail_groups``, logged
  by every method; ARISE's ``arise/task/all_fail_groups`` for runs before it) over training and
  per early / middle / late third (± CI);
- ``calibration.csv`` — the fixed probe set before RL (``controllers/calibration``): task pass
  rate and all-failure groups unguided and with skills, and how many requirements no unguided
  rollout met (the stated ones and the implicit ones the checker library adds);
- ``dynamics.csv`` (``--dynamics``, ``benchmarks/protocol_harness.md``) — per group, the
  training-dynamics figures of ``DYNAMICS``: failure proportions of the trained reward and of the
  seed rubric over the last 10 % of steps, the reversal rate at the final step, the unguided share
  at 70 % of training, the peak guidance fields per task (± CI);
- ``cost.csv`` (``--cost-reference G``) — per group, the median seconds per step over steps >= 2,
  its ratio to group G's paired by seed, the harness cost split as fractions of the step, the
  guided rollouts' share of prompt tokens (an upper bound on their extra generation cost), and
  the median seconds of the rollout, train and teacher stages (``COST_STAGES``); for runs that
  log a role per step (ARISE-RL's ``arise_rl/generator_phase``: 1 generator, 0 solver) also the
  median seconds per generator step and per solver step, each as a ratio to G's median s/step
  by seed (``benchmarks/protocol_arise_rl.md``'s cost; G = solver-only GRPO there).

A group is averaged only when its runs are one experiment: configs that differ beyond
``train.seed`` (each key listed; ``--allow-config-diff KEY`` to accept one), a run whose recorded
seed is not its directory's, or two runs with the same metrics (one run copied twice) are an
error before any table is written. Every directory not read as a run is listed on stderr with
why (``rubric_rl.analysis.skipped_dirs``).

``--select`` (not the protocol): also report each set at a best step, for exploration. ``auto`` =
the set's ``pass_rate`` when it logs one, else its ``score``; a metric name = that metric of each
set; a full key (``eval/validation/pass_rate``) = one best step for every set, chosen on that
key — the only selection the protocol allows, on the validation split. A best step is the max of
the seed-MEAN curve (selecting per seed would pick each seed's lucky step). Curves are averaged
over the steps every seed logged.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from launch import packed  # noqa: E402
from rubric_rl import analysis as an  # noqa: E402

AUTO = "auto"
FINAL = "final"  # --select default: no selection, every number at the final step
PRIMARY_METRICS = ("pass_rate", "score")  # --select auto: the first one a set logs
REPORTED_METRICS = ("score", "pass_rate", "oracle", "env_mean/pass_rate")
HELDOUT_PASS = "eval/heldout/pass_rate"
_EVAL_SET = re.compile(r"^eval/([^/]+)/.")


def fmt(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    """``62.30 ± 1.20``; ``62.30`` when the std is undefined; ``–`` when there is no value."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    if std is None or math.isnan(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def load_groups(root: str, groups: Sequence[str] | None = None) -> dict[str, list[an.Run]]:
    found = an.find_runs(root)
    if not found:
        raise FileNotFoundError(f"{root}: no run directories <group>/seed<k>/metrics.jsonl")
    if groups:
        missing = sorted(set(groups) - set(found))
        if missing:
            raise ValueError(f"--groups {missing} not under {root}; found {sorted(found)}")
        found = {g: found[g] for g in groups}
    return {g: [an.load_run(p) for _, p in sorted(seeds.items())] for g, seeds in found.items()}


SEED_KEY = "train.seed"
VOLATILE = ("time/", "perf/")  # wall-clock metrics: two runs of one program differ in them


class GroupError(ValueError):
    """A group that a table would average wrongly (mixed configs, a run twice)."""


def _seed_of(run: an.Run) -> int | None:
    m = an.SEED_DIR.match(os.path.basename(os.path.normpath(run.path)))
    return int(m.group(1)) if m else None


def _seedless(value: Any, seed: int | None) -> Any:
    """A string value with the run's seed written back as ``{seed}`` (sweep.py puts each run's
    seed into overrides such as ``frozen_rubrics=runs/p/arise/seed{seed}``)."""
    if not isinstance(value, str) or seed is None:
        return value
    return re.sub(rf"(?<![0-9]){seed}(?![0-9])", "{seed}", value)


def _exempt(key: str) -> bool:
    """Keys that may differ between a group's runs without changing what they compute (ours):
    where caches live (``*cache_dir``: a path per machine, the cached content is the same) and
    how the run logs (``logging.*``)."""
    return key.endswith("cache_dir") or key.startswith("logging.")


def config_differences(
    runs: Sequence[an.Run], allow: Sequence[str] = ()
) -> dict[str, list[tuple[str, Any]]]:
    """``{dotted key: [(run, value), ...]}`` for every config key whose value differs between
    the runs of one group, beyond ``train.seed``, a value that differs only by each run's own
    seed, ``_exempt`` keys and the keys (or key prefixes) in ``allow``. A key that only some
    runs record (an option added to the configs between them, taken at its default) is compared
    among the runs that record it."""
    from rubric_rl.runs.run_dir import flatten

    flat = [flatten(run.config) for run in runs]
    seeds = [_seed_of(run) for run in runs]
    out = {}
    for key in sorted(set().union(*flat)):
        if (
            key == SEED_KEY
            or _exempt(key)
            or any(key == a or key.startswith(a + ".") for a in allow)
        ):
            continue
        have = [i for i, f in enumerate(flat) if key in f]
        if len({repr(flat[i][key]) for i in have}) < 2:
            continue
        # Only a value that differs is read for its seed ("k3" in seed 3's run is no seed).
        norm = {repr(_seedless(flat[i][key], seeds[i])) for i in have}
        if len(norm) > 1:
            out[key] = [(os.path.basename(runs[i].path), flat[i][key]) for i in have]
    return out


def _stable(run: an.Run) -> tuple:
    return tuple(
        tuple(sorted((k, repr(v)) for k, v in r.items() if not k.startswith(VOLATILE)))
        for r in run.metrics
    )


def group_problems(runs: Sequence[an.Run], allow: Sequence[str] = ()) -> list[str]:
    """Why one group's runs cannot be averaged (empty when they can): configs that differ beyond
    ``train.seed`` (each key with every run's value), a run whose recorded ``train.seed`` is not
    its ``seed<k>`` directory's, two runs with identical metrics (one run copied twice)."""
    out = []
    for key, values in config_differences(runs, allow).items():
        out.append(f"config {key} differs: " + ", ".join(f"{n}={v!r}" for n, v in values))
    for run in runs:
        recorded = run.config.get("train", {}).get("seed")
        if recorded is not None and _seed_of(run) is not None and int(recorded) != _seed_of(run):
            out.append(f"{os.path.basename(run.path)} records train.seed={recorded}")
    first: dict[tuple, str] = {}
    for run in runs:
        name = os.path.basename(run.path)
        key = _stable(run)
        if key in first:
            out.append(f"{name} has the same metrics as {first[key]} (one run twice?)")
        else:
            first[key] = name
    return out


def check_groups(groups: Mapping[str, Sequence[an.Run]], allow: Sequence[str] = ()) -> None:
    """Raises ``GroupError`` listing every group's problems (``group_problems``)."""
    lines = [
        f"  {group}: {problem}"
        for group, runs in groups.items()
        for problem in group_problems(runs, allow)
    ]
    if lines:
        raise GroupError(
            "groups that cannot be averaged:\n" + "\n".join(lines) + "\nmove the odd runs "
            "out of the group, or pass --allow-config-diff KEY for a key that may differ"
        )


def resolve_group(name: str, groups: Sequence[str], flag: str = "--reference") -> str:
    """An exact group name, else the unique group containing ``name`` (``flag``: the option
    that named it, for the error)."""
    if name in groups:
        return name
    hits = [g for g in groups if name in g]
    if len(hits) != 1:
        raise ValueError(f"{flag} {name!r} matches {hits or 'no group'}; groups: {groups}")
    return hits[0]


# ------------------------------------------------------------------------------ tables


def eval_sets(runs: Sequence[an.Run]) -> list[str]:
    """Every evaluation set the runs log (``eval/<set>/...``): heldout, ood, then others sorted."""
    return _in_order({m.group(1) for run in runs for k in run.keys() if (m := _EVAL_SET.match(k))})


def _in_order(sets: set[str]) -> list[str]:
    return [s for s in an.EVAL_SPLITS if s in sets] + sorted(sets - set(an.EVAL_SPLITS))


def _mean_curve(runs: Sequence[an.Run], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, seed-mean values) of ``key``; empty when no step is common to every seed."""
    steps, vals = an.seed_curves(runs, key)
    return steps, (an.mean_std(vals)[0] if steps.size else np.zeros(0))


def selection_key(runs: Sequence[an.Run], split: str, select: str = AUTO) -> str | None:
    """The key whose seed-mean curve picks ``split``'s best step (module docstring), or None
    when the set logs no such metric with a value."""
    if select.startswith("eval/"):
        candidates: Sequence[str] = (select,)
    elif select == AUTO:
        candidates = [f"eval/{split}/{m}" for m in PRIMARY_METRICS]
    else:
        candidates = (f"eval/{split}/{select}",)
    for key in candidates:
        steps, mean = _mean_curve(runs, key)
        if steps.size and not np.all(np.isnan(mean)):
            return key
    return None


def summarize_group(
    runs: Sequence[an.Run], select: str = AUTO, sets: Sequence[str] | None = None
) -> dict[str, Any]:
    """Per evaluation set: its best step (the max of its seed-mean selection curve), the metric
    that chose it, and its ``REPORTED_METRICS`` at that step and at the final step."""
    row: dict[str, Any] = {"seeds": len(runs), "final_step": None}
    finals = []
    for split in eval_sets(runs) if sets is None else sets:
        key = selection_key(runs, split, select)
        if key is None:
            continue
        steps, mean = _mean_curve(runs, key)
        best_step, final_step = int(steps[an.best_index(mean)]), int(steps[-1])
        finals.append(final_step)
        row[f"best_step/{split}"] = best_step
        row[f"select/{split}"] = key.removeprefix(f"eval/{split}/")
        for metric in REPORTED_METRICS:
            k = f"eval/{split}/{metric}"
            ks, kv = an.seed_curves(runs, k)
            for tag, at in (("best", best_step), ("final", final_step)):
                if at in ks.tolist():
                    m, s = an.mean_std(kv[:, ks.tolist().index(at)])
                    row[f"{k}@{tag}"] = (float(m), float(s))
    if finals:
        row["final_step"] = max(finals)
    return row


def results_rows(
    groups: Mapping[str, Sequence[an.Run]], select: str = AUTO
) -> list[dict[str, Any]]:
    sets = eval_sets([r for runs in groups.values() for r in runs])
    return [{"group": g, **summarize_group(runs, select, sets)} for g, runs in groups.items()]


def first_reach_rows(
    groups: Mapping[str, Sequence[an.Run]], reference: str, key: str = an.HELDOUT_SCORE
) -> list[dict[str, Any]]:
    ref_steps, ref_vals = an.seed_curves(groups[reference], key)
    if ref_steps.size == 0:
        raise ValueError(f"reference group {reference!r} logged no {key}")
    ref_mean, _ = an.mean_std(ref_vals)
    target, ref_final = float(ref_mean[-1]), int(ref_steps[-1])
    rows = []
    for g, runs in groups.items():
        steps, vals = an.seed_curves(runs, key)
        mean = an.mean_std(vals)[0] if steps.size else np.zeros(0)
        hit = an.first_reach(steps, mean, target)
        rows.append(
            {
                "group": g,
                "reference": reference,
                "target": target,
                "reference_final_step": ref_final,
                "first_reach_step": hit,
                "ratio": (hit / ref_final) if hit is not None and ref_final else None,
            }
        )
    return rows


def pool_rows(groups: Mapping[str, Sequence[an.Run]]) -> tuple[list[dict], list[dict]]:
    """(end-of-training counts mean ± 95 % CI over seeds, seed-mean counts per step) for groups
    whose runs logged pool events."""
    summary, dynamics = [], []
    for g, runs in groups.items():
        per_seed = []
        for run in runs:
            dyn = an.run_pool_dynamics(run)
            if dyn["step"].size and dyn["added"][-1] > 0:
                per_seed.append(dyn)
        if not per_seed:
            continue
        row: dict[str, Any] = {"group": g, "seeds": len(per_seed)}
        for k in ("added", "active", "retired"):
            row[k] = _ci([float(d[k][-1]) for d in per_seed])
        summary.append(row)
        common = set(per_seed[0]["step"].tolist())
        for d in per_seed[1:]:
            common &= set(d["step"].tolist())
        for step in sorted(common):
            r = {"group": g, "step": step}
            for k in ("added", "active", "retired"):
                r[k] = float(np.mean([d[k][d["step"].tolist().index(step)] for d in per_seed]))
            dynamics.append(r)
    return summary, dynamics


def all_fail_rows(
    groups: Mapping[str, Sequence[an.Run]], keys: Sequence[str] = an.ALL_FAIL_KEYS
) -> list[dict]:
    """Per group: the mean over training steps of the all-failure rate per seed (the first of
    ``keys`` the run logs: every method's ``task/all_fail_groups``, else ARISE's own from runs
    that predate it), then mean ± 95 % CI over seeds; also per third of training (ARISE: "the
    largest gap early in training")."""
    rows = []
    for g, runs in groups.items():
        per_seed: dict[str, list[float]] = {"all": [], "early": [], "middle": [], "late": []}
        for run in runs:
            steps, vals = next(
                (got for key in keys if (got := run.series(key))[0].size), run.series(keys[0])
            )
            keep = steps >= 1
            steps, vals = steps[keep], vals[keep]
            if steps.size == 0:
                continue
            per_seed["all"].append(float(np.mean(vals)))
            last = int(run.config.get("train", {}).get("steps", steps[-1]))
            bounds = an.stage_bounds(max(last, 3))
            for name, (lo, hi) in zip(("early", "middle", "late"), bounds):
                sel = (steps >= lo) & (steps <= hi)
                per_seed[name].append(float(np.mean(vals[sel])) if sel.any() else float("nan"))
        if not per_seed["all"]:
            continue
        row: dict[str, Any] = {"group": g, "seeds": len(per_seed["all"])}
        for name, v in per_seed.items():
            row[name] = _ci(v)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ protocol tables

PROTOCOL_METRICS = ("pass_rate", "oracle", "env_mean/pass_rate", "score")
ENV_KEY = re.compile(r"^eval/heldout/env/([^/]+)/pass_rate$")


def _ci(values: Sequence[float]) -> tuple[float, float]:
    m, half, _ = an.mean_ci95(values)
    return m, half


def _finals(runs: Sequence[an.Run], key: str) -> dict[int, float]:
    """{seed: value at that run's final logged step} (runs without the key left out)."""
    out = {}
    for i, run in enumerate(runs):
        got = an.final_value(run, key)
        if got is not None:
            seed = an.run_seed(run)
            out[i if seed is None else seed] = got[1]
    return out


def incomplete_runs(groups: Mapping[str, Sequence[an.Run]]) -> list[str]:
    """The runs whose last logged step is below their config's ``train.steps``, as
    ``"<run dir> (step s of n)"``: a final-step table would mix them with finished runs."""
    return [
        f"{run.path} ({short})"
        for runs in groups.values()
        for run in runs
        if (short := an.stopped_short(run)) is not None
    ]


def final_rows(groups: Mapping[str, Sequence[an.Run]]) -> list[dict[str, Any]]:
    """Per group: each evaluation set's PROTOCOL_METRICS at each run's final step, mean ± CI."""
    sets = eval_sets([r for runs in groups.values() for r in runs])
    rows = []
    for g, runs in groups.items():
        row: dict[str, Any] = {"group": g, "seeds": len(runs)}
        steps = [an.final_value(r, f"eval/{s}/score") for r in runs for s in sets]
        row["final_step"] = max((x[0] for x in steps if x is not None), default=None)
        for split in sets:
            for metric in PROTOCOL_METRICS:
                vals = _finals(runs, f"eval/{split}/{metric}")
                if vals:
                    row[f"{split}/{metric}"] = _ci(list(vals.values()))
        rows.append(row)
    return rows


def _at_step(runs: Sequence[an.Run], key: str, step: int) -> dict[int, float]:
    """{seed: value of ``key`` at ``step``} over the runs that logged it there."""
    out = {}
    for i, run in enumerate(runs):
        steps, vals = run.series(key)
        hit = np.flatnonzero(steps == step)
        if hit.size:
            seed = an.run_seed(run)
            out[i if seed is None else seed] = float(vals[hit[0]])
    return out


def rise_rows(groups: Mapping[str, Sequence[an.Run]]) -> list[dict[str, Any]]:
    """Per group: each held-out metric at step 0 (the policy RL starts from, evaluated before
    the first update) and its change to the final step on each seed, mean ± 95 % CI, with the
    number of seeds on which it rose."""
    rows = []
    for g, runs in groups.items():
        row: dict[str, Any] = {"group": g, "seeds": len(runs)}
        for metric in PROTOCOL_METRICS:
            key = f"eval/heldout/{metric}"
            start, final = _at_step(runs, key, 0), _finals(runs, key)
            seeds = sorted(set(start) & set(final))
            if not seeds:
                continue
            d = [final[k] - start[k] for k in seeds]
            row[f"{metric}/start"] = _ci([start[k] for k in seeds])
            row[f"{metric}/change"] = _ci(d)
            row[f"{metric}/rose"] = sum(x > 0 for x in d)
            row[f"{metric}/pairs"] = len(seeds)
        rows.append(row)
    return rows


def env_rows(groups: Mapping[str, Sequence[an.Run]]) -> list[dict[str, Any]]:
    """Per group: each environment's held-out pass rate at the final step, mean ± CI."""
    rows = []
    for g, runs in groups.items():
        envs = sorted({m.group(1) for r in runs for k in r.keys() if (m := ENV_KEY.match(k))})
        row: dict[str, Any] = {"group": g, "seeds": len(runs)}
        for env in envs:
            row[env] = _ci(list(_finals(runs, f"eval/heldout/env/{env}/pass_rate").values()))
        rows.append(row)
    return rows


def paired_rows(
    groups: Mapping[str, Sequence[an.Run]], reference: str, metrics: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Per group other than ``reference``: (group − reference) at the final step on each seed
    both ran, mean ± 95 % CI over those pairs, and the number of pairs where the group is ahead."""
    keys = metrics or [f"eval/heldout/{m}" for m in PROTOCOL_METRICS]
    rows = []
    for g, runs in groups.items():
        if g == reference:
            continue
        row: dict[str, Any] = {"group": g, "reference": reference}
        for key in keys:
            a, b = _finals(runs, key), _finals(groups[reference], key)
            seeds = sorted(set(a) & set(b))
            if not seeds:
                continue
            d = [a[k] - b[k] for k in seeds]
            m, half = _ci(d)
            row[key] = (m, half)
            row[f"{key}/pairs"] = len(seeds)
            row[f"{key}/ahead"] = sum(x > 0 for x in d)
        rows.append(row)
    return rows


def calibration_rows(groups: Mapping[str, Sequence[an.Run]]) -> list[dict[str, Any]]:
    """Per group: the calibration pass before RL (rubric_rl/pre_rl/calibration.py) on the fixed
    probe set, mean ± CI over seeds; groups whose runs wrote none are left out."""
    from rubric_rl.pre_rl import calibration

    rows = []
    for g, runs in groups.items():
        figs = []
        for run in runs:
            try:
                figs.append(calibration.read(run.path))
            except FileNotFoundError:
                continue
        if not figs:
            continue
        row: dict[str, Any] = {"group": g, "seeds": len(figs)}
        for arm in ("unguided", "guided"):
            for k in ("task_pass_rate", "all_fail_groups"):
                vals = [f[arm][k] for f in figs if arm in f]
                if vals:
                    row[f"{arm}/{k}"] = _ci(vals)
        row["never_met"] = _ci([len(f["never_met"]) for f in figs])
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ training dynamics

# HarnessRL's training dynamics (benchmarks/protocol_harness.md), one value per run, then mean ±
# CI over seeds: (label, key, how). ``("last", f)``: the mean over the run's steps above
# (1 - f)·train.steps; ``("window", lo, hi)``: over steps in (lo·T, hi·T]; ``"final"``: the
# value at the final step (cumulative metrics).
ALL_STEPS = ("window", 0.0, 1.0)
DYNAMICS = (
    ("blind", "failure/blind", ("last", 0.1)),
    ("saturated", "failure/saturated", ("last", 0.1)),
    ("spurious", "failure/spurious", ("last", 0.1)),
    ("agree", "failure/agree", ("last", 0.1)),
    ("seed rubric: blind", "failure/seed/blind", ("last", 0.1)),
    ("seed rubric: saturated", "failure/seed/saturated", ("last", 0.1)),
    ("seed rubric: spurious", "failure/seed/spurious", ("last", 0.1)),
    ("seed rubric: agree", "failure/seed/agree", ("last", 0.1)),
    ("reversal rate", "harness/reversal_rate", "final"),
    # The end of the third quarter (cap 1): the seed's step 350 of 500.
    # Over the step's drawn tasks (``harness/guidance/unguided_share`` is over the whole bank).
    ("unguided share at 70 %", "harness/guidance/drawn_unguided_share", ("window", 2 / 3, 0.75)),
    ("fields per task (peak)", "harness/guidance/drawn_fields_per_task", "max"),
    # RISED's (benchmarks/protocol_rised.md), means over steps 1-T.
    ("candidate zero-variance share", "rised/select/candidates/zero_variance_frac", ALL_STEPS),
    ("selected zero-variance share", "rised/select/selected/zero_variance_frac", ALL_STEPS),
    ("pool mean variance", "rised/select/candidates/variance_mean", ALL_STEPS),
    ("selected mean variance", "rised/select/selected/variance_mean", ALL_STEPS),
    ("SD context share", "sd/context_frac", ALL_STEPS),
    ("SD KL", "train/sd/kl", ALL_STEPS),
    ("anti-pattern share of envs", "rised/anti/env_share", ALL_STEPS),
    # ARISE-RL's: means over the steps that log them (generator figures on generator
    # steps; Δr regions where a memory was measured: the seed's Fig. 5 72.1 / 19.6 / 8.3 %).
    ("generator format rate", "arise_rl/generator/fmt_rate", ALL_STEPS),
    ("generator tool rate", "arise_rl/generator/tool_rate", ALL_STEPS),
    ("generator difficulty rate", "arise_rl/generator/difficulty_rate", ALL_STEPS),
    ("generator R_G", "arise_rl/generator/r_g", ALL_STEPS),
    ("Δr above τ", "arise_rl/rgsed/above", ALL_STEPS),
    ("Δr within ±τ", "arise_rl/rgsed/within", ALL_STEPS),
    ("Δr below −τ", "arise_rl/rgsed/below", ALL_STEPS),
    ("gate-active share", "arise_rl/rgsed/gate_active_frac", ALL_STEPS),
    # Per role (Fig. 5 is per group: every step has the same number of groups, each with a
    # measured Δr, so the mean of the steps' shares is the share of groups), the placebo arm's
    # beside the real one, and the effective λ (λ0 × gate × schedule; share above 0.5 λ0).
    *(
        (f"{role} {label}", f"arise_rl/rgsed/{role}/{key}", ALL_STEPS)
        for role in ("solver", "generator")
        for label, key in (
            ("Δr", "delta_r"),
            ("placebo Δr", "placebo_delta_r"),
            ("Δr above τ", "above"),
            ("Δr within ±τ", "within"),
            ("Δr below −τ", "below"),
            ("placebo above τ", "placebo_above"),
            ("placebo below −τ", "placebo_below"),
            ("λ", "lambda_mean"),
            ("λ > 0.5 λ0", "lambda_active_frac"),
        )
    ),  # fmt: skip
    ("pool: generated tasks (last)", "arise_rl/pool/generated", "final"),
)
COST_KEY = "time/step"
COST_SPLIT = ("harness/time/critic", "harness/time/attributor_proposer", "harness/time/memory")
# The step's stages, median seconds over steps >= 2 (where a ratio comes from: more rollouts,
# longer prompts, a teacher's forward).
COST_STAGES = ("time/rollout", "time/train", "time/teacher")
# The guided rollouts' share of the step's prompt tokens (an upper bound on their extra cost).
GUIDED_SHARE = "harness/guidance/prompt_token_share"
# A step's role where a method has two (ARISE-RL: 1 = generator step, 0 = solver step).
ROLE_KEY, ROLES = "arise_rl/generator_phase", {"generator": 1.0, "solver": 0.0}


def _run_steps(run: an.Run) -> int | None:
    want = run.config.get("train", {}).get("steps")
    return int(want) if want is not None else None


def cycle_rows(groups: Mapping[str, Sequence[an.Run]]) -> list[dict[str, Any]]:
    """ARISE-RL's per-cycle table (the seed's Table 3 shape): per group and cycle c,
    the solver's held-out pass rate and oracle at the cycle's last step (the last evaluation at
    or before it) and the frozen base policy's single-shot pass rate on the fresh generated tasks
    of the cycle's refresh (``arise_rl/pool/base_pass_rate``, the seed's Fig. 4), mean ± CI over
    seeds. Groups whose runs have no ``arise_rl`` config section are left out."""
    rows = []
    for g, runs in groups.items():
        cfgs = [r.config.get("arise_rl") for r in runs]
        if not runs or any(c is None for c in cfgs) or runs[0].config.get("method") != "arise_rl":
            continue
        a = cfgs[0]
        length = int(a["generator_steps"]) + int(a["solver_steps"])
        for c in range(1, int(a["cycles"]) + 1):
            row: dict[str, Any] = {"group": g, "seeds": len(runs), "cycle": c, "step": c * length}
            refresh = (c - 1) * length + int(a["generator_steps"]) + 1
            for name, key, at in (
                ("pass_rate", "eval/heldout/pass_rate", c * length),
                ("oracle", "eval/heldout/oracle", c * length),
                ("base_pass_rate", "arise_rl/pool/base_pass_rate", refresh),
            ):
                vals = []
                for run in runs:
                    steps, v = run.series(key)
                    keep = steps <= at
                    if name == "base_pass_rate":
                        keep = steps == at
                    if keep.any():
                        vals.append(float(v[keep][-1]))
                if vals:
                    row[name] = _ci(vals)
            rows.append(row)
    return rows


def dynamics_value(run: an.Run, key: str, how: Any) -> float | None:
    """One run's value of a DYNAMICS entry, or None when the run does not log ``key`` there."""
    steps, vals = run.series(key)
    if not steps.size:
        return None
    if how == "final":
        return float(vals[-1])
    if how == "max":
        return float(np.nanmax(vals))
    total = _run_steps(run) or int(steps.max())
    if how[0] == "last":
        keep = steps > (1.0 - how[1]) * total
    elif how[0] == "window":
        keep = (steps > how[1] * total) & (steps <= how[2] * total)
    else:
        raise ValueError(f"dynamics_value: unknown reduction {how!r}")
    return float(np.nanmean(vals[keep])) if keep.any() else None


def dynamics_rows(groups: Mapping[str, Sequence[an.Run]]) -> list[dict[str, Any]]:
    """Per group: every DYNAMICS entry its runs log, mean ± 95 % CI over seeds."""
    rows = []
    for g, runs in groups.items():
        row: dict[str, Any] = {"group": g, "seeds": len(runs)}
        for label, key, how in DYNAMICS:
            vals = [v for r in runs if (v := dynamics_value(r, key, how)) is not None]
            if vals:
                row[label] = _ci(vals)
        rows.append(row)
    return rows


def step_cost(run: an.Run) -> dict[str, float]:
    """Median seconds per step over steps >= 2 (step 1 holds compilation and any cold start),
    and each harness cost part as a fraction of the mean step."""
    steps, secs = run.series(COST_KEY)
    keep = steps >= 2
    if not keep.any():
        return {}
    out = {"s/step": float(np.median(secs[keep]))}
    mean_step = float(np.mean(secs[keep]))
    for key in COST_SPLIT:
        s, v = run.series(key)
        k = s >= 2
        if k.any():
            out[key.rsplit("/", 1)[-1]] = float(np.sum(v[k]) / (mean_step * k.sum()))
    s, v = run.series(GUIDED_SHARE)
    if (s >= 2).any():
        out["guided_prompt_tokens"] = float(np.mean(v[s >= 2]))
    for key in COST_STAGES:
        s, v = run.series(key)
        if (s >= 2).any():
            out[_stage(key)] = float(np.median(v[s >= 2]))
    s, role = run.series(ROLE_KEY)
    if s.size:
        by_step = dict(zip(s.tolist(), role.tolist(), strict=True))
        for name, flag in ROLES.items():
            sel = [
                x for st, x in zip(steps, secs, strict=True) if st >= 2 and by_step.get(st) == flag
            ]
            if sel:
                out[f"{name}_s/step"] = float(np.median(sel))
    return out


def _stage(key: str) -> str:
    return key.rsplit("/", 1)[-1] + "_s"


COST_PARTS = (
    "s/step", *(k.rsplit("/", 1)[-1] for k in COST_SPLIT), "guided_prompt_tokens",
    *(_stage(k) for k in COST_STAGES),
)  # fmt: skip
# Only runs that log ROLE_KEY have these; the table shows them only where some group does.
ROLE_PARTS = tuple(f"{r}_s/step" for r in ROLES)


def cost_rows(groups: Mapping[str, Sequence[an.Run]], reference: str) -> list[dict[str, Any]]:
    """Per group: median s/step, its ratio to ``reference`` paired by seed, and the harness cost
    split (fractions of the step), mean ± 95 % CI over seeds."""
    ref = {an.run_seed(r): step_cost(r).get("s/step") for r in groups[reference]}
    rows = []
    for g, runs in groups.items():
        row: dict[str, Any] = {"group": g, "seeds": len(runs)}
        costs = {an.run_seed(r): step_cost(r) for r in runs}
        for part in (*COST_PARTS, *ROLE_PARTS):
            vals = [c[part] for c in costs.values() if part in c]
            if vals:
                row[part] = _ci(vals)
        ratios = [c["s/step"] / ref[k] for k, c in costs.items() if "s/step" in c and ref.get(k)]
        if ratios:
            row["ratio"] = _ci(ratios)
            row["pairs"] = len(ratios)
        for r in ROLES:
            part = f"{r}_s/step"
            rs = [c[part] / ref[k] for k, c in costs.items() if part in c and ref.get(k)]
            if rs:
                row[f"{r}_ratio"] = _ci(rs)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ output


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in row.items():
        if isinstance(v, tuple):
            out[f"{k}_mean"], out[f"{k}_ci95"] = v  # the 95 % CI half-width, not a std
        else:
            out[k] = v
    return out


def write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    flat = [_flat(r) for r in rows]
    fields: list[str] = []
    for r in flat:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        for r in flat:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(lines)


def results_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """One column block per evaluation set: its best step (and, when the groups differ, the
    metric that chose it), then each reported metric at that best step and at the final step."""
    sets = _in_order({k.split("/", 1)[1] for r in rows for k in r if k.startswith("best_step/")})
    header, columns = ["group", "seeds"], []
    for split in sets:
        chosen = {r[f"select/{split}"] for r in rows if f"select/{split}" in r}
        same = len(chosen) == 1
        header.append(f"{split} best step" + (f" ({next(iter(chosen))})" if same else ""))
        columns.append(("step", split, same))
        for metric in REPORTED_METRICS:
            k = f"eval/{split}/{metric}"
            if any(f"{k}@best" in r or f"{k}@final" in r for r in rows):
                header += [f"{split}/{metric} (best)", f"{split}/{metric} (final)"]
                columns.append(("metric", k, same))
    body = []
    for r in rows:
        line = [r["group"], str(r["seeds"])]
        for kind, name, same in columns:
            if kind == "metric":
                line += [fmt(*r.get(f"{name}@{t}", (None,))) for t in ("best", "final")]
            elif f"best_step/{name}" not in r:
                line.append("–")
            else:
                step = str(r[f"best_step/{name}"])
                line.append(step if same else f"{step} ({r[f'select/{name}']})")
        body.append(line)
    return markdown_table(header, body)


def _select_title(select: str) -> str:
    if select.startswith("eval/"):
        return f"{select} selects one best step of the seed-mean curve for every set"
    what = " pass_rate, else score" if select == AUTO else f" {select}"
    return f"each evaluation set's best step: the max of its seed-mean{what}"


def _cells(row: Mapping[str, Any], keys: Sequence[str], digits: int = 3) -> list[str]:
    return [fmt(*row[k], digits=digits) if k in row else "–" for k in keys]


def report(
    groups: Mapping[str, Sequence[an.Run]],
    out_dir: str,
    *,
    reference: str | None = None,
    match: str | None = None,
    select: str = FINAL,
    allow_incomplete: bool = False,
    dynamics: bool = False,
    cost_reference: str | None = None,
) -> str:
    """Writes every table (see the module docstring); returns the Markdown. A run that stopped
    before its ``train.steps`` is an error naming it (resume it: ``launch/sweep.py`` resumes
    unfinished runs) unless ``allow_incomplete``: then it is tabulated at its last step and
    listed under the tables."""
    short = incomplete_runs(groups)
    if short and not allow_incomplete:
        raise ValueError(
            "launch/aggregate.py: runs stopped before their config's train.steps: "
            + "; ".join(short)
            + ". Resume them (launch/sweep.py resumes unfinished runs; or rubric_rl.launch "
            "--resume), or pass --allow-incomplete to tabulate them at their last step"
        )
    os.makedirs(out_dir, exist_ok=True)
    names = list(groups)
    final = final_rows(groups)
    write_csv(os.path.join(out_dir, "results.csv"), final)
    md = [
        "# Results (benchmarks/protocol.md)",
        "",
        "Each run's final step (pre-registered; nothing chosen on a test set); mean ± 95 % CI "
        "over seeds (Student's t, ddof = 1).",
        "",
    ]
    sets = _in_order({k.split("/", 1)[0] for r in final for k in r if "/" in k} - {"final"})
    for split in sets:
        keys = [f"{split}/{m}" for m in PROTOCOL_METRICS]
        if not any(k in r for r in final for k in keys):
            continue
        md += [f"## {split}", ""]
        body = [
            [r["group"], str(r["seeds"]), str(r["final_step"])] + _cells(r, keys) for r in final
        ]
        md += [markdown_table(["group", "seeds", "step", *PROTOCOL_METRICS], body), ""]
    rise = rise_rows(groups)
    if any(len(r) > 2 for r in rise):
        write_csv(os.path.join(out_dir, "rise.csv"), rise)
        md += ["## Over the warm start (held-out: step 0 -> final step, per seed)", ""]
        body = []
        for r in rise:
            line = [r["group"], str(r["seeds"])]
            for m in PROTOCOL_METRICS:
                if f"{m}/start" not in r:
                    line += ["–", "–"]
                    continue
                rose = f" ({r[f'{m}/rose']}/{r[f'{m}/pairs']})"
                line += [fmt(*r[f"{m}/start"], digits=3), fmt(*r[f"{m}/change"], digits=3) + rose]
            body.append(line)
        head = [x for m in PROTOCOL_METRICS for x in (f"{m} at 0", f"{m} change")]
        md += [markdown_table(["group", "seeds", *head], body), ""]
    envs = env_rows(groups)
    env_names = sorted({k for r in envs for k in r if k not in ("group", "seeds")})
    if env_names:
        write_csv(os.path.join(out_dir, "env.csv"), envs)
        md += ["## Held-out pass rate per environment (final step)", ""]
        body = [[r["group"], str(r["seeds"])] + _cells(r, env_names) for r in envs]
        md += [markdown_table(["group", "seeds", *env_names], body), ""]
    if reference is not None:
        ref = resolve_group(reference, names)
        paired = paired_rows(groups, ref)
        write_csv(os.path.join(out_dir, "paired.csv"), paired)
        keys = [f"eval/heldout/{m}" for m in PROTOCOL_METRICS]
        md += [f"## Paired differences to {ref} (held-out, final step; seed k with seed k)", ""]
        body = []
        for r in paired:
            line = [r["group"]]
            for k in keys:
                line.append(
                    f"{fmt(*r[k], digits=3)} ({r[f'{k}/ahead']}/{r[f'{k}/pairs']})"
                    if k in r
                    else "–"
                )
            body.append(line)
        md += [markdown_table(["group − " + ref, *PROTOCOL_METRICS], body)]
        md += ["", "(n/m): pairs where the group is ahead, of the pairs both arms ran.", ""]
    if match is not None:
        ref = resolve_group(match, names, "--match")
        reach = first_reach_rows(groups, ref, key=HELDOUT_PASS)
        write_csv(os.path.join(out_dir, "first_reach.csv"), reach)
        md += [
            f"## First step reaching {ref}'s final held-out pass rate ({reach[0]['target']:.3f})",
            "",
        ]
        body = [
            [
                r["group"],
                str(r["first_reach_step"]),
                str(r["reference_final_step"]),
                fmt(r["ratio"], digits=3),
            ]
            for r in reach
        ]
        md += [markdown_table(["group", "first reach step", "reference final step", "ratio"], body)]
        md.append("")
    if select != FINAL:
        res = results_rows(groups, select)
        write_csv(os.path.join(out_dir, "best.csv"), res)
        md += [f"## Exploration, not the protocol ({_select_title(select)}; mean ± std)", ""]
        md += [results_markdown(res), ""]
    pool, pool_over_steps = pool_rows(groups)
    if pool:
        write_csv(os.path.join(out_dir, "pool.csv"), pool)
        write_csv(os.path.join(out_dir, "pool_dynamics.csv"), pool_over_steps)
        md += ["## ARISE pool at the end of training (controllers/arise.jsonl)", ""]
        body = [
            [r["group"], str(r["seeds"])]
            + [fmt(*r[k], digits=1) for k in ("added", "active", "retired")]
            for r in pool
        ]
        md += [markdown_table(["group", "seeds", "added", "active", "retired"], body), ""]
    fails = all_fail_rows(groups)
    if fails:
        write_csv(os.path.join(out_dir, "all_fail.csv"), fails)
        md += [
            f"## All-failure rollout groups ({' or '.join(an.ALL_FAIL_KEYS)}, mean over steps)",
            "",
        ]
        names3 = ("all", "early", "middle", "late")
        body = [
            [r["group"], str(r["seeds"])] + [fmt(*r[k], digits=3) for k in names3] for r in fails
        ]
        md += [markdown_table(["group", "seeds", *names3], body), ""]
    cal = calibration_rows(groups)
    if cal:
        write_csv(os.path.join(out_dir, "calibration.csv"), cal)
        keys = [
            "unguided/task_pass_rate",
            "guided/task_pass_rate",
            "unguided/all_fail_groups",
            "guided/all_fail_groups",
            "never_met",
        ]
        md += ["## Calibration before RL (fixed probe set, step 1)", ""]
        body = [[r["group"], str(r["seeds"])] + _cells(r, keys) for r in cal]
        md += [markdown_table(["group", "seeds", *keys], body), ""]
    if dynamics:
        dyn = dynamics_rows(groups)
        write_csv(os.path.join(out_dir, "dynamics.csv"), dyn)
        labels = [label for label, _, _ in DYNAMICS if any(label in r for r in dyn)]
        md += ["## Training dynamics (benchmarks/protocol_harness.md; mean ± 95 % CI)", ""]
        body = [[r["group"], str(r["seeds"])] + _cells(r, labels) for r in dyn]
        md += [markdown_table(["group", "seeds", *labels], body), ""]
    cycles = cycle_rows(groups)
    if cycles:
        write_csv(os.path.join(out_dir, "cycles.csv"), cycles)
        keys = ["pass_rate", "oracle", "base_pass_rate"]
        md += ["## ARISE-RL per cycle (held-out at its end; base policy at its refresh)", ""]
        body = [[r["group"], str(r["seeds"]), str(r["cycle"])] + _cells(r, keys) for r in cycles]
        md += [markdown_table(["group", "seeds", "cycle", *keys], body), ""]
    if cost_reference is not None:
        ref = resolve_group(cost_reference, names, "--cost-reference")
        cost = cost_rows(groups, ref)
        write_csv(os.path.join(out_dir, "cost.csv"), cost)
        parts = ["s/step", "ratio", *COST_PARTS[1:]]
        if any(part in row for row in cost for part in ROLE_PARTS):
            parts += [*ROLE_PARTS, *(f"{r}_ratio" for r in ROLES)]
        md += [f"## Per-step cost (median {COST_KEY} over steps >= 2; ratio to {ref} by seed)", ""]
        body = [[r["group"], str(r["seeds"])] + _cells(r, parts) for r in cost]
        md += [markdown_table(["group", "seeds", *parts], body), ""]
    if short:
        md += ["## Incomplete runs (tabulated at their last step: --allow-incomplete)", ""]
        md += [f"- {x}" for x in short] + [""]
    text = "\n".join(md)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "root",
        help="sweep root holding <group>/seed<k> run directories, or a packed archive "
        "(<name>.tar.xz, launch/packed.py)",
    )
    p.add_argument("--out", default=None, help="output directory (default: the root)")
    p.add_argument("--reference", default=None, help="group the paired differences are to")
    p.add_argument("--match", default=None, help="group whose final held-out pass rate to reach")
    p.add_argument(
        "--select",
        default=FINAL,
        help="final (the protocol: no selection), or also report a best step for exploration: "
        "auto (pass_rate, else score), a metric name (score, oracle, env_mean/pass_rate), or a "
        "full key (eval/validation/pass_rate) choosing one step for every set",
    )
    p.add_argument("--groups", nargs="*", default=None, help="only these groups")
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="tabulate runs that stopped before train.steps at their last step (listed in "
        "results.md) instead of stopping with an error naming them",
    )
    p.add_argument(
        "--dynamics",
        action="store_true",
        help="the training-dynamics table (failure proportions at the end, reversal rate, "
        "unguided share: benchmarks/protocol_harness.md)",
    )
    p.add_argument(
        "--cost-reference", default=None, help="group the per-step cost ratio is to (by seed)"
    )
    p.add_argument(
        "--allow-config-diff",
        action="append",
        default=[],
        metavar="KEY",
        help="a config key (or prefix) that may differ between a group's runs; any other "
        "difference beyond train.seed is an error naming the keys",
    )
    args = p.parse_args(argv)
    if packed.is_packed(args.root) and args.out is None:
        p.error(f"{args.root} is a packed archive: --out is required (tables go next to a tree)")
    with packed.opened(args.root) as root:
        for path, why in an.skipped_dirs(root):
            print(f"skipped {os.path.relpath(path, root)}: {why}", file=sys.stderr)
        groups = load_groups(root, args.groups)
        try:
            check_groups(groups, args.allow_config_diff)
        except GroupError as e:
            print(f"aggregate: {e}", file=sys.stderr)
            return 1
        text = report(
            groups,
            args.out or root,
            reference=args.reference,
            match=args.match,
            select=args.select,
            allow_incomplete=args.allow_incomplete,
            dynamics=args.dynamics,
            cost_reference=args.cost_reference,
        )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
