"""launch/sweep.py: expansion (configs × variants × grid × seeds), --print, skip-finished,
local runs."""

import glob
import json
import os
import shlex
import stat
import subprocess
import sys
import time

import pytest

from launch import sweep
from rubric_rl.metrics import read_metrics
from rubric_rl.runs import run_dir
from tests.launch_env import launch_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _expand(root):
    return sweep.expand(
        root,
        ["configs/arise.py"],
        ["", "smoke,no_skills"],
        [0, 1],
        sweep.parse_grid(["optim.lr=1e-4,3e-4"]),
        [("train.steps", "10")],
    )


def test_expansion_exact_workdirs_and_commands():
    runs = _expand("/r")
    got = [(r.workdir, r.config, r.seed, r.overrides) for r in runs]
    lr4, lr3, steps = ("optim.lr", "1e-4"), ("optim.lr", "3e-4"), ("train.steps", "10")
    v, sv = "configs/arise.py", "configs/arise.py:smoke,no_skills"
    assert got == [
        ("/r/arise-optim.lr_1e-4/seed0", v, 0, (lr4, steps)),
        ("/r/arise-optim.lr_1e-4/seed1", v, 1, (lr4, steps)),
        ("/r/arise-optim.lr_3e-4/seed0", v, 0, (lr3, steps)),
        ("/r/arise-optim.lr_3e-4/seed1", v, 1, (lr3, steps)),
        ("/r/arise-smoke+no_skills-optim.lr_1e-4/seed0", sv, 0, (lr4, steps)),
        ("/r/arise-smoke+no_skills-optim.lr_1e-4/seed1", sv, 1, (lr4, steps)),
        ("/r/arise-smoke+no_skills-optim.lr_3e-4/seed0", sv, 0, (lr3, steps)),
        ("/r/arise-smoke+no_skills-optim.lr_3e-4/seed1", sv, 1, (lr3, steps)),
    ]
    assert runs[5].command("py") == [
        "py", "-m", "rubric_rl.launch", "--config=configs/arise.py:smoke,no_skills",
        "--workdir=/r/arise-smoke+no_skills-optim.lr_1e-4/seed1", "--config.train.seed=1",
        "--config.optim.lr=1e-4", "--config.train.steps=10",
    ]  # fmt: skip


def test_two_grids_cross_and_config_with_own_variant():
    runs = sweep.expand(
        "r",
        ["configs/grpo.py:smoke", "configs/arise.py"],
        [],
        [3],
        sweep.parse_grid(["optim.lr=1,2", "rollout.temperature=0.7,1.0"]),
    )
    assert [r.workdir for r in runs] == [
        f"r/{c}-{g}/seed3"
        for c in ("grpo-smoke", "arise")
        for g in (
            "optim.lr_1+rollout.temperature_0.7",
            "optim.lr_1+rollout.temperature_1.0",
            "optim.lr_2+rollout.temperature_0.7",
            "optim.lr_2+rollout.temperature_1.0",
        )
    ]
    assert runs[0].config == "configs/grpo.py:smoke" and runs[4].config == "configs/arise.py"


def test_seed_major_order_keeps_the_arms_order_within_a_seed():
    runs = sweep.expand("/r", ["configs/arise.py"], ["", "no_skills"], seeds=[2, 0, 1])
    assert [(r.seed, os.path.basename(os.path.dirname(r.workdir))) for r in runs][:3] == [
        (2, "arise"),
        (0, "arise"),
        (1, "arise"),
    ]  # expand: config-major
    ordered = sweep.seed_major(runs)
    assert [(r.seed, os.path.basename(os.path.dirname(r.workdir))) for r in ordered] == [
        (2, "arise"), (2, "arise-no_skills"), (0, "arise"), (0, "arise-no_skills"),
        (1, "arise"), (1, "arise-no_skills"),
    ]  # fmt: skip
    assert sorted(map(id, ordered)) == sorted(map(id, runs))


