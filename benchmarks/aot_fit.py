r"""Ahead-of-time fit of a method's train step on a described target; prints ONE JSON line.

    python benchmarks/aot_fit.py --config=configs/grpo.py:gpu --model=qwen3_4b     # 8 x H100
    python benchmarks/aot_fit.py --config=configs/grpo.py:gpu --model=qwen3_5_27b --devices=16
    python benchmarks/aot_fit.py --config=configs/grpo.py:gpu --model=qwen3_5_4b --before
    python benchmarks/aot_fit.py --config=configs/grpo.py:smoke --model=tiny --target=cpu
    python benchmarks/aot_fit.py --table benchmarks/results/aot_fit.jsonl   # the docs' table

The train step of ``--config`` (any method's config file and variants) is built with abstract
state only (``nnx.eval_shape``: shapes and dtypes, no weights), lowered with the shardings the
trainer uses, and compiled by XLA for the target. Nothing runs and no GPU is needed:

``--target=h100``: jax's CUDA plugin compiles for ``--devices`` compile-only H100 80GB devices
  (``jax.experimental.topologies.get_topology_desc``, the device described by ``H100_TARGET``,
  hosts x devices per host = ``--hosts`` x ``--devices``/``--hosts``). Needs ``jax[cuda12]``
  (setup.py's ``gpu`` extra: the plugin and NVIDIA's compiler wheels) installed; a machine
  without a GPU is fine. Where that fails (no plugin), the step is compiled for ``--devices``
  host CPU devices instead, with a warning and ``"target_used": "cpu (fallback: ...)"``: the
  same partitioned program, but XLA:CPU's buffer assignment and no cuDNN kernels, so its
  figures are a rougher estimate.
``--target=cpu``: host CPU devices (the tests).

Per device (the partitioned program is one device's; ``compiled.memory_analysis()``):
  ``argument_bytes`` (the train state's shards: float32 master weights, AdamW's two moments,
  the step; the batch's rows; the KL reference), ``temp_bytes`` (activations, gradients,
  gathered weights, XLA's scratch), ``output_bytes`` and ``alias_bytes`` (the new state, written
  over the donated old one), ``peak_bytes`` = argument + output - alias + temp: what the step
  needs at once. Against ``device_bytes`` and jax's pool, ``pool_fraction`` (jax's default
  ``XLA_PYTHON_CLIENT_MEM_FRACTION``, 0.75) of it: ``fits_pool``, ``fits_device`` (with
  ``XLA_PYTHON_CLIENT_MEM_FRACTION`` raised near 1). ``argument_parts`` counts the arguments
  from their shapes and shardings (params / opt_state / ref / batch), which sum to
  ``argument_bytes`` (tests/test_aot_fit.py).
``qkv_batch_gathers``: all-gathers in the compiled program whose result is a whole micro-batch
  of [rows, T, heads, head_dim] (q, k or v gathered over the batch: every device attending for
  every row); 0 when attention keeps the batch sharded. ``collectives``: the counts of each
  collective op.

Shapes: rows per optimizer update = (``rollout.train_groups`` or ``tasks_per_step``) x
``samples_per_task`` / ``optim.mini_batches``, split into ``optim.num_micro_batches``; T =
``model.max_prompt_len`` + ``rollout.max_new_tokens`` rounded up to ``rollout.buckets`` (the
longest batch ``trainer_batch.build_train_batch`` makes; agent rollouts: pass ``--seq``); with
self-distillation (``loss.sd_estimator`` not "none") the teacher rows are
``model.max_teacher_prompt_len`` + the same completion. ``--rows`` / ``--seq`` override. The
KL reference (``loss.kl_beta`` > 0) is an argument in ``loss.kl_ref_dtype``. Not included: the
decoupled correction's separate ``compute_logps`` program, an external teacher
(``config.teacher``), the rollout engine's memory (SGLang runs beside the trainer).

``--before``: the program as it was before the fit work, for before -> after figures: the
Gated DeltaNet solve differentiated through its loop (``gated_deltanet.SOLVE_BACKWARD =
"autodiff"``), the embedding's vocabulary on "tensor" only (replicated when tensor = 1), a
float32 KL reference, and attention choosing its path per call by ``lax.cond``.

``--measure``: also run one real step (random weights and batch) on the attached devices
(``jax.devices()[:devices]``) and print the allocator's ``peak_bytes_in_use`` beside the
estimate (GPUs; CPU devices report none).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import time
import warnings
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

GIB = 2**30
# An H100 SXM 80GB as XLA's GPU compiler sees it (xla.GpuTargetConfigProto, text format): 132
# SMs, compute capability 9.0, 3.35 TB/s, 50 MiB L2, and the 79.1 GiB that CUDA reports as the
# device's memory (the figure jax's pool fraction multiplies).
H100_MEMORY = 84_929_347_584
H100_TARGET = f"""
gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {H100_MEMORY}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
runtime_version {{ major: 12 minor: 8 patch: 0 }}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 7 }}
device_description_str: "NVIDIA H100 80GB HBM3"
"""
TARGETS = {"h100": dict(memory=H100_MEMORY, config=H100_TARGET), "cpu": dict(memory=0)}
POOL_FRACTION = 0.75  # jax's default XLA_PYTHON_CLIENT_MEM_FRACTION
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def _gpu_attached() -> bool:
    return os.path.exists("/dev/nvidiactl")


def prepare_environment(target: str, devices: int) -> None:
    """Environment for jax, before it is imported: host CPU devices for the cpu target and the
    fallback; without a GPU, the CUDA plugin's version probe (which needs a driver) skipped so
    that it still registers its compile-only topology."""
    if "jax" in sys.modules:
        return  # already configured (the tests: 8 forced host devices)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}"
    if not _gpu_attached():
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def target_devices(target: str, devices: int, hosts: int = 1) -> tuple[list, str]:
    """(devices, description) of the compile target; a GPU target that cannot be built falls
    back to host CPU devices with a warning."""
    import jax

    if target != "cpu":
        if devices % hosts:
            raise ValueError(f"--devices={devices} is not divisible by --hosts={hosts}")
        try:
            from jax.experimental import topologies

            topo = topologies.get_topology_desc(
                target,
                "cuda",
                target_config=TARGETS[target]["config"],
                topology=f"1x{hosts}x{devices // hosts}",
            )
            return list(topo.devices), f"cuda (compile-only {target} topology)"
        except Exception as e:  # noqa: BLE001 - any failure: the documented CPU fallback
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            warnings.warn(
                f"aot_fit: no compile-only GPU topology ({reason}); compiling for {devices} host "
                "CPU devices instead (XLA:CPU's buffer assignment: a rough estimate)",
                stacklevel=2,
            )
            kind = f"cpu (fallback: {reason})"
    else:
        kind = "cpu"
    cpus = jax.devices("cpu")
    if len(cpus) < devices:
        raise ValueError(
            f"--devices={devices}: only {len(cpus)} host CPU devices (set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={devices} before jax is imported)"
        )
    return cpus[:devices], kind


def load_config(spec: str):
    """configs/<file>.py[:variants] -> its ConfigDict (unlocked copy)."""
    path, _, arg = spec.partition(":")
    if not os.path.isabs(path):
        path = os.path.join(ROOT, path)
    mod_spec = importlib.util.spec_from_file_location("aot_fit_config", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    config = module.get_config(arg or None)
    config = config.copy_and_resolve_references()
    config.unlock()
    return config


def resolve_attention(impl: str, target_kind: str, dtype, head_dim: int) -> str:
    """What "auto" becomes on the target (``qwen3._use_fused``'s rule with the target's
    backend, not the compiling machine's)."""
    import jax.numpy as jnp

    if impl != "auto":
        return impl
    gpu = target_kind.startswith("cuda")
    ok = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if gpu and ok else "xla"


def batch_shapes(config, rows: int | None, seq: int | None) -> dict[str, int]:
    from rubric_rl.util.buckets import round_up_to_bucket

    r, m, o = config.rollout, config.model, config.optim
    groups = int(r.get("train_groups", 0)) or int(r.tasks_per_step)
    rows = rows or groups * int(r.samples_per_task) // int(o.mini_batches)
    completion = round_up_to_bucket(int(r.max_new_tokens), tuple(int(b) for b in r.buckets))
    seq = seq or int(m.max_prompt_len) + completion
    teacher = 0
    if str(config.loss.sd_estimator) != "none":
        teacher = int(m.get("max_teacher_prompt_len", m.max_prompt_len)) + (
            seq - int(m.max_prompt_len)
        )
    return {"rows": rows, "seq": seq, "teacher_seq": teacher}


def abstract_batch(rows: int, seq: int, teacher_seq: int, needs_old_logps: bool):
    import jax
    import jax.numpy as jnp

    from rubric_rl.core.batch_types import TrainBatch

    def a(*shape, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype)

    i32 = jnp.int32
    teacher = {}
    if teacher_seq:
        teacher = dict(
            teacher_input_ids=a(rows, teacher_seq, dtype=i32),
            teacher_positions=a(rows, teacher_seq, dtype=i32),
            teacher_attention_mask=a(rows, teacher_seq, dtype=i32),
            teacher_offset=a(rows, dtype=i32),
            sd_mask=a(rows),
            sd_coef=a(rows),
        )
    return TrainBatch(
        input_ids=a(rows, seq, dtype=i32),
        positions=a(rows, seq, dtype=i32),
        attention_mask=a(rows, seq, dtype=i32),
        loss_mask=a(rows, seq),
        rollout_logps=a(rows, seq),
        advantages=a(rows),
        seq_weights=a(rows),
        old_logps=a(rows, seq) if needs_old_logps else None,
        **teacher,
    )


@contextlib.contextmanager
def before_fit():
    """The program before the fit work (module docstring, ``--before``)."""
    from rubric_rl.models import gated_deltanet, qwen3, qwen3_5

    fused = qwen3.fused_attention

    def per_call_choice(q, k, v, mask, impl, **_):
        return fused(q, k, v, mask, impl)  # no causal_padding: the lax.cond decides

    saved = (gated_deltanet.SOLVE_BACKWARD, qwen3.EMBED_SHARDING)
    gated_deltanet.SOLVE_BACKWARD = "autodiff"
    qwen3.EMBED_SHARDING = ("tensor", None)
    qwen3.fused_attention = qwen3_5.fused_attention = per_call_choice
    try:
        yield
    finally:
        gated_deltanet.SOLVE_BACKWARD, qwen3.EMBED_SHARDING = saved
        qwen3.fused_attention = qwen3_5.fused_attention = fused


def _shard_bytes(tree, shardings) -> int:
    """Bytes of one device's shards of ``tree`` (abstract leaves) under ``shardings``."""
    import jax
    import numpy as np

    leaves = jax.tree.leaves(tree)
    shs = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    if len(leaves) != len(shs):
        raise ValueError(f"{len(leaves)} leaves but {len(shs)} shardings")
    return sum(
        math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
        for x, s in zip(leaves, shs, strict=True)
    )


def collective_counts(hlo: str) -> dict[str, int]:
    """Collective ops in a compiled program's text (async pairs counted once, by their start)."""
    out = {}
    for op in COLLECTIVES:
        pattern = rf"=\s*[^=]*?\b{op}(-start)?\("
        out[op] = len(re.findall(pattern, hlo))
    return out


def qkv_batch_gathers(hlo: str, micro_rows: int, seq: int) -> int:
    """All-gathers producing a whole micro-batch of a [rows, T, heads, head_dim] array."""
    shape = rf"\[{micro_rows},{seq},\d+,\d+\]"
    n = 0
    for line in hlo.splitlines():
        if re.search(r"\ball-gather(-start)?\(", line) and "=" in line:
            result = line.split("=", 1)[1].split("all-gather", 1)[0]
            n += len(re.findall(shape, result)) > 0
    return n


def build(args) -> dict[str, Any]:
    """Everything the compile needs, abstract: (config, model class and constructor, state,
    shardings, batch, reference, mesh, step)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rubric_rl.config import builders
    from rubric_rl.core import sharding
    from rubric_rl.core import train_step as ts
    from rubric_rl.models.config import Qwen3Config
    from rubric_rl.models.qwen3 import Qwen3ForCausalLM
    from rubric_rl.models.qwen3_5 import Qwen3_5ForCausalLM
    from rubric_rl.models.qwen3_5_config import ALL_PRESETS, Qwen3_5Config
    from rubric_rl.models.rngs import init_rngs

    config = load_config(args.config)
    name = args.model or str(config.model.name)
    if name not in ALL_PRESETS:
        raise ValueError(f"--model={name!r}: not a preset; known {sorted(ALL_PRESETS)}")
    cfg = ALL_PRESETS[name]
    if isinstance(cfg, Qwen3Config) and not isinstance(cfg, Qwen3_5Config):
        cfg = dataclasses.replace(cfg, scan_layers=bool(config.model.get("scan_layers", False)))
    if args.micro_batches:
        config.optim.num_micro_batches = args.micro_batches
    if args.remat:
        config.model.remat = args.remat
    if args.kl_ref_dtype:
        config.loss.kl_ref_dtype = args.kl_ref_dtype
    if args.before:
        config.loss.kl_ref_dtype = "float32"
    tcfg = builders.train_config(config)
    devs, kind = target_devices(args.target, args.devices, args.hosts)
    m = config.mesh
    data, fsdp, tensor = args.mesh or (int(m.data), int(m.fsdp), int(m.tensor))
    mesh = sharding.make_mesh(data, fsdp, tensor, devices=devs)
    dtype = jnp.dtype(config.model.dtype)
    impl = resolve_attention(str(config.model.get("attention_impl", "xla")), kind, dtype,
                             cfg.head_dim)  # fmt: skip
    cls = Qwen3_5ForCausalLM if isinstance(cfg, Qwen3_5Config) else Qwen3ForCausalLM

    def constructor():
        return cls(
            cfg,
            rngs=init_rngs(0),
            dtype=dtype,
            param_dtype=jnp.dtype(config.model.param_dtype),
            remat=config.model.get("remat", "none"),
            attention_impl=impl,
        )

    abstract = nnx.eval_shape(constructor)
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    tx = ts.make_optimizer(tcfg)
    state = jax.eval_shape(
        lambda p, r: ts.TrainState(
            step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p), rest=r
        ),
        params,
        rest,
    )
    state_sh = ts.train_state_shardings(state, mesh)
    shapes = batch_shapes(config, args.rows, args.seq)
    batch = abstract_batch(
        shapes["rows"], shapes["seq"], shapes["teacher_seq"], tcfg.needs_old_logps
    )
    ref = None
    ref_dtype = str(config.loss.get("kl_ref_dtype", "float32"))
    if tcfg.kl_beta > 0:
        ref = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(ref_dtype)), params)
    step = ts.make_train_step(tcfg, graphdef, mesh, state_shardings=state_sh)
    return dict(
        config=config, cfg=cfg, name=name, tcfg=tcfg, mesh=mesh, kind=kind, impl=impl,
        constructor=constructor, graphdef=graphdef, state=state, state_sh=state_sh,
        batch=batch, ref=ref, ref_dtype=ref_dtype, step=step, shapes=shapes,
    )  # fmt: skip


def analyse(b: dict[str, Any], args) -> dict[str, Any]:
    import jax

    from rubric_rl.core import sharding

    t0 = time.perf_counter()
    compiled = b["step"].lower(b["state"], b["batch"], b["ref"]).compile()
    compile_s = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    hlo = compiled.as_text()
    mesh, state_sh = b["mesh"], b["state_sh"]
    batch_sh = sharding.batch_sharding(mesh)
    batch_leaves = [x for x in jax.tree.leaves(b["batch"]) if x is not None]
    parts = {
        "params": _shard_bytes(b["state"].params, state_sh.params),
        "opt_state": _shard_bytes(b["state"].opt_state, state_sh.opt_state),
        "step_and_rest": _shard_bytes(
            (b["state"].step, b["state"].rest), (state_sh.step, state_sh.rest)
        ),  # fmt: skip
        "ref": _shard_bytes(b["ref"], state_sh.params) if b["ref"] is not None else 0,
        "batch": _shard_bytes(batch_leaves, [batch_sh] * len(batch_leaves)),
    }
    arg, out, alias, temp = (
        int(ma.argument_size_in_bytes),
        int(ma.output_size_in_bytes),
        int(ma.alias_size_in_bytes),
        int(ma.temp_size_in_bytes),
    )
    peak = arg + out - alias + temp
    device = args.device_gib * GIB if args.device_gib else TARGETS[args.target]["memory"]
    pool = device * args.pool_fraction
    micro = b["shapes"]["rows"] // b["tcfg"].num_micro_batches
    cfg = b["cfg"]
    result = {
        "benchmark": "aot_fit",
        "config": args.config,
        "model": b["name"],
        "params": int(cfg.num_params()),
        "target": args.target,
        "target_used": b["kind"],
        "devices": args.devices,
        "hosts": args.hosts,
        "mesh": dict(mesh.shape),
        **b["shapes"],
        "micro_batches": b["tcfg"].num_micro_batches,
        "micro_rows": micro,
        "remat": str(b["config"].model.get("remat", "none")),
        "attention_impl": b["impl"],
        "kl_beta": b["tcfg"].kl_beta,
        "kl_ref_dtype": b["ref_dtype"] if b["ref"] is not None else None,
        "before": bool(args.before),
        "argument_bytes": arg,
        "output_bytes": out,
        "alias_bytes": alias,
        "temp_bytes": temp,
        "peak_bytes": peak,
        "peak_gib": round(peak / GIB, 2),
        "argument_parts": parts,
        "device_bytes": int(device),
        "pool_fraction": args.pool_fraction,
        "pool_bytes": int(pool),
        "fits_pool": bool(device) and peak <= pool,
        "fits_device": bool(device) and peak <= device,
        "qkv_batch_gathers": qkv_batch_gathers(hlo, micro, b["shapes"]["seq"]),
        "collectives": collective_counts(hlo),
        "compile_s": round(compile_s, 1),
    }
    if not device:
        result["fits_pool"] = result["fits_device"] = None
    return result


def measure(b: dict[str, Any], args) -> dict[str, Any]:
    """One real step on the attached devices (random weights and batch); the allocator's peak."""
    import jax
    import numpy as np

    from rubric_rl.core import sharding
    from rubric_rl.core import train_step as ts

    devs = jax.devices()[: args.devices]
    if len(devs) < args.devices:
        raise ValueError(f"--measure: {len(devs)} attached devices < --devices={args.devices}")
    data, fsdp, tensor = (b["mesh"].shape[a] for a in sharding.MESH_AXES)
    mesh = sharding.make_mesh(data, fsdp, tensor, devices=devs)
    with jax.set_mesh(mesh):
        model = sharding.init_sharded(b["constructor"], mesh)
    graphdef, state = ts.init_train_state(model, b["tcfg"], mesh)
    ref = None
    if b["ref"] is not None:
        ref = jax.tree.map(lambda x: x.astype(b["ref_dtype"]), state.params)
    del model
    rng = np.random.default_rng(0)

    def fill(x):
        if x is None:
            return None
        if np.issubdtype(x.dtype, np.integer):
            if len(x.shape) == 2:  # ids, positions, masks: all-real rows, positions 0..T-1
                return np.broadcast_to(np.arange(x.shape[1], dtype=x.dtype), x.shape).copy()
            return np.zeros(x.shape, x.dtype)
        return rng.uniform(0.1, 1.0, x.shape).astype(x.dtype)

    batch = jax.tree.map(fill, b["batch"])
    ids = rng.integers(0, b["cfg"].vocab_size, batch.input_ids.shape).astype(np.int32)
    ones = np.ones(batch.input_ids.shape, np.int32)
    batch = batch.replace(input_ids=ids, attention_mask=ones, rollout_logps=-batch.rollout_logps)
    if batch.old_logps is not None:
        batch = batch.replace(old_logps=-batch.old_logps)
    if batch.teacher_input_ids is not None:
        t = batch.teacher_input_ids.shape
        batch = batch.replace(
            teacher_input_ids=rng.integers(0, b["cfg"].vocab_size, t).astype(np.int32),
            teacher_attention_mask=np.ones(t, np.int32),
        )
    step = ts.make_train_step(b["tcfg"], graphdef, mesh)
    data_ = sharding.shard_batch(batch, mesh)
    t0 = time.perf_counter()
    state, metrics = step(state, data_, ref)
    loss = float(metrics["loss"])
    stats = devs[0].memory_stats() or {}
    return {
        "measured_step_s": round(time.perf_counter() - t0, 2),
        "measured_loss": loss,
        "measured_peak_bytes": stats.get("peak_bytes_in_use"),
        "measured_device": devs[0].device_kind,
    }


def table(path: str) -> str:
    """The docs' fit table from a JSONL of this script's lines (newest line per row wins),
    sorted by config, model, devices, tensor split, remat, then after before."""
    rows: dict[tuple, dict] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                key = (r["config"], r["model"], r["devices"], r["before"], r.get("kl_ref_dtype"),
                       r.get("remat"), r["micro_rows"], tuple(r["mesh"].values()))  # fmt: skip
                rows[key] = r
    out = [
        "| config | model | devices (mesh d/f/t) | rows x T (micro) | remat | before | peak GiB | "
        "pool GiB | fits pool | fits device | q/k/v batch gathers | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def order(r):
        return (
            r["config"],
            r["model"],
            r["devices"],
            r["mesh"]["tensor"],
            r.get("remat", ""),
            r["before"],
        )

    for r in sorted(rows.values(), key=order):
        mesh = "/".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor"))
        out.append(
            f"| `{r['config'].replace('configs/', '')}` | {r['model']} | {r['devices']} ({mesh}) "
            f"| {r['rows']} x {r['seq']} ({r['micro_rows']}) | {r.get('remat', '')} "
            f"| {'yes' if r['before'] else 'no'} "
            f"| {r['peak_gib']} | {round(r['pool_bytes'] / GIB, 1)} "
            f"| {'yes' if r['fits_pool'] else 'no'} | {'yes' if r['fits_device'] else 'no'} "
            f"| {r['qkv_batch_gathers']} | {r['target_used'].split(' (')[0]} |"
        )
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/grpo.py:gpu", help="file.py[:variants]")
    ap.add_argument("--model", default="", help="a preset (models.qwen3_5_config.ALL_PRESETS)")
    ap.add_argument("--target", default="h100", choices=sorted(TARGETS))
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=1, help="GPU target: hosts of devices/hosts")
    ap.add_argument("--mesh", default="", help="data,fsdp,tensor (default: the config's)")
    ap.add_argument("--rows", type=int, default=0, help="rows per optimizer update")
    ap.add_argument("--seq", type=int, default=0, help="tokens per row")
    ap.add_argument("--micro-batches", type=int, default=0, help="default: the config's")
    ap.add_argument("--remat", default="", help="model.remat (default: the config's)")
    ap.add_argument("--kl-ref-dtype", default="", choices=["", "float32", "bfloat16"])
    ap.add_argument("--pool-fraction", type=float, default=POOL_FRACTION)
    ap.add_argument("--device-gib", type=float, default=0.0, help="device memory (default: target)")
    ap.add_argument("--before", action="store_true", help="the program before the fit work")
    ap.add_argument("--measure", action="store_true", help="also one real step, allocator peak")
    ap.add_argument("--out", default="", help="also append the JSON line to this file")
    ap.add_argument("--table", default="", help="print the markdown table of a JSONL and exit")
    a = ap.parse_args(argv)
    if a.mesh:
        try:
            a.mesh = tuple(int(x) for x in a.mesh.split(","))
            assert len(a.mesh) == 3
        except (ValueError, AssertionError):
            ap.error(f"--mesh={a.mesh!r}: expected data,fsdp,tensor (three ints, one may be -1)")
    return a


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.table:
        print(table(args.table))
        return {"table": args.table}
    prepare_environment(args.target, args.devices)
    with before_fit() if args.before else contextlib.nullcontext():
        b = build(args)
        result = analyse(b, args)
        if args.measure:
            result.update(measure(b, args))
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
