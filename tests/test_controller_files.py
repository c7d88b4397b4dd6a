"""A resumed run's controllers' files against the manifest written with each checkpoint: a deleted
memory directory, a truncated event log, a store with fewer records are refused by name unless
``--rebuild_controller_files``; a damaged ChromaDB file is named."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from rubric_rl.metrics import read_metrics
from rubric_rl.runs import run_files
from tests.launch_env import launch_env, launch_train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_verify_names_a_missing_file_a_short_event_log_and_lost_records(tmp_path):
    root = str(tmp_path / "controllers")
    _write(f"{root}/harness/memory/chroma.sqlite3", "db")
    _write(f"{root}/harness/memory/chroma.sqlite3-wal", "transient")
    _write(f"{root}/arise.jsonl", "".join(json.dumps({"step": s}) + "\n" for s in range(8)))
    _write(f"{root}/arise.jsonl.tmp", "")
    saved = run_files.manifest(root, {"harness": {"memory time_records": 257}})
    assert saved == {
        "files": {"arise.jsonl": 8, "harness/memory/chroma.sqlite3": None},
        "records": {"harness": {"memory time_records": 257}},
    }
    assert run_files.verify(root, saved, {"harness": {"memory time_records": 257}}) == []
    # More rows or records than at the checkpoint (written after it, before the rollback ran
    # on them) are not a loss.
    assert run_files.verify(root, saved, {"harness": {"memory time_records": 300}}) == []
    # The event log cut to 3 rows (and a torn fourth line), the memory gone and re-created empty.
    _write(f"{root}/arise.jsonl", "".join(json.dumps({"step": s}) + "\n" for s in range(3)) + "{")
    os.remove(f"{root}/harness/memory/chroma.sqlite3")
    assert run_files.verify(root, saved, {"harness": {"memory time_records": 79}}) == [
        f"{root}/arise.jsonl: 3 rows, the checkpoint was written with 8",
        f"{root}/harness/memory/chroma.sqlite3: missing",
        f"{root}/harness: 79 memory time_records, the checkpoint was written with 257",
    ]
    assert run_files.verify(root, saved, {})[-1].startswith(f"{root}/harness: 0 memory")


# What these runs need not do (the controllers' files are the point): no warm start, no
# calibration pass, no OOD evaluation (the held-out one logs step 0).
LEAN = (
    "--config.warmstart.steps=0", "--config.calibration.enabled=False",
    "--config.eval.splits.ood=0",
)  # fmt: skip


def _resume(w, env, *extra, config="configs/harness_rl.py:smoke"):
    return subprocess.run(
        [
            sys.executable, "-m", "rubric_rl.launch", f"--config={config}", *LEAN,
            "--config.train.steps=2", "--config.checkpoint.every=1", f"--workdir={w}",
            "--resume", "--allow_config_change=train.steps", *extra,
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.e2e
def test_a_harness_resume_with_its_memory_deleted_is_refused_then_rebuilt_on_request(tmp_path):
    """Real processes: a 1-step HarnessRL smoke run, its memory directory deleted, ``--resume``
    for a second step. It used to exit 0 on an empty memory (the next step's metrics diverged);
    now it exits 1 naming the memory's files and its lost records, trains nothing, and with
    ``--rebuild_controller_files`` continues with one warning per difference."""
    pytest.importorskip("chromadb")
    w = tmp_path / "w"
    launch_train(w, 1, "--config=configs/harness_rl.py:smoke", *LEAN)
    with open(w / "checkpoints" / "1" / "run_state" / "metadata") as f:
        saved = json.load(f)["controller_files"]
    records = saved["records"]["harness"]
    assert records["memory time_records"] > 0 and "harness/memory/chroma.sqlite3" in saved["files"]
    shutil.rmtree(w / "controllers" / "harness" / "memory")
    env = launch_env(tmp_path / "jax_cache")

    refused = _resume(w, env)
    assert refused.returncode == 1, refused.stderr[-3000:]
    err = refused.stderr
    assert "the controllers' files do not match checkpoint step 1" in err
    # The database file is re-created empty when the controller opens its memory; the index
    # segments it had are named as missing, and the records it lost are counted.
    gone = [f for f in saved["files"] if f.startswith("harness/memory/") and "sqlite" not in f]
    assert gone, saved["files"]
    for f in gone:
        assert f"  {w}/controllers/{f}: missing\n" in err, err[-3000:]
    n = records["memory time_records"]
    assert (
        f"  {w}/controllers/harness: 0 memory time_records, the checkpoint was written with {n}\n"
        in err
    )
    assert "--rebuild_controller_files" in err
    assert [r["step"] for r in read_metrics(str(w / "metrics.jsonl"))] == [0, 1]

    rebuilt = _resume(w, env, "--rebuild_controller_files")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert "--rebuild_controller_files: continuing without" in rebuilt.stderr
    assert [r["step"] for r in read_metrics(str(w / "metrics.jsonl"))] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.e2e
def test_an_arise_resume_with_its_event_log_cut_short_is_refused_naming_it(tmp_path):
    """Real processes: a 1-step ARISE smoke run, its event log ``controllers/arise.jsonl`` cut to
    its first row, ``--resume`` for a second step. It used to exit 0 with the log silently short
    (its pool lifecycle and calibration gone, so aggregate.py left the run out); now it exits 1
    naming the file and both row counts, and trains nothing."""
    w = tmp_path / "w"
    launch_train(w, 1, "--config=configs/arise.py:smoke", *LEAN)
    with open(w / "checkpoints" / "1" / "run_state" / "metadata") as f:
        rows = json.load(f)["controller_files"]["files"]["arise.jsonl"]
    log = w / "controllers" / "arise.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    assert rows == len(lines) > 1, (rows, len(lines))
    log.write_text(lines[0])

    refused = _resume(w, launch_env(tmp_path / "jax_cache"), config="configs/arise.py:smoke")
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "the controllers' files do not match checkpoint step 1" in refused.stderr
    assert f"  {log}: 1 rows, the checkpoint was written with {rows}\n" in refused.stderr
    assert "--rebuild_controller_files" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert [r["step"] for r in read_metrics(str(w / "metrics.jsonl"))] == [0, 1]
    assert log.read_text() == lines[0]  # the evidence left as it was


def test_a_damaged_chroma_file_is_named(tmp_path):
    pytest.importorskip("chromadb")
    from rubric_rl.memory.embedder import make_embedder
    from rubric_rl.memory.store import HarnessMemory, HarnessMemoryError

    path = str(tmp_path / "memory")
    embedder = make_embedder("minilm")
    m = HarnessMemory(path, embedder, background_writes=False)
    m.record(1, "t", "group", {"x": 1})
    m.close()
    db = os.path.join(path, "chroma.sqlite3")
    with open(db, "r+b") as f:
        f.write(b"\xff" * 4096)  # the SQLite header and first page
    with pytest.raises(HarnessMemoryError) as e:
        HarnessMemory(path, embedder)
    msg = str(e.value)
    assert msg.startswith(f"{db}: the harness memory's ChromaDB failed while opening it: ")
    assert "InternalError" in msg and "--rebuild_controller_files" in msg
