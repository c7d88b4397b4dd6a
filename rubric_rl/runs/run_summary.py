"""The closing summary of a run: what changed between the first and the last evaluation.

``python -m rubric_rl.launch`` prints it when training ends; for any run directory:

    python -m rubric_rl.runs.run_summary runs/arise-default-<time>

The per-step log lines show the seed rubric's score (``heldout 48.3 | ood 43.4``), which is what
GRPO's reward is and the cheapest thing to log, but not what a method is judged on: the protocol's
primary metrics are the held-out **task pass rate** (the share of tasks whose response meets every
stated requirement, by the task verifier) and the **oracle** (a hidden quality score no method
trains on). A run can raise both while its seed-rubric score falls, which read from the log lines
alone looks like the run got worse. So the summary puts the primary metrics first, the seed-rubric
score beside them marked secondary, each at the start (the first evaluation: step 0 is the warm
start before any update) and at the end, with the change.

Only what ``metrics.jsonl`` holds is shown: a set or metric the run did not evaluate is left out,
and a run with no evaluation says so.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rubric_rl import analysis

# (metric under eval/<set>/, label, digits, what it is, primary?) in the order shown.
ROWS = (
    ("pass_rate", "task pass rate", 3, "tasks meeting every requirement", True),
    ("oracle", "oracle quality", 3, "hidden quality, never a reward", True),
    ("score", "seed-rubric score", 1, "of 100: the step lines' heldout", False),
)
MAIN_SET = "heldout"


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    steps, vals = analysis.metric_series(rows, key)
    return [(int(s), float(v)) for s, v in zip(steps, vals, strict=True)]


def _count(rate: float, n: int | None) -> str:
    """``22/512`` when ``rate`` is a whole number of ``n`` tasks (a pass rate over n tasks)."""
    if not n or not math.isfinite(rate):
        return ""
    k = rate * n
    return f" ({round(k)}/{n})" if abs(k - round(k)) < 1e-6 else ""


def eval_sets(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The evaluation sets with at least one of ``ROWS``' metrics: heldout, validation, ood, then
    any other, sorted."""
    found = {
        k.split("/")[1]
        for r in rows
        for k in r
        if k.startswith("eval/") and k.count("/") == 2 and k.split("/")[2] in {m[0] for m in ROWS}
    }
    known = analysis.EVAL_SPLITS
    return [s for s in known if s in found] + sorted(found - set(known))


def closing_summary(
    rows: Sequence[Mapping[str, Any]],
    *,
    method: str | None = None,
    steps: int | None = None,
    eval_n: int | None = None,
    workdir: str | None = None,
    greedy: bool = False,
) -> str:
    """The summary's text from ``metrics.jsonl`` rows (module docstring). ``eval_n``: tasks per
    evaluation set, to show a pass rate as a count too; ``steps``: the run's ``train.steps``;
    ``greedy``: the evaluation decodes greedily (``eval.greedy``)."""
    last = max((int(r["step"]) for r in rows), default=0)
    head = f"Run summary: {method or 'run'}, {last} of {steps if steps is not None else last} steps"
    head += f" ({workdir})" if workdir else ""
    sets = eval_sets(rows)
    if not sets:
        return head + "\n  no evaluation was logged (eval.every, eval.at_start)."
    lines = [head]
    main = MAIN_SET if MAIN_SET in sets else sets[0]
    series = {m: _series(rows, f"eval/{main}/{m}") for m, *_ in ROWS}
    shown = [row for row in ROWS if series[row[0]]]
    first = min(series[m][0][0] for m, *_ in shown)
    end = max(series[m][-1][0] for m, *_ in shown)
    lines.append(
        f"{main} set{', greedy' if greedy else ''}: start = step {first}"
        + (" (the warm start, before any update)" if first == 0 else "")
        + f", end = step {end}"
    )
    lines.append(f"  {'':<31}{'start':>16}{'end':>16}{'change':>9}")
    for metric, label, digits, what, primary in shown:
        (s0, v0), (s1, v1) = series[metric][0], series[metric][-1]
        tag = "primary" if primary else "secondary"
        start = f"{v0:.{digits}f}" + (_count(v0, eval_n) if metric == "pass_rate" else "")
        stop = f"{v1:.{digits}f}" + (_count(v1, eval_n) if metric == "pass_rate" else "")
        change = f"{v1 - v0:+.{digits}f}" if s1 != s0 else "–"
        lines.append(f"  {label + ' (' + tag + ')':<31}{start:>16}{stop:>16}{change:>9}  {what}")
    for other in sets:
        if other == main:
            continue
        parts = []
        for metric, label, digits, _, _ in ROWS:
            s = _series(rows, f"eval/{other}/{metric}")
            if s:
                parts.append(f"{label} {s[0][1]:.{digits}f} -> {s[-1][1]:.{digits}f}")
        lines.append(f"  {other} set: " + ", ".join(parts))
    lines.append(
        "  A method is judged on the primary metrics (benchmarks/protocol.md); the seed-rubric\n"
        "  score is a proxy that can fall while they rise."
    )
    return "\n".join(lines)


def summarize_run(workdir: str) -> str:
    """``closing_summary`` of a run directory (its ``metrics.jsonl`` and ``config.json``)."""
    saved = analysis.read_config(workdir)  # the run's config.json: any run's, older ones too
    return closing_summary(
        analysis.read_metrics(workdir),
        method=saved.get("method"),
        steps=saved.get("train", {}).get("steps"),
        eval_n=saved.get("eval", {}).get("n"),
        workdir=workdir,
        greedy=bool(saved.get("eval", {}).get("greedy", False)),
    )


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print(f"usage: python -m rubric_rl.runs.run_summary <run directory>; got {argv[1:]}")
        return 2
    print(summarize_run(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
