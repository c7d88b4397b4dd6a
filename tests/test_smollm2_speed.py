"""benchmarks/smollm2_speed.py on a tiny Llama GGUF (written by tests/models/test_gguf.py's
writer), so the benchmark cannot rot: every part runs end to end (ours and transformers' decode
and train step, the bf16 and frozen-layer options, the step shape, the group prefill) and its
figures agree with each other."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("torch")
pytest.importorskip("gguf")


def _load(name: str, rel: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # ~1-2 min: four train steps and three engines compile
def test_tiny_run_prints_consistent_figures(tmp_path, capsys):
    writer = _load("test_gguf_writer", "tests/models/test_gguf.py")
    bench = _load("smollm2_speed", "benchmarks/smollm2_speed.py")
    path = str(tmp_path / "tiny.gguf")
    writer.write_gguf(path, qtype="Q8_0")
    argv = ["--model", path, "--prompt-bucket", "128", "--batch", "2", "--new", "4"]
    argv += ["--train-batch", "2", "--seq", "32", "--tasks", "2", "--rollouts", "2"]
    argv += ["--step-new", "4", "--trainable-layers", "1", "--rounds", "1"]
    out = bench.main(argv)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["model"] == path and out["params"] > 0
    for k in ("ours", "hf", "ours_bf16"):
        assert out[f"decode_tokens_per_s_{k}"] > 0
    for k in ("ours", "ours_top1", "ours_bf16", "hf"):
        assert out[f"train_tokens_per_s_{k}"] > 0
    # The ratios are of the unrounded times; tokens/s are printed to 0.1 (a few tokens/s for
    # transformers' generate on this tiny shape: per-call overhead), hence the tolerance.
    ratio = out["decode_tokens_per_s_ours"] / out["decode_tokens_per_s_hf"]
    assert out["ratio_decode"] == pytest.approx(ratio, rel=0.1)
    ratio = out["train_tokens_per_s_ours"] / out["train_tokens_per_s_hf"]
    assert out["ratio_train"] == pytest.approx(ratio, rel=0.1)
    train = 2 * 2 * (128 + 4) / out["train_tokens_per_s_ours"]
    assert out["step_train_s_est"] == pytest.approx(train, abs=0.06)
    assert out["step_s_est"] == pytest.approx(out["step_rollout_s"] + train, abs=0.11)
    assert out["prefill_s_all_rows"] > 0 and out["prefill_s_one_per_task"] > 0
