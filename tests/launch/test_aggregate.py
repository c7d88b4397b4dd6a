"""launch/aggregate.py and rubric_rl/analysis/ on synthetic run directories with known numbers."""

import csv
import json
import math
import os

import numpy as np
import pytest

from launch import aggregate
from rubric_rl import analysis as an

EVAL_STEPS = (0, 50, 100, 150)
# group -> seed -> (held-out scores, OOD scores at EVAL_STEPS, all-fail base, pool (added, retired))
RUNS = {
    "arise": {
        0: ([40, 60, 70, 72], [30, 35, 40, 45], 0.2, (3, 1)),
        1: ([42, 62, 74, 70], [30, 37, 44, 41], 0.3, (4, 2)),
        2: ([38, 61, 72, 71], [30, 36, 42, 43], 0.4, (2, 0)),
    },
    "outcome": {
        0: ([40, 50, 55, 60], [30, 31, 32, 33], 0.5, None),
        1: ([40, 52, 57, 62], [30, 33, 34, 35], 0.5, None),
    },
}


def write_run(d, heldout, ood, fail_base, pool, steps=150):
    os.makedirs(os.path.join(d, "controllers"), exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        seed = an.SEED_DIR.match(os.path.basename(d))
        json.dump({"method": "x", "train": {"steps": steps, "seed": int(seed.group(1))}}, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step in range(steps + 1):
            row = {"step": step}
            if step >= 1:
                # all-failure rate: base + 0.3 in the first third (ARISE: largest gap early)
                row.update(
                    {"reward/mean": 0.5, an.ALL_FAIL: fail_base + (0.3 if step <= 50 else 0)}
                )
            if step in EVAL_STEPS:
                k = EVAL_STEPS.index(step)
                row.update({an.HELDOUT_SCORE: heldout[k], "eval/ood/score": ood[k]})
                row["eval/heldout/pass_rate"] = heldout[k] / 100
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 151, "reward/me')  # a torn last line (killed mid-write) is ignored
    if pool:
        added, retired = pool
        with open(os.path.join(d, "controllers", "arise.jsonl"), "w") as f:
            for i in range(added):
                ev = {"step": 10 + i, "entry": f"arise-{i:04d}", "event": "add", "from": None,
                      "to": "added", "evidence": {}}  # fmt: skip
                f.write(json.dumps(ev) + "\n")
            for i in range(retired):
                ev = {"step": 100 + i, "entry": f"arise-{i:04d}", "event": "retire",
                      "from": "added", "to": "retired", "evidence": {}}  # fmt: skip
                f.write(json.dumps(ev) + "\n")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("sweep")
    for group, seeds in RUNS.items():
        for seed, spec in seeds.items():
            write_run(str(r / group / f"seed{seed}"), *spec)
    return str(r)


def test_summary_uses_best_step_of_the_seed_mean_curve_per_set(root):
    groups = aggregate.load_groups(root)
    rows = {r["group"]: r for r in aggregate.results_rows(groups)}
    a = rows["arise"]
    # Held-out on its pass rate (score / 100 here), OOD (no pass rate) on its score. Held-out
    # seed-mean curve 40, 61, 72, 71 -> step 100 (per-seed bests would be 150, 100, 100); OOD
    # 30, 36, 42, 43 -> 150.
    assert (a["best_step/heldout"], a["best_step/ood"], a["final_step"]) == (100, 150, 150)
    assert (a["select/heldout"], a["select/ood"], a["seeds"]) == ("pass_rate", "score", 3)
    assert a[f"{an.HELDOUT_SCORE}@best"] == pytest.approx((72.0, 2.0))
    assert a[f"{an.HELDOUT_SCORE}@final"] == pytest.approx((71.0, 1.0))
    assert a["eval/ood/score@best"] == pytest.approx((43.0, 2.0))  # at the OOD best
    assert a["eval/ood/score@final"] == pytest.approx((43.0, 2.0))
    o = rows["outcome"]
    assert o["best_step/heldout"] == o["best_step/ood"] == 150
    assert o[f"{an.HELDOUT_SCORE}@best"] == pytest.approx((61.0, math.sqrt(2)))
    # A full key chooses one step for every set: OOD reported at the held-out best.
    one = {r["group"]: r for r in aggregate.results_rows(groups, an.HELDOUT_SCORE)}["arise"]
    assert one["best_step/heldout"] == one["best_step/ood"] == 100
    assert one["eval/ood/score@best"] == pytest.approx((42.0, 2.0))
    assert one["select/ood"] == an.HELDOUT_SCORE


T2, T1 = 4.303, 12.706  # Student's t 0.975 quantiles, 2 and 1 degrees of freedom


def test_report_files_exact(root, tmp_path):
    groups = aggregate.load_groups(root)
    text = aggregate.report(groups, str(tmp_path), reference="outcome", match="outcome")
    # Final step (150), mean ± 95 % CI: arise held-out 72, 70, 71 (s = 1, n = 3); outcome 60, 62.
    header = "| group | seeds | step | pass_rate | oracle | env_mean/pass_rate | score |"
    assert text.count(header) == 2  # heldout and ood
    ci_a, ci_o = T2 * 1.0 / math.sqrt(3), T1 * math.sqrt(2) / math.sqrt(2)
    assert (
        f"| arise | 3 | 150 | {0.71:.3f} ± {ci_a / 100:.3f} | – | – | 71.000 ± {ci_a:.3f} |" in text
    )
    assert f"| outcome | 2 | 150 | 0.610 ± {ci_o / 100:.3f} | – | – | 61.000 ± {ci_o:.3f} |" in text
    # Paired on seeds 0 and 1: 72 - 60, 70 - 62 -> 10 ± t1·√8/√2, both pairs ahead.
    paired = f"| arise | 0.100 ± {T1 * math.sqrt(8) / math.sqrt(2) / 100:.3f} (2/2) |"
    assert paired in text
    # Over the warm start: arise's held-out pass rate 0.40, 0.42, 0.38 at step 0 and
    # 0.72, 0.70, 0.71 at 150 -> start 0.40 (s 0.02), change 0.32, 0.28, 0.33 (all three rose).
    s_change = np.std([0.32, 0.28, 0.33], ddof=1)
    rise = (
        f"| arise | 3 | 0.400 ± {T2 * 0.02 / math.sqrt(3):.3f} | "
        f"0.310 ± {T2 * s_change / math.sqrt(3):.3f} (3/3) |"
    )
    assert rise in text
    # first reach of outcome's final pass rate 0.61: arise at step 50 (ratio 1/3), outcome at 150
    assert "| arise | 50 | 150 | 0.333 |" in text and "| outcome | 150 | 150 | 1.000 |" in text
    # pool: added 3,4,2; active 2,2,2; retired 1,2,0 (s = 1 each where they vary)
    assert f"| arise | 3 | 3.0 ± {ci_a:.1f} | 2.0 ± 0.0 | 1.0 ± {ci_a:.1f} |" in text
    # all-failure: bases 0.2/0.3/0.4; + 0.1 overall, + 0.3 early, + 0 later
    h = f"{ci_a / 10:.3f}"
    assert f"| arise | 3 | 0.400 ± {h} | 0.600 ± {h} | 0.300 ± {h} | 0.300 ± {h} |" in text
    assert "| outcome | 2 | 0.600 ± 0.000 | 0.800 ± 0.000 | 0.500 ± 0.000 | 0.500 ± 0.000 |" in text
    assert "Exploration" not in text  # no best-step table unless --select asks for one
    with open(tmp_path / "results.csv") as f:
        res = {r["group"]: r for r in csv.DictReader(f)}
    assert float(res["arise"]["heldout/score_mean"]) == pytest.approx(71.0)
    assert float(res["arise"]["heldout/score_ci95"]) == pytest.approx(ci_a)  # the CI half-width
    assert float(res["arise"]["ood/score_mean"]) == pytest.approx(43.0)
    assert res["arise"]["final_step"] == "150"
    with open(tmp_path / "paired.csv") as f:
        pair = {r["group"]: r for r in csv.DictReader(f)}
    assert float(pair["arise"]["eval/heldout/score_mean"]) == pytest.approx(10.0)
    assert pair["arise"]["eval/heldout/score/ahead"] == "2"
    with open(tmp_path / "first_reach.csv") as f:
        reach = {r["group"]: r for r in csv.DictReader(f)}
    assert reach["arise"]["first_reach_step"] == "50"
    assert float(reach["arise"]["target"]) == pytest.approx(0.61)
    with open(tmp_path / "pool_dynamics.csv") as f:
        dyn = [r for r in csv.DictReader(f) if r["group"] == "arise"]
    at = {int(r["step"]): r for r in dyn}
    assert float(at[9]["added"]) == 0 and float(at[11]["added"]) == pytest.approx(2.0)  # 2,2,2
    assert float(at[150]["retired"]) == pytest.approx(1.0)


def test_t_quantiles_and_confidence_intervals():
    # Table values and the expansion beyond it (exact t_{0.975}: df 40 -> 2.0211, 100 -> 1.9840).
    assert an.t_critical_975(1) == 12.706 and an.t_critical_975(4) == 2.776
    assert an.t_critical_975(40) == pytest.approx(2.0211, abs=1e-3)
    assert an.t_critical_975(100) == pytest.approx(1.9840, abs=1e-3)
    assert abs(an.t_critical_975(31) - an.t_critical_975(30)) < 0.01  # continuous at the seam
    v = [0.2, 0.5, 0.4, 0.3, 0.6]
    m, half, n = an.mean_ci95(v)
    assert (m, n) == (pytest.approx(0.4), 5)
    assert half == pytest.approx(2.776 * np.std(v, ddof=1) / math.sqrt(5))
    assert math.isnan(an.mean_ci95([0.3])[1]) and an.mean_ci95([float("nan")])[2] == 0
    with pytest.raises(ValueError, match="df"):
        an.t_critical_975(0)


def test_stage_means_are_thirds_of_training():
    assert an.stage_bounds(150) == [(1, 50), (51, 100), (101, 150)]
    assert an.stage_bounds(12) == [(1, 4), (5, 8), (9, 12)]
    with pytest.raises(ValueError):
        an.stage_bounds(2)


def test_reference_must_resolve(root):
    groups = aggregate.load_groups(root)
    assert aggregate.resolve_group("outc", list(groups)) == "outcome"
    with pytest.raises(ValueError, match="matches no group"):
        aggregate.report(groups, "/tmp/unused-agg", reference="grpo")


def test_mean_std_and_first_reach_match_numpy():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(4, 7))
    m, s = an.mean_std(v)
    np.testing.assert_allclose(m, v.mean(0))
    np.testing.assert_allclose(s, v.std(0, ddof=1))
    assert np.isnan(an.mean_std(v[:1])[1]).all()  # one seed: std undefined
    steps = np.arange(0, 70, 10)
    for k in range(7):
        target = v[0, k]
        hit = np.flatnonzero(v[0] >= target)[0]
        assert an.first_reach(steps, v[0], target) == steps[hit]
    assert an.first_reach(steps, v[0], v[0].max() + 1) is None
    assert an.best_index(np.array([1.0, 3.0, np.nan, 3.0])) == 1  # earliest tie, NaN skipped


def test_seed_curves_use_common_steps(tmp_path):
    for k, n in ((0, 150), (1, 100)):  # seed 1 stopped at step 100
        write_run(str(tmp_path / f"seed{k}"), *RUNS["arise"][k][:3], None, steps=n)
    runs = [an.load_run(str(tmp_path / f"seed{k}")) for k in (0, 1)]
    steps, vals = an.seed_curves(runs, an.HELDOUT_SCORE)
    assert steps.tolist() == [0, 50, 100]
    assert vals.tolist() == [[40, 60, 70], [42, 62, 74]]


def test_pool_dynamics_replay():
    ev = [
        {"step": 2, "entry": "a", "event": "add", "from": None, "to": "added"},
        {"step": 2, "entry": "b", "event": "add", "from": None, "to": "added"},
        {"step": 3, "entry": "a", "event": "activate", "from": "added", "to": "active"},
        {"step": 5, "entry": "a", "event": "refine", "from": "active", "to": "active"},
        {"step": 6, "entry": "a", "event": "hide", "from": "active", "to": "hidden"},
        {"step": 8, "entry": "a", "event": "retire", "from": "hidden", "to": "retired"},
    ]
    d = an.pool_dynamics(ev, range(1, 10))
    assert d["added"].tolist() == [0, 2, 2, 2, 2, 2, 2, 2, 2]
    assert d["active"].tolist() == [0, 2, 2, 2, 2, 2, 2, 1, 1]
    assert d["retired"].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert d["skill_active"].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert d["hidden"].tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert d["refined"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]


def test_stage_heatmap_blank_and_zero_cells():
    p = an.SAMPLER_PREFIX
    rows = [
        {"step": 1},  # nothing scored yet: not part of the mean
        {"step": 2, f"{p}list/counting": 1.0},
        {"step": 3, f"{p}list/counting": 0.5, f"{p}format/ordering": 0.5},
        {"step": 4, f"{p}format/lexical": 1.0},  # outside the stage
    ]
    types, caps, P = an.stage_heatmap(rows, 1, 3)
    assert types == ["format", "list"] and caps == ["counting", "lexical", "ordering"]
    expect = np.array([[np.nan, np.nan, 0.25], [0.75, np.nan, np.nan]])
    np.testing.assert_allclose(P, expect)


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        an.read_jsonl(str(path))


def test_final_pool_state_reads_last_checkpoint(tmp_path):
    for step, n in ((4, 1), (8, 2)):
        d = tmp_path / "checkpoints" / str(step) / "run_state"
        d.mkdir(parents=True)
        pool = {"entries": [{"id": f"arise-{i:04d}"} for i in range(n)], "next_id": n}
        (d / "metadata").write_text(json.dumps({"controllers": {"arise": {"pool": pool}}}))
    (tmp_path / "checkpoints" / "12.orbax-checkpoint-tmp-3").mkdir()  # unfinished: ignored
    assert an.final_pool_state(str(tmp_path))["next_id"] == 2
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        an.final_pool_state(str(tmp_path / "nowhere"))


def test_pool_counts_fall_back_to_metrics(tmp_path):
    d = tmp_path / "g" / "seed0"
    d.mkdir(parents=True)
    keys = an.POOL_METRICS
    rows = [{"step": 0, an.HELDOUT_SCORE: 1.0}]
    for step, (added, live, retired) in enumerate([(1, 1, 0), (3, 2, 1), (4, 2, 2)], start=1):
        rows.append({"step": step, keys["added"]: added, keys["active"]: live,
                     keys["retired"]: retired, keys["refined"]: 0, keys["skill_active"]: 0,
                     keys["hidden"]: 0, an.HELDOUT_SCORE: float(step)})  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dyn = an.run_pool_dynamics(an.load_run(str(d)))
    assert dyn["step"].tolist() == [1, 2, 3] and dyn["added"].tolist() == [1, 3, 4]
    assert dyn["active"].tolist() == [1, 2, 2] and dyn["retired"].tolist() == [0, 1, 2]
    summary, _ = aggregate.pool_rows(aggregate.load_groups(str(tmp_path)))
    (row,) = summary
    assert (row["group"], row["seeds"]) == ("g", 1)
    assert [row[k][0] for k in ("added", "active", "retired")] == [4.0, 2.0, 2.0]
    assert all(math.isnan(row[k][1]) for k in ("added", "active", "retired"))  # one seed


def test_groups_without_a_pool_are_left_out(root):
    summary, dynamics = aggregate.pool_rows(aggregate.load_groups(root))
    assert [r["group"] for r in summary] == ["arise"]
    assert {r["group"] for r in dynamics} == {"arise"}


# Hand-made runs where the held-out and OOD pass rates peak at different steps, the held-out
# score peaks elsewhere again, and a third set ("ifeval") logs only a score.
# seed -> key -> values at PASS_STEPS
PASS_STEPS = (0, 10, 20, 30, 40)
PASS_RUNS = {
    0: {
        "eval/heldout/pass_rate": [0.1, 0.3, 0.6, 0.5, 0.4],
        "eval/heldout/score": [10, 20, 30, 40, 50],
        "eval/heldout/oracle": [0.35, 0.37, 0.39, 0.41, 0.43],
        "eval/heldout/env_mean/pass_rate": [0.0, 0.2, 0.5, 0.4, 0.3],
        "eval/heldout/env/list/pass_rate": [0.0, 0.2, 0.5, 0.4, 0.3],
        "eval/heldout/criteria/c1": [0.5] * 5,
        "eval/ood/pass_rate": [0.0, 0.1, 0.2, 0.4, 0.3],
        "eval/ood/score": [5, 6, 7, 8, 9],
    },
    1: {
        "eval/heldout/pass_rate": [0.1, 0.7, 0.5, 0.4, 0.4],
        "eval/heldout/score": [10, 20, 30, 40, 60],
        "eval/heldout/oracle": [0.37, 0.39, 0.41, 0.43, 0.45],
        "eval/heldout/env_mean/pass_rate": [0.0, 0.6, 0.4, 0.3, 0.3],
        "eval/heldout/env/list/pass_rate": [0.0, 0.6, 0.4, 0.3, 0.3],
        "eval/heldout/criteria/c1": [0.5] * 5,
        "eval/ood/pass_rate": [0.0, 0.1, 0.3, 0.2, 0.3],
        "eval/ood/score": [6, 7, 8, 9, 10],
    },
}
IFEVAL = {0: {0: 50.0, 40: 40.0}, 1: {0: 52.0, 40: 44.0}}


@pytest.fixture()
def pass_root(tmp_path):
    for seed, series in PASS_RUNS.items():
        d = tmp_path / "grpo" / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"train": {"steps": 40}}))
        rows = []
        for step in range(41):
            row = {"step": step, "time/eval": 1.0}
            if step in PASS_STEPS:
                row.update({k: v[PASS_STEPS.index(step)] for k, v in series.items()})
            if step in IFEVAL[seed]:
                row["eval/ifeval/score"] = IFEVAL[seed][step]
            rows.append(row)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path)