def test_bad_inputs_name_the_flag():
    with pytest.raises(ValueError, match="--grid 'optim.lr': expected key=value"):
        sweep.parse_grid(["optim.lr"])
    with pytest.raises(ValueError, match="--seeds"):
        sweep.parse_seeds("a,b")
    with pytest.raises(ValueError, match="train.seed"):
        sweep.expand("r", ["configs/arise.py"], grid=[("train.seed", ["1", "2"])])
    with pytest.raises(ValueError, match="carries a variant"):
        sweep.expand("r", ["configs/arise.py:smoke"], ["no_skills"])
    assert sweep.parse_seeds("0-2") == [0, 1, 2] and sweep.parse_seeds("4,1") == [4, 1]


@pytest.mark.parametrize("seeds", ["-1", "0,-1", "2,-3"])
def test_negative_seeds_are_refused(seeds):
    # A seed-1 directory matches no seed<k>: aggregate and archive would never see its run.
    with pytest.raises(ValueError, match=r"seeds must be >= 0"):
        sweep.parse_seeds(seeds)


def test_long_variant_slug_is_safe_and_unique():
    a = sweep.slug("frozen_rubrics=/very/long/path/" + "x" * 80 + "/seed0")
    b = sweep.slug("frozen_rubrics=/very/long/path/" + "x" * 80 + "/seed1")
    assert a != b and len(a) == sweep.MAX_SLUG and "/" not in a
    assert sweep.slug("sampler=uniform") == "sampler_uniform"


def test_seed_placeholder_pairs_runs_of_one_seed():
    runs = sweep.expand(
        "r",
        ["configs/arise.py"],
        ["frozen_rubrics=r/arise/seed{seed}"],
        [0, 3],
        fixed=[("warmstart.cache_dir", "ws/{seed}")],
    )
    assert [r.config for r in runs] == [
        "configs/arise.py:frozen_rubrics=r/arise/seed0",
        "configs/arise.py:frozen_rubrics=r/arise/seed3",
    ]
    assert [r.overrides for r in runs] == [
        (("warmstart.cache_dir", "ws/0"),),
        (("warmstart.cache_dir", "ws/3"),),
    ]
    # One group for every seed: the workdirs differ only in seed<k>.
    assert len({os.path.dirname(r.workdir) for r in runs}) == 1


def test_next_seed_placeholder_names_another_seeds_run():
    runs = sweep.expand(
        "r", ["configs/arise.py"], ["frozen_rubrics=r/arise/seed{next_seed}"], [0, 3, 4],
        fixed=[("note", "{seed}-{next_seed}")],
    )  # fmt: skip
    assert [r.config for r in runs] == [
        "configs/arise.py:frozen_rubrics=r/arise/seed3",
        "configs/arise.py:frozen_rubrics=r/arise/seed4",
        "configs/arise.py:frozen_rubrics=r/arise/seed0",
    ]
    assert [r.overrides for r in runs] == [
        (("note", "0-3"),),
        (("note", "3-4"),),
        (("note", "4-0"),),
    ]
    assert len({os.path.dirname(r.workdir) for r in runs}) == 1
    with pytest.raises(ValueError, match="needs the sweep's next seed"):
        sweep.with_seed("seed{next_seed}", 0)


def _finish(wd, steps=10, ckpts=(), marker=False):
    os.makedirs(os.path.join(wd, "checkpoints"), exist_ok=True)
    with open(os.path.join(wd, "config.json"), "w") as f:
        json.dump({"train": {"steps": steps, "seed": 0}}, f)
    for s in ckpts:
        os.makedirs(os.path.join(wd, "checkpoints", s))
    if marker:
        open(os.path.join(wd, "SWEEP_DONE.json"), "w").write("{}")


