"""The run directory's lock, default names and config record (``rubric_rl.runs.run_dir``)."""

import datetime
import json
import os
import signal
import subprocess
import sys

import pytest

from configs import grpo
from rubric_rl.runs import run_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_HOLDER = """
import sys, time
from rubric_rl.runs import run_dir
run_dir.lock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def test_lock_is_exclusive_across_processes_and_dies_with_its_holder(tmp_path):
    w = tmp_path / "w"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(w)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(run_dir.RunDirError) as e:
            run_dir.lock(str(w))
        assert str(w) in str(e.value) and f"pid {holder.pid} " in str(e.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The dead holder's lock file is still there, naming it: a stale lock that must not block.
    assert f"pid {holder.pid} " in (w / ".lock").read_text()
    run_dir.lock(str(w))
    assert f"pid {os.getpid()} " in (w / ".lock").read_text()
    run_dir.unlock(str(w))


def test_default_workdirs_of_variants_and_simultaneous_launches_differ(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
    root = str(tmp_path / "runs")
    made = [
        run_dir.default_workdir("configs/grpo.py:smoke", root, now),
        run_dir.default_workdir("configs/grpo.py:gpu", root, now),
        run_dir.default_workdir("configs/grpo.py:smoke", root, now),  # the same microsecond
        run_dir.default_workdir("configs/grpo.py:smoke,model=5m", root, now),
    ]
    assert [os.path.basename(p) for p in made] == [
        "grpo-smoke-20260102-030405-678901",
        "grpo-gpu-20260102-030405-678901",
        "grpo-smoke-20260102-030405-678901-2",
        "grpo-smoke+model_5m-20260102-030405-678901",
    ]
    assert all(os.path.isdir(p) and not os.listdir(p) for p in made)


def _finished_run(tmp_path):
    """A workdir as a finished run leaves it: its config record and a checkpoint step."""
    w = tmp_path / "run"
    (w / "checkpoints" / "2").mkdir(parents=True)
    run_dir.record_config(str(w), run_dir.config_record(grpo.get_config("smoke")))
    return w


def test_refused_launches_leave_the_config_record_as_it_was(tmp_path):
    w = _finished_run(tmp_path)
    before = (w / "config.json").read_bytes()
    other = grpo.get_config("smoke")
    other.train.seed = 1
    with pytest.raises(run_dir.RunDirError, match="already holds checkpoints .latest step 2"):
        run_dir.claim(str(w), other)  # a new run into a finished one
    run_dir.unlock(str(w))
    other = grpo.get_config("smoke")
    other.optim.lr = 2e-3
    other.model.name = "1m"
    with pytest.raises(run_dir.RunDirError) as e:
        run_dir.claim(str(w), other, resume=True)
    run_dir.unlock(str(w))
    msg = str(e.value)
    lr = grpo.get_config("smoke").optim.lr
    assert "  model.name: 'tiny' -> '1m'\n" in msg and f"  optim.lr: {lr!r} -> 0.002\n" in msg
    assert "--allow_config_change=model.name,optim.lr" in msg
    with pytest.raises(run_dir.RunDirError, match="--allow_config_change=optim.lrr: no such"):
        run_dir.claim(str(w), other, resume=True, allow_changes=["optim.lrr"])
    run_dir.unlock(str(w))
    assert (w / "config.json").read_bytes() == before
    assert not (w / "config_changes.jsonl").exists()


def test_allowed_changes_are_recorded_beside_the_new_record(tmp_path):
    w = _finished_run(tmp_path)
    lr = grpo.get_config("smoke").optim.lr
    new = grpo.get_config("smoke")
    new.optim.lr = 2e-3
    assert run_dir.claim(str(w), new, resume=True, allow_changes=["optim.lr"]) == {
        "optim.lr": (lr, 2e-3)
    }
    run_dir.unlock(str(w))
    assert json.loads((w / "config.json").read_text())["optim"]["lr"] == 2e-3
    (row,) = [json.loads(x) for x in (w / "config_changes.jsonl").read_text().splitlines()]
    assert row["changes"] == {"optim.lr": {"old": lr, "new": 2e-3}}
    assert row["resumed_from_step"] == 2
    # Resuming again with the same config changes nothing more.
    assert run_dir.claim(str(w), new, resume=True) == {}
    run_dir.unlock(str(w))
    assert len((w / "config_changes.jsonl").read_text().splitlines()) == 1


def test_keys_new_since_the_record_are_taken_and_recorded_but_a_gone_key_is_refused(tmp_path):
    """A run recorded before an option existed resumes (the option's value recorded as a
    change from "(absent)"); a recorded key the config no longer has is a change to refuse."""
    w = _finished_run(tmp_path)
    old = json.loads((w / "config.json").read_text())
    ckpt = old["checkpoint"].pop("final")  # as recorded before checkpoint.final existed
    old["optim"]["retired_option"] = 1
    (w / "config.json").write_text(json.dumps(old))
    with pytest.raises(run_dir.RunDirError, match=r"optim.retired_option: 1 -> '\(absent\)'"):
        run_dir.claim(str(w), grpo.get_config("smoke"), resume=True)
    run_dir.unlock(str(w))
    del old["optim"]["retired_option"]
    (w / "config.json").write_text(json.dumps(old))
    changes = run_dir.claim(str(w), grpo.get_config("smoke"), resume=True)
    run_dir.unlock(str(w))
    assert changes == {"checkpoint.final": ("(absent)", ckpt)}
    (row,) = [json.loads(x) for x in (w / "config_changes.jsonl").read_text().splitlines()]
    assert row["changes"] == {"checkpoint.final": {"old": "(absent)", "new": ckpt}}


def test_resume_needs_a_checkpoint_and_a_workdir_must_be_a_directory(tmp_path):
    config = grpo.get_config("smoke")
    missing = tmp_path / "missing"
    with pytest.raises(run_dir.RunDirError, match="nothing to resume.*does not exist"):
        run_dir.claim(str(missing), config, resume=True)
    assert not missing.exists()  # the refusal created nothing
    (tmp_path / "empty").mkdir()
    with pytest.raises(run_dir.RunDirError, match="nothing to resume.*holds no checkpoint"):
        run_dir.claim(str(tmp_path / "empty"), config, resume=True)
    assert os.listdir(tmp_path / "empty") == []
    stopped = tmp_path / "stopped"  # killed before its first checkpoint was complete
    (stopped / "checkpoints" / "2.orbax-checkpoint-tmp-1").mkdir(parents=True)
    run_dir.record_config(str(stopped), run_dir.config_record(config))
    with pytest.raises(run_dir.RunDirError, match="stopped before its first checkpoint"):
        run_dir.claim(str(stopped), config, resume=True)
    none = tmp_path / "none"  # a finished run configured to write no checkpoint
    none.mkdir()
    config.checkpoint.update(every=0, final=False)
    run_dir.record_config(str(none), run_dir.config_record(config))
    with pytest.raises(run_dir.RunDirError, match=r"writes none \(checkpoint\.every=0, final="):
        run_dir.claim(str(none), config, resume=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(run_dir.RunDirError, match="file, not a directory"):
        run_dir.claim(str(tmp_path / "file"), config)


def test_config_diff_names_absent_keys():
    assert run_dir.config_diff({"a": {"b": 1, "c": [1, 2]}}, {"a": {"b": 1, "d": 2}}) == {
        "a.c": ([1, 2], "(absent)"),
        "a.d": ("(absent)", 2),
    }


def test_the_config_record_never_holds_a_key():
    c = grpo.get_config("smoke")
    c.judge.llm.api_key_env = "sk-" + "a1B2" * 10  # a key pasted where a variable's name goes
    record = run_dir.config_record(c)
    assert "a1B2" not in json.dumps(record)
    assert record["judge"]["llm"]["api_key_env"].startswith("<redacted")
