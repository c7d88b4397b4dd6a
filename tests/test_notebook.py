"""colabs/rubric_profiles.ipynb runs top to bottom (nbclient) on a run directory and prints the
expected summary numbers; its figures are written and non-empty.

The run directory is a synthetic one written here in the documented format (CONVENTIONS.md "Run
directory", controllers/arise.jsonl events). When ``RUBRIC_RL_SMOKE_RUN_DIR`` names a real ARISE
smoke run's directory, the notebook is also executed on it and checked against
``rubric_rl.analysis``'s numbers for that directory.
"""

import json
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from rubric_rl import analysis as an  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "colabs", "rubric_profiles.ipynb")
FIGURES = ("pool_dynamics.png", "rewards.png", "criteria.png", "sampling_heatmaps.png")
P = an.SAMPLER_PREFIX
EVENTS = [  # (step, entry, event, from, to)
    (2, "arise-0000", "add", None, "added"),
    (3, "arise-0001", "add", None, "added"),
    (4, "arise-0000", "activate", "added", "active"),
    (6, "arise-0000", "refine", "active", "active"),
    (7, "arise-0000", "hide", "active", "hidden"),
    (9, "arise-0000", "retire", "hidden", "retired"),
    (10, "arise-0002", "add", None, "added"),
    (11, "arise-0001", "activate", "added", "active"),
]
ALL_FAIL = [1, 1, 0.75, 0.75, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0, 0]  # mean 0.4792
SAMPLING = {  # stage_bounds(12) = (1-4), (5-8), (9-12)
    3: {"list/counting": 1.0},
    4: {"list/counting": 1.0},
    **{s: {"list/counting": 0.6, "list/ordering": 0.4} for s in (5, 6, 7, 8)},
    **{s: {"list/counting": 0.2, "format/formatting": 0.8} for s in (9, 10, 11, 12)},
}
FAILURE_CLASSES = ("blind", "saturated", "spurious", "agree")
FAILURE = {4: (0.4, 0.2, 0.3, 0.1), 8: (0.3, 0.2, 0.3, 0.2), 12: (0.1, 0.2, 0.25, 0.45)}
SEED_FAILURE = (0.5, 0.1, 0.3, 0.1)
# initial (steps 1-5) 0.8; trailing-5 means .76 .70 .60 .48 then .34 <= 0.4 at step 10
PRAISE = [0.8] * 5 + [0.6, 0.5, 0.3, 0.2, 0.1, 0.1, 0.1]
PRAISE_HALF_LIFE = 10  # diagnostics logged every 4 steps, seed rubric constant


def harness_row(step: int) -> dict:
    row = {f"harness/labels/{k}": v for k, v in
           zip(("blind", "saturated", "spurious", "agree"), (0.2, 0.1, 0.1, 0.6))}  # fmt: skip
    for iface, (p, a) in {"sampling": (1, 1), "rollout": (3, 1), "rubric": (2, 1)}.items():
        row[f"harness/updates/{iface}/proposed"] = p
        row[f"harness/updates/{iface}/accepted"] = a
    row.update({
        "harness/critic/accept_rate_with_evidence": 0.7,
        "harness/critic/accept_rate_without_evidence": 0.4,
        "harness/reversal_rate": step / 100,
        "harness/guidance/drawn_fields_per_task": 1.5,
        "harness/guidance/drawn_unguided_share": step / 12,
        "harness/levels/0": 0.9, "harness/levels/1": 0.1,
        "harness/time/memory": 0.5, "harness/time/critic": 0.3,
        "harness/time/attributor_proposer": 0.1, "time/step": 2.0,
    })  # fmt: skip
    return row