def test_print_skips_finished_and_resumes_partial(tmp_path, capsys):
    root = str(tmp_path)
    argv = ["--root", root, "--config", "configs/arise.py", "--variant", "smoke"]
    argv += ["--seeds", "0,1,2,3", "--set", "train.steps=10", "--print"]
    wd = [f"{root}/arise-smoke/seed{k}" for k in range(4)]
    _finish(wd[0], marker=True)  # sweep marker
    _finish(wd[1], ckpts=("5", "10"))  # final checkpoint
    _finish(wd[2], ckpts=("5", "10.orbax-checkpoint-tmp-1"))  # partial: resume
    assert sweep.main(argv) == 0
    lines = capsys.readouterr().out.strip().split("\n")
    base = "python -m rubric_rl.launch --config=configs/arise.py:smoke"
    assert lines == [
        f"{base} --workdir={wd[2]} --config.train.seed=2 --config.train.steps=10 --resume",
        f"{base} --workdir={wd[3]} --config.train.seed=3 --config.train.steps=10",
    ]
    assert sweep.main([*argv, "--force"]) == 0
    forced = capsys.readouterr().out.strip().split("\n")
    assert len(forced) == 4
    aside = f"python -m rubric_rl.runs.run_dir --set-aside {shlex.quote(wd[0])}"
    assert forced[0] == f"{aside} && {base} --workdir={wd[0]} " + (
        "--config.train.seed=0 --config.train.steps=10"
    )


