"""benchmarks/aot_fit.py: the train step compiled ahead of time from abstract state, its
per-device figures against counts written here from the shapes, the before -> after programs,
and the compiled attention keeping the batch sharded."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "aot_fit.py")
spec = importlib.util.spec_from_file_location("aot_fit_under_test", SCRIPT)
aot_fit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(aot_fit)


def _run(*argv):
    return aot_fit.main(["--target=cpu", *argv])


ONE_DEVICE_ROWS, ONE_DEVICE_SEQ = 8, 32


@pytest.fixture(scope="module")
def one_device():
    """The tiny preset's step on one device, compiled from abstract state and then run once
    (``--measure``): read by the hand count and by the measured step."""
    return _run(
        "--config=configs/grpo.py:gpu", "--model=tiny", "--devices=1", "--mesh=1,1,1",
        f"--rows={ONE_DEVICE_ROWS}", f"--seq={ONE_DEVICE_SEQ}", "--micro-batches=2", "--remat=full",
        "--measure",
    )  # fmt: skip


def test_arguments_equal_a_hand_count_on_one_device(one_device):
    """One device, the gpu variant's dtypes (bf16 compute, float32 master weights, bf16 KL
    reference) on the tiny preset: the compiled program's argument bytes are the state, the
    reference and the batch counted by hand — 4 B/param of weights, 8 of AdamW's moments, 2 of
    the bf16 reference, AdamW's and the schedule's int32 counts, the step counter, and per row
    3 int32 + 2 float32 [T] arrays and 2 float32 scalars."""
    from rubric_rl.models import PRESETS

    rows, seq, r = ONE_DEVICE_ROWS, ONE_DEVICE_SEQ, one_device
    n = PRESETS["tiny"].num_params()
    # --micro-batches and --remat, not the gpu variant's 8 and "dots"
    assert (r["micro_batches"], r["micro_rows"], r["remat"]) == (2, rows // 2, "full")
    assert r["params"] == n and r["kl_ref_dtype"] == "bfloat16"
    batch = rows * seq * (3 * 4 + 2 * 4) + rows * 2 * 4
    counts = 2 * 4  # scale_by_adam's count, the lr schedule's count
    assert r["argument_parts"] == {
        "params": 4 * n,
        "opt_state": 8 * n + counts,
        "step_and_rest": 4,
        "ref": 2 * n,
        "batch": batch,
    }
    assert r["argument_bytes"] == 4 * n + 8 * n + counts + 4 + 2 * n + batch
    # The new state is written over the donated old one.
    assert r["alias_bytes"] >= 12 * n
    assert r["peak_bytes"] == (
        r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
    )
    assert r["temp_bytes"] > 0 and r["fits_pool"] is None  # a CPU target has no memory figure


EIGHT_DEVICES = ["--config=configs/grpo.py:gpu", "--model=tiny", "--rows=64", "--seq=64"]


@pytest.fixture(scope="module")
def fused_on_eight_devices():
    """(result, the fused attention's keyword arguments per call): the tiny preset's step for 8
    fsdp devices with the fused attention path taken (jax's XLA implementation standing in for
    cuDNN on CPU). Read by the attention test and, as the "after" program, by the fsdp test (the
    attention path changes no argument's shape or sharding)."""
    from rubric_rl.models import qwen3

    fused = qwen3.fused_attention
    calls = []

    def xla(q, k, v, mask, impl, **kw):
        calls.append(kw)
        return fused(q, k, v, mask, "xla", **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(qwen3, "_use_fused", lambda impl, q: True)
        mp.setattr(qwen3, "fused_attention", xla)
        return _run(*EIGHT_DEVICES), calls


def test_fsdp_splits_the_state_and_the_embedding(fused_on_eight_devices):
    """8 fsdp devices: every parameter of the tiny preset divides by 8 (the embedding's
    vocabulary too), so each device holds an eighth of the weights and moments; the --before
    program replicates the embedding (its vocabulary on "tensor" alone)."""
    from rubric_rl.models import PRESETS

    cfg = PRESETS["tiny"]
    n = cfg.num_params()
    after, _ = fused_on_eight_devices
    assert after["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    norms = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size + 2 * cfg.num_hidden_layers * (
        cfg.head_dim
    )  # replicated RMSNorm scales (input, post-attention, final; q and k norms)
    assert after["argument_parts"]["params"] == 4 * ((n - norms) // 8 + norms)
    before = _run(*EIGHT_DEVICES, "--before")
    table = cfg.vocab_size * cfg.hidden_size
    assert before["argument_parts"]["params"] - after["argument_parts"]["params"] == (
        4 * (table - table // 8)
    )
    # The reference: bf16 after (2 B/param), float32 before (as the weights).
    assert 2 * after["argument_parts"]["ref"] == after["argument_parts"]["params"]
    assert before["kl_ref_dtype"] == "float32"
    assert before["argument_parts"]["ref"] == before["argument_parts"]["params"]


def test_gated_deltanet_backward_keeps_less_than_the_loop(monkeypatch):
    """Qwen3.5's tiny preset cut to its first layer (one Gated DeltaNet layer: the property is
    per layer, and each layer is compiled) at 512 tokens: the --before program (autodiff of the
    triangular solve's loop: its carry at each of 64 steps) needs more temporary memory than the
    custom backward; the difference is at least the loop's saved carries of the layer."""
    from rubric_rl.models import qwen3_5_config

    tiny = qwen3_5_config.ALL_PRESETS["qwen3_5_tiny"]
    assert tiny.layer_types[0] == "linear_attention"
    one_layer = dataclasses.replace(tiny, num_hidden_layers=1, layer_types=tiny.layer_types[:1])
    monkeypatch.setitem(qwen3_5_config.ALL_PRESETS, "qwen3_5_tiny_one_layer", one_layer)
    argv = ["--config=configs/grpo.py:gpu", "--model=qwen3_5_tiny_one_layer", "--rows=8",
            "--seq=512", "--devices=1", "--mesh=1,1,1"]  # fmt: skip
    after = _run(*argv)
    before = _run(*argv, "--before")
    # The rhs of the solve: [B, H, N, C, dv + dk] float32 (B a micro-batch's rows); the loop
    # keeps 64 of them.
    b, h, n, c, d = after["micro_rows"], 4, 512 // 64, 64, 16 + 16
    carry = b * h * n * c * d * 4
    assert before["temp_bytes"] - after["temp_bytes"] >= 32 * carry, (before, after)


def test_model_attention_keeps_the_batch_sharded_on_cpu_devices(fused_on_eight_devices):
    """The fused path (jax's XLA implementation standing in for cuDNN on CPU) compiled for 8
    fsdp devices: no all-gather of a whole micro-batch of q, k or v."""
    r, calls = fused_on_eight_devices
    assert calls and all(kw == {"causal_padding": True} for kw in calls)
    assert r["micro_rows"] == 64 // r["micro_batches"] == 8
    assert r["qkv_batch_gathers"] == 0


def test_measure_runs_one_real_step_beside_the_estimate(one_device):
    """--measure: the same step with real (random) weights and batch on the attached devices;
    CPU devices keep no allocator statistics, so the measured peak is None there."""
    r = one_device
    assert math.isfinite(r["measured_loss"]) and r["measured_step_s"] > 0
    assert r["measured_device"] == "cpu" and r["measured_peak_bytes"] is None


def test_qkv_batch_gathers_counts_only_whole_micro_batches():
    hlo = "\n".join(
        [
            "%a = bf16[16,2048,32,128]{3,2,1,0} all-gather(%x), dimensions={0}",
            "%b = (bf16[2,2048,8,128]{3,2,1,0}, bf16[16,2048,8,128]{3,2,1,0}) all-gather-start(%y)",
            "%c = bf16[16,2048,32,128]{3,2,1,0} all-gather-done(%b)",
            "%d = f32[2560,9216]{1,0} all-gather(%w), dimensions={0}",
            "%e = bf16[16,2048,32,128]{3,2,1,0} copy(%a)",
        ]
    )
    assert aot_fit.qkv_batch_gathers(hlo, 16, 2048) == 2
    assert aot_fit.collective_counts(hlo)["all-gather"] == 3


def test_table_renders_each_row_once(tmp_path):
    line = {
        "config": "configs/grpo.py:gpu", "model": "qwen3_4b", "devices": 8, "before": False,
        "kl_ref_dtype": "bfloat16", "remat": "dots",
        "mesh": {"data": 1, "fsdp": 8, "tensor": 1}, "rows": 128,
        "seq": 2048, "micro_rows": 16, "peak_gib": 31.6, "pool_bytes": int(59.3 * 2**30),
        "fits_pool": True, "fits_device": True, "qkv_batch_gathers": 0,
        "target_used": "cuda (compile-only h100 topology)",
    }  # fmt: skip
    path = tmp_path / "r.jsonl"
    newer = dict(line, peak_gib=30.0)  # the same row measured again: the newer line wins
    full = dict(line, remat="full", peak_gib=12.5)  # another setting: a row of its own
    path.write_text("\n".join(json.dumps(x) for x in (line, newer, full)) + "\n")
    out = aot_fit.table(str(path)).splitlines()
    assert len(out) == 4
    assert out[2] == (
        "| `grpo.py:gpu` | qwen3_4b | 8 (1/8/1) | 128 x 2048 (16) | dots | no | 30.0 | 59.3 | yes "
        "| yes | 0 | cuda |"
    )
    assert out[3].startswith("| `grpo.py:gpu` | qwen3_4b | 8 (1/8/1) | 128 x 2048 (16) | full |")


def _cuda_plugin() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


@pytest.mark.skipif(not _cuda_plugin(), reason="needs jax's CUDA plugin (setup.py's gpu extra)")
def test_cudnn_attention_compiled_for_8_h100s_keeps_the_batch_sharded():
    """The target compile (8 compile-only H100s, cuDNN's kernel): the model's padding-causal
    path keeps q, k, v sharded over the batch; the per-call `lax.cond` between the two paths
    (what `fused_attention` does without ``causal_padding``) all-gathers them."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from rubric_rl.core import sharding
    from rubric_rl.models import qwen3

    devices, kind = aot_fit.target_devices("h100", 8)
    assert kind.startswith("cuda"), kind
    mesh = sharding.make_mesh(1, 8, 1, devices=devices)
    rows = NamedSharding(mesh, P(sharding.BATCH_AXES))
    b, t = 16, 1024

    def gathers(causal_padding):
        def loss(q, k, v, am):
            _, mask, _ = qwen3.full_sequence_inputs(am, None, am)
            o = qwen3.fused_attention(q, k, v, mask, "cudnn", causal_padding=causal_padding)
            return jnp.sum(o.astype(jnp.float32) ** 2)

        fn = jax.jit(jax.grad(loss, (0, 1, 2)), in_shardings=(rows,) * 4)
        q = jax.ShapeDtypeStruct((b, t, 8, 128), jnp.bfloat16)
        kv = jax.ShapeDtypeStruct((b, t, 2, 128), jnp.bfloat16)
        am = jax.ShapeDtypeStruct((b, t), jnp.int32)
        return aot_fit.qkv_batch_gathers(fn.lower(q, kv, kv, am).compile().as_text(), b, t)

    assert gathers(True) == 0
    assert gathers(False) > 0
