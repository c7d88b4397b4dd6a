"""Results tables over a sweep's run directories (``<root>/<group>/seed<k>``, see sweep.py).

    python launch/aggregate.py runs/arise_sweep --reference arise-outcome_only [--out DIR]

Writes to ``--out`` (default ``<root>``):
- ``results.md`` — every table below, Markdown;
- ``results.csv`` — one row per group: for each evaluation set ``<set>`` in the runs (every
  ``eval/<set>/...`` prefix: heldout, ood, any other), its best step ``best_step/<set>``, the
  metric that chose it ``select/<set>``, and mean and std over seeds of its metrics
  (``eval/<set>/{score,pass_rate,oracle,env_mean/pass_rate}``, those logged) at that BEST step
  and at the FINAL step (``final_step``: the last evaluated step);
- ``first_reach.csv`` — the first step at which each group's seed-mean held-out score reaches the
  reference group's final seed-mean held-out score (ARISE: "reaches the step-150 performance of
  outcome-only RL by step 50"), and its ratio to the reference's final step;
- ``pool.csv`` / ``pool_dynamics.csv`` — ARISE pool counts (added / active / retired) at the end
  and over steps, from ``controllers/arise.jsonl`` (else the ``arise/pool/*`` metrics); groups
  whose pool never held an entry (outcome-only, GRPO) are left out;
- ``all_fail.csv`` — the rate of all-failure rollout groups (``arise/task/all_fail_groups``)
  over training and per early / middle / late third.

Protocol: a group's curves are averaged over seeds on the steps every seed logged. Each evaluation
set has its own BEST checkpoint: the step maximising that set's seed-MEAN primary metric (selecting
per seed would pick each seed's lucky step), and the set's metrics are reported at that step.
``--select`` chooses the metric: ``auto`` (default) = the set's ``pass_rate`` when it logs one
(DESIGN §7: the task verifier's pass rate is primary), else its ``score``; a metric name
(``score``, ``oracle``, ``env_mean/pass_rate``, ...) = that metric of each set; a full key
(``eval/heldout/score``) = one best step for every set, chosen on that key (the protocol that
reports OOD at the held-out best, untouched by OOD numbers).
Spread is the sample std over seeds (ddof = 1); with one seed it is undefined and omitted.
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

from rubric_rl import analysis as an

AUTO = "auto"
PRIMARY_METRICS = ("pass_rate", "score")  # --select auto: the first one a set logs
REPORTED_METRICS = ("score", "pass_rate", "oracle", "env_mean/pass_rate")
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


def resolve_group(name: str, groups: Sequence[str]) -> str:
    """An exact group name, else the unique group containing ``name``."""
    if name in groups:
        return name
    hits = [g for g in groups if name in g]
    if len(hits) != 1:
        raise ValueError(f"--reference {name!r} matches {hits or 'no group'}; groups: {groups}")
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
    """(end-of-training counts mean ± std over seeds, seed-mean counts per step) for groups whose
    runs logged pool events."""
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
            m, s = an.mean_std(np.array([d[k][-1] for d in per_seed], np.float64))
            row[k] = (float(m), float(s))
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


def all_fail_rows(groups: Mapping[str, Sequence[an.Run]], key: str = an.ALL_FAIL) -> list[dict]:
    """Per group: the mean over training steps of ``key`` per seed, then mean ± std over seeds;
    also per third of training (ARISE: "the largest gap early in training")."""
    rows = []
    for g, runs in groups.items():
        per_seed: dict[str, list[float]] = {"all": [], "early": [], "middle": [], "late": []}
        for run in runs:
            steps, vals = run.series(key)
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
            m, s = an.mean_std(np.array(v))
            row[name] = (float(m), float(s))
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ output


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in row.items():
        if isinstance(v, tuple):
            out[f"{k}_mean"], out[f"{k}_std"] = v
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


def report(
    groups: Mapping[str, Sequence[an.Run]],
    out_dir: str,
    *,
    reference: str | None = None,
    select: str = AUTO,
) -> str:
    """Writes every table (see the module docstring); returns the Markdown."""
    os.makedirs(out_dir, exist_ok=True)
    res = results_rows(groups, select)
    write_csv(os.path.join(out_dir, "results.csv"), res)
    md = [f"# Results ({_select_title(select)})", ""]
    md += [results_markdown(res), ""]
    if reference is not None:
        ref = resolve_group(reference, list(groups))
        reach = first_reach_rows(groups, ref)
        write_csv(os.path.join(out_dir, "first_reach.csv"), reach)
        md += [
            f"## First step reaching {ref}'s final held-out score ({reach[0]['target']:.2f})",
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
    pool, dynamics = pool_rows(groups)
    if pool:
        write_csv(os.path.join(out_dir, "pool.csv"), pool)
        write_csv(os.path.join(out_dir, "pool_dynamics.csv"), dynamics)
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
        md += [f"## All-failure rollout groups ({an.ALL_FAIL}, mean over steps)", ""]
        names = ("all", "early", "middle", "late")
        body = [
            [r["group"], str(r["seeds"])] + [fmt(*r[k], digits=3) for k in names] for r in fails
        ]
        md += [markdown_table(["group", "seeds", *names], body), ""]
    text = "\n".join(md)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("root", help="sweep root holding <group>/seed<k> run directories")
    p.add_argument("--out", default=None, help="output directory (default: the root)")
    p.add_argument("--reference", default=None, help="group whose final held-out score to reach")
    p.add_argument(
        "--select",
        default=AUTO,
        help="metric choosing each evaluation set's best step: auto (pass_rate, else score), a "
        "metric name (score, oracle, env_mean/pass_rate), or a full key (eval/heldout/score) "
        "choosing one step for every set",
    )
    p.add_argument("--groups", nargs="*", default=None, help="only these groups")
    args = p.parse_args(argv)
    groups = load_groups(args.root, args.groups)
    text = report(groups, args.out or args.root, reference=args.reference, select=args.select)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
