"""benchmarks/remat_memory.py: what each remat policy keeps per decoder layer, against counts
written here from the layer's shapes (not read back from the script's own formulas)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "remat_memory.py")
spec = importlib.util.spec_from_file_location("remat_memory_under_test", SCRIPT)
remat_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(remat_memory)


def _cfg(preset):
    from rubric_rl.models.qwen3 import PRESETS

    return PRESETS[preset]


@pytest.mark.parametrize("preset", ["tiny", "qwen2_tiny"])
@pytest.mark.parametrize("dtype,itemsize", [("float32", 4), ("bfloat16", 2)])
def test_kept_bytes_per_policy(preset, dtype, itemsize):
    cfg = _cfg(preset)
    b, t = 2, 24
    out = remat_memory.remat_memory(preset, b, t, dtype, attention="xla", device_gib=1.0)
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    h, kv, layers = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    p = out["policies"]
    # "full": nothing inside the layer is kept; its input is (every policy).
    assert p["full"]["kept_per_layer_bytes"] == 0 and p["full"]["scores_per_layer_bytes"] == 0
    # "dots": the outputs of q, k, v, o, gate and up projections, in the compute dtype; the down
    # projection's output is not kept (it only feeds the residual add, the layer's output), and
    # QK^T / PV (batch dims: heads) are recomputed.
    assert (
        p["dots"]["kept_per_layer_bytes"] == b * t * (h * hd + 2 * kv * hd + d + 2 * f) * itemsize
    )
    assert p["dots"]["scores_per_layer_bytes"] == 0
    # "none": everything, including the XLA path's [T, T] scores (float32 probabilities at least).
    none = p["none"]
    assert none["scores_per_layer_bytes"] >= b * h * t * t * 4
    assert none["scores_per_layer_bytes"] % (t * t) == 0
    assert (
        none["kept_per_layer_bytes"] - none["scores_per_layer_bytes"]
        > p["dots"]["kept_per_layer_bytes"]
    )
    layer_input = b * t * d * itemsize
    assert out["layer_input_bytes"] == layer_input
    for name in ("full", "dots", "none"):
        kept = p[name]["kept_per_layer_bytes"]
        transient = none["kept_per_layer_bytes"] - kept
        assert p[name]["activation_bytes"] == layers * (layer_input + kept) + transient
        assert p[name]["total_bytes"] == p[name]["activation_bytes"] + 16 * cfg.num_params()
        assert p[name]["ratio_to_device"] == round(p[name]["total_bytes"] / 2**30, 4)
    assert (
        p["full"]["activation_bytes"]
        < p["dots"]["activation_bytes"]
        < p["none"]["activation_bytes"]
    )


def test_cudnn_leaves_the_scores_out_and_fsdp_divides_the_state():
    xla = remat_memory.remat_memory("tiny", 2, 24, "float32", attention="xla")
    cudnn = remat_memory.remat_memory("tiny", 2, 24, "float32", attention="cudnn", fsdp=4)
    scores = xla["policies"]["none"]["scores_per_layer_bytes"]
    layers = _cfg("tiny").num_hidden_layers
    assert cudnn["policies"]["none"]["activation_bytes"] == (
        xla["policies"]["none"]["activation_bytes"] - layers * scores
    )
    # full remat: the transient (one layer's "none" residuals) loses the scores once
    assert cudnn["policies"]["full"]["activation_bytes"] == (
        xla["policies"]["full"]["activation_bytes"] - scores
    )
    assert cudnn["state_bytes"] == xla["state_bytes"] // 4 and cudnn["fsdp"] == 4


def test_cli_prints_one_line_and_names_bad_flags(capsys):
    """The script as a process prints one line; a bad flag is argparse's usage error (exit
    status 2) naming the flag (checked in this process: ``main`` is what the script runs)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run(
        [sys.executable, SCRIPT, "--preset=tiny", "--batch=2", "--seq=16", "--device-gib=80"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    lines = ok.stdout.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["benchmark"] == "remat_memory"
    for bad, flag in (
        ("--preset=nope", "--preset"),
        ("--batch=0", "--batch"),
        ("--attention=flash", "--attention"),
        ("--dtype=float77", "--dtype"),
    ):
        with pytest.raises(SystemExit) as exit_:
            remat_memory.main([bad])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and flag in err, (bad, err[-500:])


def test_gpu_variant_remat_fits_eight_80gb_devices():
    """configs/grpo.py:gpu's remat against its own micro-batch: Qwen3-4B (the default checkpoint)
    on 8 devices of 80 GiB, rows of the longest prompt + completion. Its policy leaves most of the
    memory to the LM head, the teacher and XLA; "none" would not fit jax's default pool (75 %)."""
    from configs import grpo

    c = grpo.get_config("gpu")
    update = c.rollout.samples_per_task * c.rollout.tasks_per_step // c.optim.mini_batches
    rows = update // c.optim.num_micro_batches
    seq = c.model.max_prompt_len + c.rollout.max_new_tokens
    out = remat_memory.remat_memory(
        "qwen3_4b", rows // 8, seq, c.model.dtype, attention="cudnn", device_gib=80, fsdp=8
    )
    assert out["policies"][c.model.remat]["ratio_to_device"] < 0.5
    assert out["policies"]["none"]["ratio_to_device"] > 0.75