def arise_rl_row(step: int) -> dict:
    """ARISE-RL (section 8): cycles of 2 generator + 4 solver steps, refreshes at 3 and 9."""
    generator = (step - 1) % 6 < 2
    row = {"arise_rl/cycle": (step - 1) // 6, "arise_rl/generator_phase": float(generator)}
    if generator:
        row.update({
            "arise_rl/generator/fmt_rate": 0.5, "arise_rl/generator/tool_rate": 0.25,
            "arise_rl/generator/gates_rate": 0.25, "arise_rl/generator/difficulty_rate": 0.5,
            "arise_rl/generator/c/0": 0.25, "arise_rl/generator/c/1": 0.75,
        })  # fmt: skip
    row.update({"arise_rl/rgsed/above": 0.75, "arise_rl/rgsed/within": 0.25,
                "arise_rl/rgsed/below": 0.0, "arise_rl/rgsed/gate_active_frac": 0.5,
                "sd/coef_mean": 0.2})  # fmt: skip
    row.update({"arise_rl/pool/generated": 3.0 + (step >= 9), "arise_rl/pool/filled": 1.0})
    if step in (3, 9):
        row["arise_rl/pool/base_pass_rate"] = 0.6 if step == 3 else 0.4
    return row


def write_synthetic_run(d: str) -> None:
    os.makedirs(os.path.join(d, "controllers"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"method": "arise", "train": {"steps": 12, "seed": 0}}, f)
    live = {}
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 0, "eval/heldout/score": 40.0, "eval/heldout/pass_rate": 0.1}))
        f.write("\n")
        for step in range(1, 13):
            for s, entry, _, _, to in EVENTS:
                if s == step:
                    live[entry] = to
            row = {
                "step": step,
                an.RUBRIC_REWARD: 0.3 + step / 40,
                an.TASK_PASS: step / 20,
                an.ALL_FAIL: ALL_FAIL[step - 1],
            }
            for entry, state in live.items():
                if state != "retired":
                    row[f"arise/rubric/{entry}/pass_rate"] = min(1.0, 0.1 * step)
            states = list(live.values())
            done = [e for s, _, e, _, _ in EVENTS if s <= step]
            row.update(  # the controller's own counts, consistent with the events
                {
                    "arise/pool/added_total": done.count("add"),
                    "arise/pool/retired_total": done.count("retire"),
                    "arise/pool/refined_total": done.count("refine"),
                    "arise/pool/live": sum(st != "retired" for st in states),
                    "arise/pool/skill_active": states.count("active"),
                    "arise/pool/skill_hidden": states.count("hidden"),
                }
            )
            row.update({P + k: v for k, v in SAMPLING.get(step, {}).items()})
            if step in FAILURE:
                row.update({f"failure/{c}": v for c, v in zip(FAILURE_CLASSES, FAILURE[step])})
                row.update({f"failure/seed/{c}": v for c, v in zip(FAILURE_CLASSES, SEED_FAILURE)})
            if step >= 3:  # a HarnessRL run's harness/* metrics (section 6)
                row.update(harness_row(step))
            row.update(arise_rl_row(step))  # an ARISE-RL run's arise_rl/* metrics (section 8)
            if step in (6, 12):
                row.update({"eval/heldout/score": 40.0 + step, "eval/heldout/pass_rate": step / 24})
            f.write(json.dumps(row) + "\n")
    # A RISED run's behaviours file (section 7): env "list", praise_opener halves by step 6.
    os.makedirs(os.path.join(d, "controllers", "rised"))
    with open(os.path.join(d, "controllers", "rised", "behaviours.jsonl"), "w") as f:
        for step in range(1, 13):
            freq = {"praise_opener": PRAISE[step - 1], "count_followed": step / 12}
            row = {"step": step, "env": "list", "rollouts": 8, "failed": 0, "freq": freq}
            f.write(json.dumps(row) + "\n")
    write_transfer(d)
    with open(os.path.join(d, "controllers", "arise.jsonl"), "w") as f:
        for step, entry, event, old, new in EVENTS:
            ev = {"step": step, "entry": entry, "event": event, "from": old, "to": new}
            f.write(json.dumps({**ev, "evidence": {"pass_rate": 0.5}}) + "\n")


# A RISED transfer analysis's outputs (section 9): trained on "list", checkpoints 2 and 3.
TRANSFER_RUBRIC = {"list": 0.9, "format": 0.6, "rewrite": 0.3}
TRANSFER_GAIN = {2: {"list": 0.2, "format": 0.05, "rewrite": -0.05},
                 3: {"list": 0.3, "format": 0.00, "rewrite": 0.02}}  # fmt: skip


def transfer_rows() -> list[dict]:
    from rubric_rl.methods.rised import rised_transfer_stats as rts

    rows = []
    for step, gains in TRANSFER_GAIN.items():
        for env, gain in gains.items():
            sims = {s: TRANSFER_RUBRIC[env] for s in rts.PROFILE_SIGNALS}
            sims["gradient"] = 0.1 * step - TRANSFER_RUBRIC[env]
            rows.append({"step": step, "env": env, "held_out": env != "list",
                         "improvement": gain, **sims})  # fmt: skip
    return rows


def write_transfer(d: str) -> None:
    from rubric_rl.methods.rised import rised_transfer_stats as rts

    rows = transfer_rows()
    summary = {"train_env": "list", "baseline_step": 1, "signals": rts.summarize(rows)}
    rts.write_outputs(os.path.join(d, rts.TRANSFER_DIR), rows, summary)


def execute(run_dir: str, fig_dir: str) -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {"RUBRIC_RL_RUN_DIR": run_dir, "RUBRIC_RL_FIG_DIR": fig_dir, "MPLBACKEND": "Agg"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits the environment
    try:
        client = nbclient.NotebookClient(
            nb,
            timeout=120,
            kernel_name="python3",
            resources={"metadata": {"path": os.path.join(REPO, "colabs")}},
        )
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o["text"])
    return "".join(out)


def check_figures(fig_dir, figures=FIGURES) -> None:
    for name in figures:
        path = os.path.join(fig_dir, name)
        assert os.path.getsize(path) > 1000, path
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", path