def test_each_set_picks_its_best_step_on_its_pass_rate(pass_root, tmp_path):
    groups = aggregate.load_groups(pass_root)
    assert aggregate.eval_sets(groups["grpo"]) == ["heldout", "ood", "ifeval"]
    (r,) = aggregate.results_rows(groups)
    # Held-out pass rate seed-mean .1 .5 .55 .45 .4 -> step 20 (seed 1 alone: step 10; the
    # held-out score alone: step 40). OOD 0 .1 .25 .3 .3 -> step 30 (earliest of the tie).
    # ifeval logs only a score: 51 at step 0, 42 at step 40 -> step 0.
    assert (r["best_step/heldout"], r["best_step/ood"], r["best_step/ifeval"]) == (20, 30, 0)
    assert (r["select/heldout"], r["select/ood"], r["select/ifeval"]) == (
        "pass_rate",
        "pass_rate",
        "score",
    )
    assert r["final_step"] == 40
    want = {
        "eval/heldout/pass_rate@best": (0.55, math.sqrt(0.005)),
        "eval/heldout/pass_rate@final": (0.4, 0.0),
        "eval/heldout/score@best": (30.0, 0.0),
        "eval/heldout/score@final": (55.0, math.sqrt(50)),
        "eval/heldout/oracle@best": (0.40, math.sqrt(0.0002)),
        "eval/heldout/env_mean/pass_rate@best": (0.45, math.sqrt(0.005)),
        "eval/heldout/env_mean/pass_rate@final": (0.3, 0.0),
        "eval/ood/pass_rate@best": (0.3, math.sqrt(0.02)),
        "eval/ood/score@best": (8.5, math.sqrt(0.5)),
        "eval/ood/score@final": (9.5, math.sqrt(0.5)),
        "eval/ifeval/score@best": (51.0, math.sqrt(2)),
        "eval/ifeval/score@final": (42.0, math.sqrt(8)),
    }
    for k, v in want.items():
        assert r[k] == pytest.approx(v), k
    # Per-environment and per-criterion numbers are not table columns; env_mean is.
    assert not any("/env/" in k or "/criteria/" in k for k in r)
    assert "eval/ood/env_mean/pass_rate@best" not in r  # OOD logged none

    # --select: a metric name picks that metric of every set that logs it ...
    (by_score,) = aggregate.results_rows(groups, "score")
    assert (by_score["best_step/heldout"], by_score["best_step/ood"]) == (40, 40)
    (by_env,) = aggregate.results_rows(groups, "env_mean/pass_rate")
    assert by_env["best_step/heldout"] == 20 and "best_step/ood" not in by_env
    # ... and a full key one step for all of them.
    (one,) = aggregate.results_rows(groups, "eval/heldout/pass_rate")
    assert one["best_step/heldout"] == one["best_step/ood"] == one["best_step/ifeval"] == 20
    assert one["eval/ood/pass_rate@best"] == pytest.approx((0.25, math.sqrt(0.005)))
    assert "eval/ifeval/score@best" not in one  # ifeval was not evaluated at step 20

    text = aggregate.report(groups, str(tmp_path / "out"), select="auto")
    assert "heldout best step (pass_rate)" in text and "ood best step (pass_rate)" in text
    assert "ifeval best step (score)" in text and "heldout/env_mean/pass_rate (best)" in text
    explore = text[text.index("## Exploration") :]
    line = next(x for x in explore.splitlines() if x.startswith("| grpo |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["grpo", "2", "20"]
    assert cells[3:5] == ["30.00 ± 0.00", "55.00 ± 7.07"]  # heldout score (best), (final)
    with open(tmp_path / "out" / "best.csv") as f:
        (csv_row,) = list(csv.DictReader(f))
    assert (csv_row["best_step/heldout"], csv_row["best_step/ood"]) == ("20", "30")
    assert float(csv_row["eval/ood/pass_rate@best_mean"]) == pytest.approx(0.3)
    # The protocol's table: the final step (40), never a best one; per environment too.
    assert "| grpo | 2 | 40 | 0.400 ± 0.000 |" in text
    with open(tmp_path / "out" / "env.csv") as f:
        (env,) = list(csv.DictReader(f))
    assert float(env["list_mean"]) == pytest.approx(0.3)
    assert aggregate.main([pass_root, "--out", str(tmp_path / "cli"), "--select", "score"]) == 0
    with open(tmp_path / "cli" / "best.csv") as f:
        (cli,) = list(csv.DictReader(f))
    assert (cli["best_step/heldout"], cli["select/heldout"]) == ("40", "score")


def test_a_run_short_of_its_steps_is_named_not_averaged_in(tmp_path):
    r = tmp_path / "sweep"
    for seed in (0, 1):
        write_run(str(r / "arise" / f"seed{seed}"), *RUNS["arise"][seed])
    # seed 1 was killed at step 150 of 200: its last numbers are not a final step's
    with open(r / "arise" / "seed1" / "config.json", "w") as f:
        json.dump({"method": "x", "train": {"steps": 200, "seed": 1}}, f)
    groups = aggregate.load_groups(str(r))
    assert aggregate.incomplete_runs(groups) == [f"{r / 'arise' / 'seed1'} (step 150 of 200)"]
    with pytest.raises(ValueError, match=r"seed1 \(step 150 of 200\).*--allow-incomplete"):
        aggregate.report(groups, str(tmp_path / "out"))
    text = aggregate.report(groups, str(tmp_path / "out"), allow_incomplete=True)
    assert "## Incomplete runs" in text and f"- {r / 'arise' / 'seed1'} (step 150 of 200)" in text


def test_match_error_names_the_match_flag(root):
    groups = aggregate.load_groups(root)
    with pytest.raises(ValueError, match="^--match 'grpo' matches no group"):
        aggregate.report(groups, "/tmp/unused-agg", match="grpo")


def test_rise_counts_only_seeds_with_both_ends(tmp_path):
    r = tmp_path / "sweep"
    for seed in (0, 1, 2):
        write_run(str(r / "arise" / f"seed{seed}"), *RUNS["arise"][seed])
    # seed 2 has no step-0 evaluation (eval.at_start=False): it cannot say whether it rose
    path = r / "arise" / "seed2" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({k: v for k, v in first.items() if not k.startswith("eval/")})
    path.write_text("\n".join(lines) + "\n")
    (row,) = aggregate.rise_rows(aggregate.load_groups(str(r)))
    assert row["pass_rate/pairs"] == 2 and row["seeds"] == 3
    text = aggregate.report(aggregate.load_groups(str(r)), str(tmp_path / "out"))
    assert f"({row['pass_rate/rose']}/2)" in text


def test_all_failure_groups_read_every_methods_key(tmp_path):
    r = tmp_path / "sweep"
    d = r / "grpo" / "seed0"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"train": {"steps": 6}}))
    rows = [{"step": s, "task/all_fail_groups": 0.9 - 0.1 * s} for s in range(7)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    (row,) = aggregate.all_fail_rows(aggregate.load_groups(str(r)))
    assert row["group"] == "grpo"
    assert row["all"][0] == pytest.approx(np.mean([0.9 - 0.1 * s for s in range(1, 7)]))
    assert row["early"][0] == pytest.approx(np.mean([0.8, 0.7]))


def _write_dynamics_run(d, steps, rows_of):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"train": {"steps": steps}}))
    rows = [{"step": s, **rows_of(s)} for s in range(1, steps + 1)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")


def test_dynamics_windows_final_values_and_paired_cost_ratio(tmp_path):
    r = tmp_path / "sweep"
    # 20 steps: "last 10 %" = steps 19-20; the 70 % window (2/3, 3/4] = steps 14-15.
    for seed, (base, sec) in enumerate([(0.1, 2.0), (0.3, 4.0)]):
        _write_dynamics_run(
            r / "harness" / f"seed{seed}",
            20,
            lambda s, b=base, t=sec: {
                "failure/blind": b + s / 100,
                "harness/reversal_rate": s / 1000,  # cumulative: the final value counts
                "harness/guidance/drawn_unguided_share": 0.0 if s <= 13 or s >= 16 else 0.5 + b,
                "time/step": 100.0 if s == 1 else t + (s % 2),  # step 1 (compile) left out
                "harness/time/critic": t / 2 + (s % 2) / 2,
                "harness/guidance/prompt_token_share": 0.0 if s == 1 else 0.1,
                "time/train": 50.0 if s == 1 else t / 4,
            },
        )
        _write_dynamics_run(
            r / "grpo" / f"seed{seed}",
            20,
            lambda s, t=sec: {"time/step": t / 2, "failure/blind": 0.5},
        )
    groups = aggregate.load_groups(str(r))
    rows = {row["group"]: row for row in aggregate.dynamics_rows(groups)}
    blind = [np.mean([b + 0.19, b + 0.20]) for b in (0.1, 0.3)]
    assert rows["harness"]["blind"][0] == pytest.approx(np.mean(blind))
    assert rows["harness"]["blind"][1] == pytest.approx(an.mean_ci95(blind)[1])
    assert rows["harness"]["reversal rate"][0] == pytest.approx(0.020)
    assert rows["harness"]["unguided share at 70 %"][0] == pytest.approx(np.mean([0.6, 0.8]))
    assert "reversal rate" not in rows["grpo"] and rows["grpo"]["blind"][0] == 0.5
    cost = {row["group"]: row for row in aggregate.cost_rows(groups, "grpo")}
    # medians over steps 2-20 of t + (s % 2): 10 even steps of 19 -> t
    assert cost["harness"]["s/step"][0] == pytest.approx(np.mean([2.0, 4.0]))
    assert cost["harness"]["ratio"][0] == pytest.approx(2.0)
    assert cost["harness"]["pairs"] == 2 and cost["grpo"]["ratio"][0] == pytest.approx(1.0)
    assert cost["harness"]["critic"][0] == pytest.approx(0.5)
    assert cost["harness"]["guided_prompt_tokens"][0] == pytest.approx(0.1)  # steps >= 2
    assert cost["harness"]["train_s"][0] == pytest.approx(np.mean([0.5, 1.0]))  # steps >= 2
    assert "train_s" not in cost["grpo"] and "teacher_s" not in cost["harness"]
    text = aggregate.report(groups, str(tmp_path / "out"), dynamics=True, cost_reference="grpo")
    assert "## Training dynamics" in text and "## Per-step cost" in text
    assert "generator_s/step" not in text  # no group logs a role: no role columns
    assert os.path.exists(tmp_path / "out" / "dynamics.csv")
    with pytest.raises(ValueError, match="--cost-reference"):
        aggregate.report(groups, str(tmp_path / "out"), cost_reference="nope")


def test_cost_by_role_for_arise_rl(tmp_path):
    r = tmp_path / "sweep"
    # 12 steps: generator steps 1-4 and 9-10 (10 s, 12 s), solver steps 5-8, 11-12 (2 s, 3 s);
    # step 1 (compile) is left out of every median.
    for seed, scale in enumerate([1.0, 2.0]):
        _write_dynamics_run(
            r / "arise_rl" / f"seed{seed}",
            12,
            lambda s, k=scale: {
                "arise_rl/generator_phase": 1.0 if s <= 4 or s in (9, 10) else 0.0,
                "time/step": k
                * (999.0 if s == 1 else (10.0 + 2 * (s > 4)) if s <= 4 or s in (9, 10) else 2.0),
            },
        )
        _write_dynamics_run(r / "solver" / f"seed{seed}", 12, lambda s, k=scale: {"time/step": k})
    groups = aggregate.load_groups(str(r))
    cost = {row["group"]: row for row in aggregate.cost_rows(groups, "solver")}
    # generator steps 2-4, 9-10: [10, 10, 10, 12, 12] -> median 10; solver steps: 2
    assert cost["arise_rl"]["generator_s/step"][0] == pytest.approx(np.mean([10.0, 20.0]))
    assert cost["arise_rl"]["solver_s/step"][0] == pytest.approx(np.mean([2.0, 4.0]))
    assert cost["arise_rl"]["generator_ratio"] == (pytest.approx(10.0), 0.0)
    assert cost["arise_rl"]["solver_ratio"] == (pytest.approx(2.0), 0.0)
    assert "generator_ratio" not in cost["solver"] and "solver_s/step" not in cost["solver"]
    text = aggregate.report(groups, str(tmp_path / "out"), cost_reference="solver")
    assert "generator_ratio" in text and "solver_ratio" in text


def test_rised_dynamics_are_means_over_every_step(tmp_path):
    r = tmp_path / "sweep"
    for seed, base in enumerate([0.5, 0.7]):
        _write_dynamics_run(
            r / "rised" / f"seed{seed}",
            10,
            lambda s, b=base: {
                "rised/select/candidates/zero_variance_frac": b + (s % 2) / 10,
                "rised/select/selected/variance_mean": s / 100,
                "rised/anti/env_share": 1.0 if s > 5 else 0.0,
            },
        )
    rows = {row["group"]: row for row in aggregate.dynamics_rows(aggregate.load_groups(str(r)))}
    row = rows["rised"]
    assert row["candidate zero-variance share"][0] == pytest.approx(np.mean([0.55, 0.75]))
    assert row["selected mean variance"][0] == pytest.approx(0.055)
    assert row["anti-pattern share of envs"][0] == pytest.approx(0.5)
    assert "blind" not in row and "SD KL" not in row


def test_arise_rl_per_cycle_table_and_dynamics(tmp_path):
    """ARISE-RL: held-out figures at each cycle's last step (the last evaluation at or before
    it), the base probe at each cycle's refresh step, Δr regions over the steps logging them."""
    r = tmp_path / "sweep"
    a = {"cycles": 2, "generator_steps": 2, "solver_steps": 3}  # cycle ends 5, 10; refresh 3, 8
    for seed, off in enumerate([0.0, 0.2]):
        d = r / "arise_rl" / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "config.json").write_text(
            json.dumps({"method": "arise_rl", "arise_rl": a, "train": {"steps": 10}})
        )
        rows = []
        for s in range(0, 11):
            row = {"step": s}
            if s % 2 == 0:  # evaluations at even steps only: cycle 1 reads step 4
                row.update({"eval/heldout/pass_rate": off + s / 100, "eval/heldout/oracle": 0.5})
            if s in (3, 8):
                row["arise_rl/pool/base_pass_rate"] = off + 0.5 - s / 100
            if s in (1, 2, 6, 7):
                row["arise_rl/rgsed/above"] = off + (0.5 if s < 5 else 0.7)
                role = "generator" if s in (1, 6) else "solver"
                row[f"arise_rl/rgsed/{role}/above"] = off + s / 10
                row[f"arise_rl/rgsed/{role}/placebo_delta_r"] = -off
                row[f"arise_rl/rgsed/{role}/lambda_mean"] = 0.1 * s
            rows.append(row)
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    groups = aggregate.load_groups(str(r))
    cyc = aggregate.cycle_rows(groups)
    assert [(x["cycle"], x["step"]) for x in cyc] == [(1, 5), (2, 10)]
    assert cyc[0]["pass_rate"][0] == pytest.approx(np.mean([0.04, 0.24]))
    assert cyc[1]["pass_rate"][0] == pytest.approx(np.mean([0.10, 0.30]))
    assert cyc[0]["base_pass_rate"][0] == pytest.approx(np.mean([0.47, 0.67]))
    assert cyc[1]["base_pass_rate"][0] == pytest.approx(np.mean([0.42, 0.62]))
    dyn = {row["group"]: row for row in aggregate.dynamics_rows(groups)}
    assert dyn["arise_rl"]["Δr above τ"][0] == pytest.approx(np.mean([0.6, 0.8]))
    # per role: the means over that role's steps
    assert dyn["arise_rl"]["generator Δr above τ"][0] == pytest.approx(np.mean([0.35, 0.55]))
    assert dyn["arise_rl"]["solver Δr above τ"][0] == pytest.approx(np.mean([0.45, 0.65]))
    assert dyn["arise_rl"]["solver placebo Δr"][0] == pytest.approx(-0.1)
    assert dyn["arise_rl"]["generator λ"][0] == pytest.approx(0.35)
    assert "solver Δr within ±τ" not in dyn["arise_rl"]  # not logged: no column
    text = aggregate.report(groups, str(tmp_path / "out"), dynamics=True)
    assert "## ARISE-RL per cycle" in text
    assert os.path.exists(tmp_path / "out" / "cycles.csv")


