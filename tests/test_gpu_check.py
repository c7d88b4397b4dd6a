"""benchmarks/gpu_check.py's CPU mode, so the one-shot GPU script cannot rot.

One subprocess runs every part on the tiny shapes; the figures are checked against each other and
against values recomputed here from the shapes (not read back from the script's own formulas).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from tests.launch_env import suite_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")
# ~60-90 s on the 2-core machine: the train step, engine and Trainer compile once each.
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # conftest forces 8 host devices; the device machine has one GPU, so the script sees one.
    # The suite's compile flags (conftest.py): no figure is checked for speed.
    env["XLA_FLAGS"] = suite_xla_flags()
    env["PYTHONPATH"] = ROOT
    return env


def _run(*args: str, timeout: float = 900) -> dict:
    proc = subprocess.run(
        [sys.executable, SCRIPT, *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stdout[-2000:]  # exactly one JSON line
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "out.json"
    r = _run("--mode=cpu", f"--out={out}")
    with open(out) as f:
        assert json.loads(f.read()) == r  # --out holds the same line
    return r


def _tiny():
    from rubric_rl.models.qwen3 import PRESETS

    return PRESETS["tiny"]


def test_every_part_ran_without_error(result):
    parts = ("parity", "attention", "logprob_memory", "train_step", "decode", "loop")
    for name in parts:
        r = result[name]
        assert r["ok"] is True and "error" not in r and "skipped" not in r, (name, r)
        assert r["wall_s"] > 0
    assert result["env"]["mode"] == "cpu" and result["env"]["backend"] == "cpu"
    assert result["env"]["versions"]["jax"]
    assert result["wall_s"] >= sum(result[p]["wall_s"] for p in parts)


def test_parity_bf16_close_to_float32_and_not_identical(result):
    p = result["parity"]
    assert p["same_parameters"] and p["finite_all_positions"]
    # bf16 compute really ran (a float32 model would give exactly 0), and stays close.
    assert 0 < p["logsoftmax_max_abs_err"] < 0.05
    assert p["logsoftmax_mean_abs_err"] <= p["logsoftmax_max_abs_err"]
    # rel = err / max(|lp|, 1) <= err; on a 512-word vocabulary |lp| ~ log 512 makes it smaller.
    assert 0 < p["logsoftmax_max_rel_err"] <= p["logsoftmax_max_abs_err"]
    assert 0.8 <= p["argmax_agreement"] <= 1.0
    assert 0 <= p["kl_f32_bf16_mean"] < 1e-3
    assert p["shape"]["padded_rows"] == p["shape"]["seq"] // 4


def test_attention_padded_rows_match_reference(result):
    a = result["attention"]
    s = a["shape"]
    # Rows with no key: row 0 left-padded by T/4, the last row by T/2 (causal mask).
    assert a["masked_rows"] == s["seq"] // 4 + s["seq"] // 2
    names = {"model_xla", "model_xla_causal_blocks_4", "jax_xla"}
    assert names <= set(a)
    for name in names:
        r = a[name]
        assert r["ok"] and r["finite"] and r["grads_finite"], (name, r)
        # bf16 output vs the float64 reference: not exact, within the stated tolerance.
        assert 0 < r["max_abs_err_real_rows"] <= a["tolerance"] == 0.02, (name, r)
        assert 0 <= r["grad_max_rel_err"] <= 0.05, (name, r)
        assert r["fwd_bwd_ms"] > 0
    assert a["all_ok"]


def test_logprob_memory_chunked_below_naive(result):
    m = result["logprob_memory"]
    s = m["shape"]
    naive = s["batch"] * s["seq"] * s["vocab"] * 4
    assert m["naive_bytes_BTV4"] == naive
    assert 0 < m["chunked_temp_bytes"] < naive
    # The unchunked log-softmax materialises [B, T, V] float32 logits (and their gradient).
    assert m["unchunked_temp_bytes"] >= naive
    assert m["sd_full_chunked_temp_bytes"] > m["chunked_temp_bytes"]  # teacher logits too
    assert math.isclose(m["ratio_to_naive"], m["chunked_temp_bytes"] / naive, rel_tol=1e-3)
    assert result["goals"]["logprob_temp_le_0.25_naive"] == (m["ratio_to_naive"] <= 0.25)


def test_train_step_figures_consistent(result):
    cfg = _tiny()
    r = result["train_step"]["tiny"]
    b, t = r["batch"], r["seq"]
    assert r["tokens_per_step"] == b * t
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    h, kv, n_layers = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    n = n_layers * (d * h * hd * 2 + 2 * d * kv * hd + 3 * d * f) + d * cfg.vocab_size
    assert r["matmul_params"] == n
    flops = 8 * n * b * t + 8 * n_layers * h * hd * t * t * b
    assert math.isclose(r["model_tflops_per_s"] * 1e12 * r["step_s"], flops, rel_tol=1e-3)
    assert math.isclose(r["tokens_per_s"] * r["step_s"], b * t, rel_tol=1e-3)
    assert r["step_s"] == min(r["step_s_all"]) and len(r["step_s_all"]) == 2
    assert math.isfinite(r["loss"]) and r["sd_kl"] > 0  # SD ran: the teacher context differs
    # the default policy reached the model; a CPU device reports no allocator statistics
    assert r["remat"] == "dots" and r["peak_bytes_in_use"] is None
    assert r["mfu_reference"] == "measured_matmul" and r["mfu"] == r["ratio_to_measured_matmul"]
    assert 0 < r["mfu"] < 1.5
    assert result["goals"]["train_step_mfu_ge_0.45"] == {"tiny": False}  # no datasheet on CPU


def test_decode_counts_and_bound(result):
    cfg = _tiny()
    r = result["decode"]
    assert r["batch"] == 64 and r["tokens"] == 64 * r["max_new_tokens"]  # ignore_eos
    assert math.isclose(r["tokens_per_s"] * r["generate_s"], r["tokens"], rel_tol=1e-3)
    assert r["weight_bytes"] == 4 * cfg.num_params()  # float32, tied embedding counted once
    slot = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    assert (
        r["kv_bytes_per_step_full_cache"] == 64 * (r["prompt_len"] + r["max_new_tokens"] - 1) * slot
    )
    bound = (
        64
        * r["measured_bandwidth_bytes_s"]
        / (r["weight_bytes"] + r["kv_bytes_per_step_full_cache"])
    )
    assert math.isclose(r["bound_tok_s_measured"], bound, rel_tol=1e-3)
    assert r["bound_live_tok_s_measured"] > r["bound_tok_s_measured"]
    assert 0 < r["ratio_to_bound_measured"]
    assert r["compiles"] == 1  # one static shape, compiled once across the timed runs


def test_loop_recorded_every_step(result):
    r = result["loop"]
    assert r["steps_requested"] == 3 and r["steps_recorded"] == 3
    assert r["step_numbers"] == [1, 2, 3]
    assert r["all_losses_finite"] and len(r["losses"]) == 3
    assert all(s is not None and s > 0 for s in r["step_s"])
    assert r["rollouts_per_step"] == 8 and r["dtype"] == "float32"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_budget_skips_parts_with_a_reason(tmp_path, capsys):
    out = tmp_path / "out.json"
    r = _module().main(["--mode=cpu", "--parts=parity,decode", "--budget-s=0", f"--out={out}"])
    for name in ("parity", "decode"):
        assert r[name]["ok"] is False and r[name]["skipped"].startswith("budget:")
    assert "train_step" not in r and r["goals"]["logprob_temp_le_0.25_naive"] is None
    assert json.loads(capsys.readouterr().out) == r == json.loads(out.read_text())


def test_unknown_part_is_an_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        _module().parse_args(["--parts=parity,bogus"])
    assert "--parts: unknown ['bogus']" in capsys.readouterr().err