def _fake_python(tmp_path, then=""):
    """A stand-in interpreter that records its arguments in the run's workdir (``args.txt``),
    then runs the shell line ``then`` (``$wd``: the workdir); exits 0 unless ``then`` exits."""
    fake = tmp_path / "fakepy"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case $a in --workdir=*) wd=${a#--workdir=};; esac; done\n'
        'echo "$@" > "$wd/args.txt"\n' + then
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return str(fake)


def test_run_local_parallel_logs_and_markers(tmp_path):
    # Records its arguments, fails for seed 1.
    fake = _fake_python(tmp_path, 'case "$*" in *train.seed=1*) echo boom; exit 3;; esac\n')
    root = str(tmp_path / "runs")
    runs = sweep.expand(root, ["configs/grpo.py:smoke"], seeds=[0, 1, 2])
    _finish(runs[2].workdir, marker=True)
    codes = sweep.run_local(runs, jobs=2, python=str(fake))
    assert codes == {runs[0].workdir: 0, runs[1].workdir: 3}  # seed 2 skipped
    assert os.path.exists(os.path.join(runs[0].workdir, "SWEEP_DONE.json"))
    assert not os.path.exists(os.path.join(runs[1].workdir, "SWEEP_DONE.json"))
    args = open(os.path.join(runs[0].workdir, "args.txt")).read().split()
    assert args == runs[0].command("x")[1:]
    log = open(os.path.join(runs[1].workdir, "launch.log")).read()
    assert log.startswith(f"$ {fake} -m rubric_rl.launch") and "boom" in log
    assert not os.path.exists(os.path.join(runs[2].workdir, "args.txt"))


def test_local_runs_share_a_compilation_cache(tmp_path, monkeypatch):
    # Records the cache directory it was given.
    fake = _fake_python(tmp_path, 'echo "${JAX_COMPILATION_CACHE_DIR:-none}" > "$wd/cache.txt"\n')
    monkeypatch.delenv(sweep.CACHE_ENV, raising=False)

    def cache_seen(root, *extra):
        argv = ["--root", str(root), "--config", "configs/grpo.py:smoke", "--seeds", "0,1"]
        assert sweep.main([*argv, "--python", str(fake), "--jobs", "2", *extra]) == 0
        seen = {open(f"{root}/grpo-smoke/seed{k}/cache.txt").read().strip() for k in (0, 1)}
        assert len(seen) == 1  # every run of the sweep: the same cache
        return seen.pop()

    assert cache_seen(tmp_path / "a") == str(tmp_path / "a" / "jax_cache")  # the default
    assert os.path.isdir(tmp_path / "a" / "jax_cache")
    assert cache_seen(tmp_path / "b", "--jax_cache", str(tmp_path / "c")) == str(tmp_path / "c")
    assert cache_seen(tmp_path / "d", "--jax_cache", "off") == "none"
    monkeypatch.setenv(sweep.CACHE_ENV, str(tmp_path / "mine"))  # the user's own: kept
    assert cache_seen(tmp_path / "e") == str(tmp_path / "mine")
    assert sweep.with_jax_cache({sweep.CACHE_ENV: "x", "A": "1"}, "off") == {"A": "1"}


@pytest.mark.slow
@pytest.mark.e2e
def test_force_refuses_a_live_run_naming_its_pid_and_moves_an_idle_one_aside(tmp_path):
    """Real processes: a sweep's smoke run is going; ``--force`` against it must refuse, naming
    the launcher's pid, and leave every file of the live run (it used to ``rmtree`` the workdir,
    and the live run died mid-checkpoint). Once the run is finished, ``--force`` moves it aside
    (kept whole) and starts afresh."""
    root = tmp_path / "runs"
    env = launch_env(tmp_path / "jax_cache")
    argv = ["--root", str(root), "--config", "configs/grpo.py:smoke"]
    argv += ["--set", "train.steps=3", "--set", "checkpoint.every=1"]
    # No warm start, no calibration pass, no OOD evaluation: the run's files and lock are the
    # point.
    argv += ["--set", "warmstart.steps=0", "--set", "calibration.enabled=False"]
    argv += ["--set", "eval.splits.ood=0"]
    wd = root / "grpo-smoke" / "seed0"
    live = subprocess.Popen(
        [sys.executable, "-m", "launch.sweep", *argv], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while not (wd / "config.json").exists():  # written once the launcher holds the lock
        assert live.poll() is None and time.time() < deadline, "the sweep's run never started"
        time.sleep(0.05)
    holder = (wd / ".lock").read_text().strip()  # "pid N on host"
    pid = int(holder.split()[1])
    assert b"rubric_rl.launch" in open(f"/proc/{pid}/cmdline", "rb").read()
    forced = subprocess.run(
        [sys.executable, "-m", "launch.sweep", *argv, "--force"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert live.poll() is None, "the forced sweep was too slow to test against a live run"
    assert forced.returncode == 1, forced.stdout + forced.stderr
    assert f"  {wd}: {holder}\n" in forced.stderr and "nothing was moved or started" in (
        forced.stderr
    )
    out, _ = live.communicate(timeout=600)
    assert live.returncode == 0, out[-3000:]
    # The live run finished whole, in place; nothing was set aside.
    assert [r["step"] for r in read_metrics(str(wd / "metrics.jsonl"))] == [0, 1, 2, 3]
    assert (wd / "SWEEP_DONE.json").exists()
    assert glob.glob(f"{wd}.replaced-*") == []
    before = sorted(os.listdir(wd))

    # Idle now: --force moves it aside (every file kept) and starts a new run in an empty wd.
    assert sweep.main([*argv, "--force", "--python", _fake_python(tmp_path)]) == 0
    (aside,) = glob.glob(f"{wd}.replaced-*")
    assert sorted(os.listdir(aside)) == before
    assert [r["step"] for r in read_metrics(f"{aside}/metrics.jsonl")] == [0, 1, 2, 3]
    assert sorted(os.listdir(wd)) == ["SWEEP_DONE.json", "args.txt", "launch.log"]


def test_set_aside_from_a_shell_refuses_a_held_workdir(tmp_path):
    """The ``--print --force`` lines move a run aside with ``python -m rubric_rl.runs.run_dir
    --set-aside``: a workdir whose lock is held (here by this process) is refused, naming it."""
    wd = tmp_path / "seed0"
    run_dir.lock(str(wd))
    (wd / "metrics.jsonl").write_text("{}\n")
    cmd = [sys.executable, "-m", "rubric_rl.runs.run_dir", "--set-aside", str(wd)]
    try:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert f"(pid {os.getpid()} on " in r.stderr and "not moved or deleted" in r.stderr
        assert sorted(os.listdir(wd)) == [".lock", "metrics.jsonl"]
    finally:
        run_dir.unlock(str(wd))
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not wd.exists() and len(glob.glob(f"{wd}.replaced-*")) == 1