def _group(tmp_path, **seeds):
    """``<tmp>/runs/g/seed<k>`` runs of RUNS["arise"]'s numbers; ``seeds``: k -> config changes."""
    root = tmp_path / "runs"
    for k, change in seeds.items():
        k = int(k.removeprefix("s"))
        d = str(root / "g" / f"seed{k}")
        write_run(d, *RUNS["arise"][k % 3][:3], None)
        cfg = json.load(open(os.path.join(d, "config.json")))
        cfg.update(change)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return root


def test_a_group_of_mixed_methods_is_refused_listing_the_keys(tmp_path, capsys):
    root = _group(tmp_path, s0={"controllers": ["arise"]}, s1={"controllers": ["harness"]},
                  s2={"controllers": ["arise"], "optim": {"lr": 1e-4}})  # fmt: skip
    assert aggregate.main([str(root), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert (
        "  g: config controllers differs: seed0=['arise'], seed1=['harness'], seed2=['arise']\n"
        in err
    )
    # optim.lr is recorded by seed2 only (as a new option would be): nothing to compare it with.
    assert "optim.lr" not in err and not os.path.exists(tmp_path / "out" / "results.md")
    assert aggregate.main([str(root), "--out", str(tmp_path / "o2"), "--allow-config-diff",
                           "controllers"]) == 0  # fmt: skip


def test_per_seed_paths_cache_dirs_and_new_options_are_not_differences():
    def run(seed, **cfg):
        return an.Run(f"/r/g/seed{seed}", {"train": {"seed": seed}, **cfg}, ())

    runs = [
        run(0, frozen="runs/p/arise/seed0", warmstart={"cache_dir": "runs/ws"}, model="k3"),
        run(3, frozen="runs/p/arise/seed3", warmstart={"cache_dir": "/abs/ws"}, model="k3"),
    ]
    assert aggregate.config_differences(runs) == {}
    runs.append(run(4, frozen="runs/p/other/seed4", model="k3"))
    assert aggregate.config_differences(runs) == {
        "frozen": [("seed0", "runs/p/arise/seed0"), ("seed3", "runs/p/arise/seed3"),
                   ("seed4", "runs/p/other/seed4")]
    }  # fmt: skip


def test_a_run_copied_into_a_second_seed_is_refused(tmp_path, capsys):
    root = _group(tmp_path, s0={}, s1={})
    import shutil

    shutil.copytree(root / "g" / "seed0", root / "g" / "seed5")  # config says seed 0
    shutil.copytree(root / "g" / "seed1", root / "g" / "seed4")
    cfg = json.load(open(root / "g" / "seed4" / "config.json"))
    cfg["train"]["seed"] = 4
    json.dump(cfg, open(root / "g" / "seed4" / "config.json", "w"))
    assert aggregate.main([str(root), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "  g: seed5 records train.seed=0\n" in err
    assert "  g: seed4 has the same metrics as seed1 (one run twice?)\n" in err
    assert "  g: seed5 has the same metrics as seed0 (one run twice?)\n" in err


def test_every_skipped_directory_is_listed_with_why(tmp_path, capsys):
    root = _group(tmp_path, s0={}, s1={})
    (root / "g" / "seed2").mkdir()  # never logged a step
    (root / "g" / "seed0.replaced-20261205-230000-000000").mkdir()
    (root / "g" / "seed-1").mkdir()
    (root / "g" / "notes").mkdir()
    (root / "jax_cache").mkdir()
    assert aggregate.main([str(root), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if ln.startswith("skipped ")] == [
        "skipped g/notes: not a seed<k> directory",
        "skipped g/seed-1: a negative seed (sweep.py refuses them; not tabulated)",
        "skipped g/seed0.replaced-20261205-230000-000000: an earlier run set aside by sweep.py "
        "--force",
        "skipped g/seed2: no metrics.jsonl (the run never logged a step)",
        "skipped jax_cache: no seed<k> run directory in it",
    ]
