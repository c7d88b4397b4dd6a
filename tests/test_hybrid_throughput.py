"""benchmarks/hybrid_throughput.py on tiny shapes, so the benchmark cannot rot: it
runs both models end to end (train step and engine decode) and its figures agree with the shapes."""

from __future__ import annotations

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module():
    spec = importlib.util.spec_from_file_location(
        "hybrid_throughput", os.path.join(ROOT, "benchmarks", "hybrid_throughput.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dense_partner_has_the_closest_parameter_count():
    mod = _module()
    hybrid, dense = mod.shapes(256, 8)
    assert hybrid.layer_types.count("full_attention") == 2  # every 4th of 8
    target = hybrid.num_params()
    gap = abs(dense.num_params() - target)
    for n in (dense.num_hidden_layers - 1, dense.num_hidden_layers + 1):
        other = dense.__class__(**{**dense.__dict__, "num_hidden_layers": n})
        assert abs(other.num_params() - target) >= gap


@pytest.mark.slow  # ~30-60 s: both models' train step and decode compile
def test_tiny_run_prints_consistent_figures(capsys):
    import json

    mod = _module()
    argv = ["--hidden", "64", "--layers", "4", "--batch", "2", "--seq", "32", "--new", "4"]
    out = mod.main([*argv, "--rounds", "1"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    hybrid, dense = mod.shapes(64, 4)
    assert out["params_hybrid"] == hybrid.num_params()  # the config's count = the built model's
    assert out["params_dense"] == dense.num_params()
    assert out["hybrid_linear_layers"] == 3 and out["dense_layers"] == dense.num_hidden_layers
    for k in ("train_tokens_per_s_hybrid", "train_tokens_per_s_dense",
              "decode_tokens_per_s_hybrid", "decode_tokens_per_s_dense"):  # fmt: skip
        assert out[k] > 0
    assert (
        abs(out["ratio_train"] - out["train_tokens_per_s_hybrid"] / out["train_tokens_per_s_dense"])
        < 1e-2
    )
