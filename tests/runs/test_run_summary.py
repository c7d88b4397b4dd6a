"""rubric_rl/runs/run_summary.py on a fixed metrics.jsonl: the closing summary shows the held-out
pass rate and oracle (primary) beside the seed-rubric score (secondary), first and last
evaluation."""

import json

from rubric_rl.runs import run_summary

# The quick start's shape: evaluations at step 0 (the warm start) and every 10 steps to 70; the
# seed-rubric score falls while the pass rate (22 -> 28 of 512 tasks) and the oracle rise.
HELDOUT = {0: (22 / 512, 0.424, 49.6), 10: (0.05, 0.43, 49.0), 70: (28 / 512, 0.479, 47.0)}
OOD = {0: (0.0117, 0.415, 45.8), 10: (0.012, 0.42, 45.0), 70: (0.0273, 0.456, 42.9)}


def _rows():
    rows = []
    for step in range(71):
        row = {"step": step, "reward/mean": 0.5, "time/step": 1.0}
        if step in HELDOUT:
            for split, table in (("heldout", HELDOUT), ("ood", OOD)):
                p, o, s = table[step]
                row.update(
                    {f"eval/{split}/pass_rate": p, f"eval/{split}/oracle": o,
                     f"eval/{split}/score": s, f"eval/{split}/criteria/case": 0.5}
                )  # fmt: skip
        rows.append(row)
    return rows


def _write_run(d, rows, config):
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    with open(d / "metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(d)


CONFIG = {"method": "arise", "train": {"steps": 70}, "eval": {"n": 512, "greedy": True}}


def test_summary_of_a_fixed_run(tmp_path):
    run = _write_run(tmp_path / "run", _rows(), CONFIG)
    got = run_summary.summarize_run(run).splitlines()
    assert got == [
        f"Run summary: arise, 70 of 70 steps ({run})",
        "heldout set, greedy: start = step 0 (the warm start, before any update), end = step 70",
        "                                            start             end   change",
        "  task pass rate (primary)         0.043 (22/512)  0.055 (28/512)   +0.012"
        "  tasks meeting every requirement",
        "  oracle quality (primary)                  0.424           0.479   +0.055"
        "  hidden quality, never a reward",
        "  seed-rubric score (secondary)              49.6            47.0     -2.6"
        "  of 100: the step lines' heldout",
        "  ood set: task pass rate 0.012 -> 0.027, oracle quality 0.415 -> 0.456, "
        "seed-rubric score 45.8 -> 42.9",
        "  A method is judged on the primary metrics (benchmarks/protocol.md); the seed-rubric",
        "  score is a proxy that can fall while they rise.",
    ]


def test_a_replayed_step_keeps_its_last_row_and_a_torn_line_is_ignored(tmp_path):
    rows = _rows()
    stale = dict(rows[70], **{"eval/heldout/pass_rate": 0.5})  # written before a kill, replayed
    run = _write_run(tmp_path / "run", rows[:70] + [stale, rows[70]], CONFIG)
    with open(f"{run}/metrics.jsonl", "a") as f:
        f.write('{"step": 71, "eval/heldout/pass_')
    assert "0.043 (22/512)  0.055 (28/512)" in run_summary.summarize_run(run)


def test_first_evaluation_after_step_0_and_missing_metrics(tmp_path):
    # eval.at_start off: the start is the first evaluated step, not called the warm start; a
    # domain without an oracle has no oracle row; a pass rate that is no whole count of n tasks
    # is shown without one.
    rows = [
        {k: v for k, v in r.items() if "oracle" not in k and "/ood/" not in k}
        for r in _rows()
        if r["step"] > 0
    ]
    text = run_summary.closing_summary(rows, method="grpo", steps=100, eval_n=7)
    lines = text.splitlines()
    assert lines[0] == "Run summary: grpo, 70 of 100 steps"
    assert lines[1] == "heldout set: start = step 10, end = step 70"
    assert lines[3].startswith("  task pass rate (primary)                  0.050           0.055")
    assert lines[4].startswith("  seed-rubric score (secondary)              49.0            47.0")
    assert "oracle" not in text and "ood set" not in text


def test_no_evaluation_and_one_evaluation():
    rows = [{"step": s, "reward/mean": 0.1} for s in range(4)]
    assert run_summary.closing_summary(rows, method="grpo", steps=3).splitlines() == [
        "Run summary: grpo, 3 of 3 steps",
        "  no evaluation was logged (eval.every, eval.at_start).",
    ]
    one = [{"step": 0, "eval/heldout/pass_rate": 0.25, "eval/heldout/score": 50.0}]
    lines = run_summary.closing_summary(one, eval_n=8).splitlines()
    # One evaluation: start and end are the same row, and no change is claimed.
    assert lines[3].split()[4:9] == ["0.250", "(2/8)", "0.250", "(2/8)", "–"]