def test_notebook_on_synthetic_run(tmp_path):
    run_dir, fig_dir = str(tmp_path / "run"), str(tmp_path / "figs")
    write_synthetic_run(run_dir)
    text = execute(run_dir, fig_dir)
    check_figures(
        fig_dir,
        FIGURES
        + ("failure_classes.png", "harness.png", "rised_behaviours.png", "arise_rl.png")
        + ("rised_transfer.png",),
    )
    lines = set(text.splitlines())
    expected = {
        "SUMMARY last_step=12 events=8",
        "SUMMARY pool added=3 active=2 retired=1 refined=1",
        "SUMMARY all_fail_mean=0.4792",
        f"SUMMARY final {an.TASK_PASS}=0.6000",
        f"SUMMARY final {an.RUBRIC_REWARD}=0.6000",
        "SUMMARY final eval/heldout/pass_rate=0.5000",
        "SUMMARY criteria=3",
        "SUMMARY early top cell list/counting p=1.0000",
        "SUMMARY middle top cell list/counting p=0.6000",
        "SUMMARY late top cell format/formatting p=0.8000",
        "SUMMARY final failure/blind=0.1000",
        "SUMMARY final failure/agree=0.4500",
        "SUMMARY final failure/seed/blind=0.5000",
        "SUMMARY final failure/seed/spurious=0.3000",
        # harness/* on steps 3-12: 10 steps of (proposed, accepted) per interface
        "SUMMARY harness rollout proposed=30 accepted=10",
        "SUMMARY harness rubric proposed=20 accepted=10",
        "SUMMARY harness reversal_rate=0.1200",
        "SUMMARY harness drawn_unguided_share=1.0000",
        f"SUMMARY rised list praise_opener half_life={PRAISE_HALF_LIFE}",
        # arise_rl/*: generator steps 1, 2, 7, 8; refreshes at 3 and 9
        "SUMMARY arise_rl generator fmt_rate mean=0.5000",
        "SUMMARY arise_rl c_distribution=0.250,0.750",
        "SUMMARY arise_rl rgsed above mean=0.7500",
        "SUMMARY arise_rl base_pass_rate=0.600,0.400",
        # held-out pairs (format, rewrite) x steps 2, 3: rubric ranks 3.5 1.5 3.5 1.5, gain ranks
        # 4 1 2 3 -> rho = 2 / (2 sqrt 5); gradient ranks 1 3 2 4 -> rho = -2 / 5
        "SUMMARY rised transfer held_out rubric_all spearman=+0.447",
        "SUMMARY rised transfer held_out gradient spearman=-0.400",
    }
    assert expected <= lines, sorted(expected - lines)
    assert "WARNING pool metrics" not in text


def test_notebook_on_a_run_without_arise_logs(tmp_path):
    """A GRPO run (no pool, no sampler probabilities) still runs top to bottom."""
    run_dir = tmp_path / "grpo"
    run_dir.mkdir()
    rows = [{"step": s, an.RUBRIC_REWARD: 0.1 * s} for s in range(1, 5)]
    rows[-1][an.HELDOUT_SCORE] = 40.0
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = execute(str(run_dir), str(tmp_path / "figs"))
    check_figures(str(tmp_path / "figs"), tuple(f for f in FIGURES if f != "criteria.png"))
    lines = set(text.splitlines())
    assert {"SUMMARY last_step=4 events=0", "SUMMARY criteria=0"} <= lines
    # No per-criterion rates (a static rubric): a message saying why, not an empty figure.
    assert "no per-criterion data in metrics.jsonl" in text
    assert not os.path.exists(tmp_path / "figs" / "criteria.png")
    assert f"SUMMARY final {an.RUBRIC_REWARD}=0.4000" in lines
    assert not any(line.startswith("SUMMARY pool") for line in lines)
    assert "no failure/* pair classes in metrics.jsonl" in text
    assert not os.path.exists(tmp_path / "figs" / "failure_classes.png")
    assert "no harness/* metrics in metrics.jsonl" in text
    assert not os.path.exists(tmp_path / "figs" / "harness.png")
    assert "no controllers/rised/behaviours.jsonl" in text
    assert not os.path.exists(tmp_path / "figs" / "rised_behaviours.png")
    assert "no arise_rl/* metrics in metrics.jsonl" in text
    assert "no transfer/transfer_summary.json" in text
    assert not os.path.exists(tmp_path / "figs" / "rised_transfer.png")
    assert not os.path.exists(tmp_path / "figs" / "arise_rl.png")


@pytest.mark.skipif(
    not os.path.isfile(
        os.path.join(os.environ.get("RUBRIC_RL_SMOKE_RUN_DIR", "-"), "metrics.jsonl")
    ),
    reason="RUBRIC_RL_SMOKE_RUN_DIR does not name a run directory (the synthetic one is tested)",
)
def test_notebook_on_smoke_run(tmp_path):
    run_dir = os.environ["RUBRIC_RL_SMOKE_RUN_DIR"]
    text = execute(run_dir, str(tmp_path / "figs"))
    check_figures(str(tmp_path / "figs"))
    run = an.load_run(run_dir)
    last = max(int(r["step"]) for r in run.metrics)
    events = an.read_events(run_dir)
    assert f"SUMMARY last_step={last} events={len(events)}" in text
