"""benchmarks/smollm2_speed.py on a tiny Llama GGUF (written by tests/models/test_gguf.py's
writer), so the benchmark cannot rot: every part runs end to end (ours and transformers' decode
and train step, the bf16 and frozen-layer options, the step shape, the group prefill) and its
figures agree with each other. Two runs, each compiling its stages once: decode and train (both
sides), then the step alone (ours only, no transformers model loaded)."""

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


@pytest.fixture(scope="module")
def bench():
    return _load("smollm2_speed", "benchmarks/smollm2_speed.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    writer = _load("test_gguf_writer", "tests/models/test_gguf.py")
    path = str(tmp_path_factory.mktemp("smollm2_speed") / "tiny.gguf")
    writer.write_gguf(path, qtype="Q8_0")
    return path


@pytest.mark.slow  # ~1 min: two engines and three train steps compile, transformers' model loads
def test_decode_and_train_print_consistent_figures(bench, tiny, capsys):
    """``--stages`` in any order runs them in the benchmark's order; decode and train figures
    of every runner, and the ratios of the unrounded times."""
    argv = ["--model", tiny, "--prompt-bucket", "128", "--batch", "2", "--new", "4"]
    argv += ["--train-batch", "2", "--seq", "32", "--trainable-layers", "1", "--rounds", "1"]
    out = bench.main(argv + ["--stages", "train,decode"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["model"] == tiny and out["params"] > 0
    assert out["stages"] == ["decode", "train"] and "step_s" not in out
    assert out["load_s_transformers"] >= 0
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


@pytest.mark.slow  # ~1 min: three engines and four train steps compile
def test_step_alone_prints_consistent_figures(bench, tiny, capsys):
    """``--stages step`` measures the step alone (no transformers model is loaded), its parts
    adding up to each variant's step time; a stage name outside the three is an error naming
    the flag."""
    argv = ["--model", tiny, "--prompt-bucket", "128", "--tasks", "2", "--rollouts", "3"]
    argv += ["--step-new", "4", "--trainable-layers", "1", "--step-micro-batches", "2"]
    out = bench.main(argv + ["--stages", "step"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["stages"] == ["step"]
    assert "load_s_transformers" not in out and "ratio_decode" not in out
    assert "ratio_train" not in out
    # The step: 2 tasks x 3 rollouts; group prefill prefills 2 prompt rows, not 6.
    assert out["step_train_tokens"] == 2 * 3 * (128 + 4)
    assert out["step_prefill_rows_group_prefill"] == 2
    assert out["step_prefill_rows_no_group_prefill"] == 6
    r, t = out["step_rollout_s_default"], out["step_train_s_default"]
    assert out["step_s"] == pytest.approx(r + t, abs=0.011)
    assert out["step_s_no_group_prefill"] == pytest.approx(
        out["step_rollout_s_no_group_prefill"] + t, abs=0.011
    )
    assert out["step_s_top1"] == pytest.approx(r + out["step_train_s_top1"], abs=0.011)
    assert out["step_s_bf16"] == pytest.approx(
        out["step_rollout_s_bf16"] + out["step_train_s_bf16"], abs=0.011
    )
    assert out["step_s_all_options"] == pytest.approx(
        out["step_rollout_s_bf16"] + out["step_train_s_bf16_top1"], abs=0.011
    )
    # The ratio is of the unrounded times; the printed times are rounded to 0.01 s, so the
    # ratio must lie within what those roundings allow (tiny steps here: a wide interval).
    s, s1, h = out["step_s"], out["step_s_top1"], 0.005
    assert (s - h) / (s1 + h) - 1e-3 <= out["ratio_step_top1"] <= (s + h) / (s1 - h) + 1e-3
    with pytest.raises(ValueError, match="--stages"):
        bench.main(argv + ["--stages", "decode,prefill"])
