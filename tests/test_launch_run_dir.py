"""``python -m rubric_rl.launch`` against its run-directory faults (real processes, real files): two
runs into one workdir, refused launches that must not touch the run's config record, ``--resume``
with nothing to resume or a changed config, a damaged latest checkpoint, and the CLI's messages.
A refusal that only repeats ``run_dir.claim``'s check on another path (the launcher prints every
``RunDirError`` and exits 1, shown through a process once) is checked on ``run_dir.claim``."""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from configs import grpo
from rubric_rl.metrics import read_metrics
from rubric_rl.runs import run_dir
from rubric_rl.runs.run_summary import summarize_run
from tests.launch_env import launch_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


def _cmd(workdir, *extra):
    # No warm start, no calibration pass, no OOD evaluation: the run directory's files are the
    # point (the held-out evaluations stay, for the summary).
    return [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke",
        f"--config.train.steps={STEPS}", "--config.checkpoint.every=1", f"--workdir={workdir}",
        "--config.warmstart.steps=0", "--config.calibration.enabled=False",
        "--config.eval.splits.ood=0", *extra,
    ]  # fmt: skip


def _launch(env, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "rubric_rl.launch", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real smoke run; once it has claimed its workdir, a second launch into the same workdir
    (another seed, as in the issue) is made."""
    base = tmp_path_factory.mktemp("launch")
    env = launch_env(base / "jax_cache")
    w = base / "w"
    first = subprocess.Popen(
        _cmd(w), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 120
    while not (w / "config.json").exists():  # written once the workdir is the first run's
        assert first.poll() is None and time.time() < deadline, "the first run never started"
        time.sleep(0.05)
    t0 = time.time()
    second = subprocess.run(
        _cmd(w, "--config.train.seed=1"), cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    second_s = time.time() - t0
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-3000:]
    return {"w": w, "env": env, "first": first, "second": second, "second_s": second_s, "out": out}


@pytest.mark.slow
@pytest.mark.e2e
def test_a_second_run_into_a_running_workdir_is_refused_at_once(run):
    w, second = run["w"], run["second"]
    assert second.returncode == 1
    assert f"--workdir {w} is in use by another run (pid {run['first'].pid} " in second.stderr
    assert run["second_s"] < 60  # refused at start-up, not after its warm start
    # The first run's files are whole and its own.
    rows = read_metrics(str(w / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert json.loads((w / "config.json").read_text())["train"]["seed"] == 0
    assert sorted(os.listdir(w / "checkpoints")) == ["2", "3"]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_run_ends_with_its_summary(run):
    # The launch's last lines are rubric_rl.runs.run_summary's text for its run directory: the
    # first and last held-out evaluation, primary metrics first.
    text = summarize_run(str(run["w"]))
    assert run["out"].rstrip().endswith(text), run["out"][-2000:]
    assert f"grpo, {STEPS} of {STEPS} steps" in text
    assert "start = step 0 (the warm start, before any update), end = step 3" in text
    assert "task pass rate (primary)" in text and "seed-rubric score (secondary)" in text


@pytest.mark.slow
@pytest.mark.e2e
def test_refused_relaunches_leave_the_config_record_untouched(run):
    w, env = run["w"], run["env"]
    before = (w / "config.json").read_bytes()
    fresh = _launch(env, *_cmd(w, "--config.train.seed=1")[3:])
    assert fresh.returncode == 1
    assert "already holds checkpoints (latest step 3); pass --resume" in fresh.stderr
    lr = json.loads(before)["optim"]["lr"]
    # A changed learning rate and another model in one launch: both are the config check,
    # made before orbax is reached, which names each changed key.
    changed = _launch(
        env, *_cmd(w, "--resume", "--config.optim.lr=0.5", "--config.model.name=1m")[3:]
    )
    assert changed.returncode == 1
    assert f"  optim.lr: {lr!r} -> 0.5\n" in changed.stderr
    assert "  model.name: 'tiny' -> '1m'\n" in changed.stderr
    assert "--allow_config_change=model.name,optim.lr" in changed.stderr
    assert "orbax" not in changed.stderr and "Traceback" not in changed.stderr
    assert (w / "config.json").read_bytes() == before


def test_resume_with_nothing_to_resume_is_an_error(tmp_path):
    # Through the launcher: a missing workdir is refused with exit 1, and nothing is created.
    env = launch_env(tmp_path / "jax_cache")
    w = tmp_path / "missing"
    r = _launch(env, "--config=configs/grpo.py:smoke", f"--workdir={w}", "--resume")
    assert r.returncode == 1
    assert f"--resume: nothing to resume, {w}" in r.stderr
    assert "run without --resume to start a new run" in r.stderr
    assert not w.exists()
    # An empty workdir is refused by the same check (run_dir.claim, whose refusal the launcher
    # prints and exits 1 with, as above), leaving it empty.
    w = tmp_path / "empty"
    w.mkdir()
    with pytest.raises(run_dir.RunDirError) as e:
        run_dir.claim(str(w), grpo.get_config("smoke"), resume=True)
    assert str(e.value).startswith(f"--resume: nothing to resume, {w}")
    assert "run without --resume to start a new run" in str(e.value)
    assert os.listdir(w) == []


def test_cli_messages_help_typo_and_a_file_as_workdir(tmp_path):
    env = launch_env(tmp_path / "jax_cache")
    r = _launch(env, "--help")
    assert r.returncode == 0 and "--allow_config_change" in r.stdout + r.stderr
    r = _launch(env, "--config=configs/grpo.py:smoke", "--config.rollout.temprature=0.5")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "\\n" not in r.stderr
    assert (
        "--config.rollout.temprature: no such config key 'temprature'\n"
        'Did you mean "temperature" instead of "temprature"?\n'
    ) in r.stderr
    # A file as the workdir: run_dir.claim's refusal (printed by the launcher, exit 1, as for
    # the missing workdir above).
    (tmp_path / "afile").write_text("x")
    with pytest.raises(run_dir.RunDirError) as e:
        run_dir.claim(str(tmp_path / "afile"), grpo.get_config("smoke"))
    assert str(e.value).startswith(f"--workdir {tmp_path / 'afile'} is a file, not a directory")


@pytest.mark.slow
@pytest.mark.e2e
def test_a_truncated_latest_checkpoint_falls_back_to_the_previous_step(run, tmp_path):
    w = tmp_path / "w"
    shutil.copytree(run["w"], w)  # with the finished run's lock file: a stale lock
    data = max(glob.glob(str(w / "checkpoints/3/train_state/d/*")), key=os.path.getsize)
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    lr = json.loads((w / "config.json").read_text())["optim"]["lr"]
    allow = ("--config.optim.lr=0.002", "--allow_config_change=optim.lr")
    r = _launch(run["env"], *_cmd(w, "--resume", *allow)[3:])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint step 3 is unreadable ({data}: " in r.stderr
    assert "resuming from step 2 instead" in r.stderr
    # The damaged step is kept aside, the run saved step 3 afresh and logged it once.
    assert os.path.exists(w / "checkpoints_corrupt" / "3" / "train_state")
    assert sorted(os.listdir(w / "checkpoints")) == ["2", "3"]
    rows = read_metrics(str(w / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    # The allowed change: the record is the new config, the change is listed beside it.
    assert json.loads((w / "config.json").read_text())["optim"]["lr"] == 0.002
    (change,) = [json.loads(x) for x in (w / "config_changes.jsonl").read_text().splitlines()]
    assert change["changes"] == {"optim.lr": {"old": lr, "new": 0.002}}


@pytest.mark.slow
@pytest.mark.e2e
def test_no_intact_checkpoint_is_an_error_naming_each_file(run, tmp_path):
    w = tmp_path / "w"
    shutil.copytree(run["w"], w)
    metadata = [w / "checkpoints" / s / "run_state" / "metadata" for s in ("2", "3")]
    for path in metadata:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    r = _launch(run["env"], *_cmd(w, "--resume")[3:])
    assert r.returncode == 1
    assert f"--resume: no intact checkpoint in {w / 'checkpoints'}:\n" in r.stderr
    for step, path in zip((2, 3), metadata):
        assert f"  step {step}: {path}: not valid JSON (" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(os.listdir(w / "checkpoints")) == ["2", "3"]  # nothing moved or deleted


@pytest.mark.slow
@pytest.mark.e2e
def test_a_save_that_fails_on_a_full_disk_stops_the_run_with_one_error(run, tmp_path):
    """A real write failure during a run: resumed from step 2 under a file-size limit
    (RLIMIT_FSIZE) below the checkpoint's largest file and above every other file the run
    writes, so step 3's save fails with EFBIG as on a full disk. The run exits 1 with one
    error naming step 3, the cause and step 2 as the resume point, no traceback, and records
    no step past the one that was training while the save failed. (It used to print 26
    tracebacks and train on; orbax's background threads still printed 9 tracebacks, 360
    lines, after the error existed.)"""
    import resource

    w = tmp_path / "w"
    shutil.copytree(run["w"], w)
    shutil.rmtree(w / "checkpoints" / "3")
    files = glob.glob(str(w / "checkpoints" / "2" / "**" / "*"), recursive=True)
    largest = max(os.path.getsize(f) for f in files if os.path.isfile(f))
    limit = largest // 2
    tb = max(glob.glob(str(w / "tb" / "*")), key=os.path.getsize)
    assert os.path.getsize(tb) * 3 < limit, (largest, os.path.getsize(tb))
    # The session's compilation cache, read but never written by this process (no compile
    # takes a billion seconds): an entry the limit would cut short is never written.
    env = dict(run["env"], JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="1e9")
    r = subprocess.run(
        [*_cmd(w, "--resume", "--allow_config_change=train.steps"), "--config.train.steps=5"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )  # fmt: skip
    assert r.returncode == 1, r.stderr[-3000:]
    err = r.stderr
    (line,) = [x for x in err.splitlines() if "could not be saved" in x]
    assert line.startswith("rubric_rl.launch: checkpoint step 3 could not be saved (")
    assert "File too large" in line or "/checkpoints/3.orbax-checkpoint-tmp/" in line, line
    assert line.endswith("then resume from step 2, the last complete checkpoint, with --resume")
    assert "Traceback" not in err and "Event loop is closed" not in err, err[-5000:]
    assert len(err.splitlines()) < 20, err[-5000:]
    # The step whose save failed was recorded; at most the one training meanwhile came after.
    steps = [row["step"] for row in read_metrics(str(w / "metrics.jsonl"))]
    assert steps in ([0, 1, 2, 3], [0, 1, 2, 3, 4]), steps
    assert sorted(os.listdir(w / "checkpoints")) == ["2", "3.orbax-checkpoint-tmp"]
