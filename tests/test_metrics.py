"""Run-directory logging: metrics.jsonl rows, TensorBoard events, rollouts, secrets scrubbed."""

import glob
import json
import os

import numpy as np

from rubric_rl import metrics as M


def test_metrics_jsonl_rows_tb_and_truncate(tmp_path):
    w = M.MetricsWriter(str(tmp_path))
    for s in range(1, 4):
        w.write(s, {"reward/mean": np.float32(0.5 * s), "n": np.int64(s), "api_key": "sk-x"})
    rows = M.read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["reward/mean"] == 1.0 and rows[2]["n"] == 3
    assert all("api_key" not in r for r in rows)
    w.truncate_after(2)
    w.write(3, {"reward/mean": 9.0})
    w.close()
    rows = M.read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 0.5), (2, 1.0), (3, 9.0)]
    if w.tensorboard_enabled:
        assert glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))


def test_torn_last_line_is_ignored(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"step": 1, "a": 1}) + "\n" + '{"step": 2, "a"')
    assert M.read_metrics(str(p)) == [{"step": 1, "a": 1}]


def test_scrub_keeps_token_counts_drops_credentials():
    d = {
        "tokens/s": 3.0,
        "max_tokens": 5,
        "api_key_env": "OPENAI_API_KEY",
        "nested": {"authorization": "Bearer x", "Token": "t", "ok": 1},
    }
    assert M.scrub(d) == {
        "tokens/s": 3.0,
        "max_tokens": 5,
        "api_key_env": "OPENAI_API_KEY",
        "nested": {"ok": 1},
    }


def test_rollout_and_controller_logs(tmp_path):
    r = M.RolloutLogger(str(tmp_path))
    path = r.write(7, [{"task": "t1", "response": "a b", "verdicts": {"c1": True, "c2": None}}])
    assert os.path.basename(path) == "step_000007.jsonl.gz"
    assert M.read_rollouts(path) == [
        {"task": "t1", "response": "a b", "verdicts": {"c1": True, "c2": None}}
    ]
    c = M.ControllerLog(str(tmp_path), "pool")
    c.log(1, "add", rubric="x")
    c.log(2, "retire", rubric="x")
    c.truncate_after(1)
    assert M.read_metrics(c.path) == [{"step": 1, "event": "add", "rubric": "x"}]


def test_summary_line_formats_headline_numbers():
    line = M.summary_line(5, {"reward/mean": 0.61234, "loss": float("nan"), "other": 3})
    assert line == "step 5 | r 0.612 | loss nan"


def test_non_primary_processes_write_nothing(tmp_path):
    """Multi-host: processes other than 0 compute the same rows but leave the run dir alone."""
    w = M.MetricsWriter(str(tmp_path / "run"), tensorboard=True, primary=False)
    row = w.write(3, {"reward/mean": 0.5})
    assert row == {"step": 3, "reward/mean": 0.5}
    w.truncate_after(1)
    w.close()
    M.RolloutLogger(str(tmp_path / "run"), primary=False).write(3, [{"response": "a"}])
    c = M.ControllerLog(str(tmp_path / "run"), "pool", primary=False)
    c.log(3, "add", rubric="x")
    c.truncate_after(1)
    assert not (tmp_path / "run").exists()
    # The primary writes all three where the others did not.
    M.MetricsWriter(str(tmp_path / "run"), tensorboard=False).write(3, {"reward/mean": 0.5})
    M.ControllerLog(str(tmp_path / "run"), "pool").log(3, "add")
    assert sorted(os.listdir(tmp_path / "run")) == ["controllers", "metrics.jsonl"]


def _tb_scalars(tb_dir, tag):
    """{step: value} of ``tag`` as TensorBoard shows it: event files in name order, and a
    SessionLog START at step s (``purge_step``) discards the events of steps >= s read before."""
    import struct

    from tensorboardX.proto import event_pb2

    shown = {}
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        data, i = open(path, "rb").read(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            e = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            if e.HasField("session_log") and e.session_log.status == e.session_log.START:
                shown = {s: v for s, v in shown.items() if s < e.step}
            for v in e.summary.value:
                if v.tag == tag:
                    shown.setdefault(e.step, []).append(v.simple_value)
    return shown


def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path):
    import time

    killed = M.MetricsWriter(str(tmp_path))
    if not killed.tensorboard_enabled:
        import pytest

        pytest.skip("tensorboardX is not installed")
    killed.truncate_after(-1)  # a fresh run, as the trainer starts one
    for s in (1, 2, 3):
        killed.write(s, {"reward/mean": float(s)})
    killed.close()  # killed after step 3; its checkpoint is at step 1
    time.sleep(1.1)  # a later process: event file names carry the second
    resumed = M.MetricsWriter(str(tmp_path))
    resumed.truncate_after(1)
    for s in (2, 3):
        resumed.write(s, {"reward/mean": 10.0 * s})
    resumed.close()
    assert _tb_scalars(str(tmp_path / "tb"), "reward/mean") == {1: [1.0], 2: [20.0], 3: [30.0]}


def test_log_lines_print_above_the_progress_bar(tmp_path):
    import io

    from absl import logging as absl_logging

    out = io.StringIO()
    bar = M.progress_bar(3, enabled=True, file=out)
    bar.update(1)
    with M.logs_above(bar):
        absl_logging.warning("a log line")
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "a log line\n" in text
    line = text[: text.index("a log line")].split("\n")[-1]
    # The bar was cleared before the line was printed: nothing of it precedes the log line.
    assert line.split("\r")[-1].startswith("W") and "train:" not in line.split("\r")[-1], line
    assert "2/3" in text[text.index("a log line") :]  # and redrawn after it


def test_run_start_up_does_not_import_torch(tmp_path):
    """A launch's tokenizer (the embedded kind: a plain fast tokenizer directory) and its
    TensorBoard writer load without torch, which neither uses (torch's import was 2.8 s of a
    run's start-up), and the events still decode."""
    import subprocess
    import sys

    from configs import grpo
    from rubric_rl.config.builders import build_domain, build_tokenizer

    config = grpo.get_config("smoke")
    build_tokenizer(config, build_domain(config), str(tmp_path))  # writes <tmp>/tokenizer
    script = (
        "import sys\n"
        "from rubric_rl.metrics import MetricsWriter\n"
        "from rubric_rl.models import Tokenizer\n"
        f"tok = Tokenizer({str(tmp_path / 'tokenizer')!r})\n"
        "assert tok.eos_id is not None and tok.encode('<|user|>') == [tok.vocab()['<|user|>']]\n"
        f"w = MetricsWriter({str(tmp_path / 'run')!r})\n"
        "w.write(1, {'reward/mean': 0.25}); w.write(2, {'reward/mean': 0.5}); w.close()\n"
        "assert w.tensorboard_enabled\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout
    shown = _tb_scalars(str(tmp_path / "run" / "tb"), "reward/mean")
    assert shown == {1: [0.25], 2: [0.5]}, shown
