"""Hugging Face checkpoint import/export (safetensors + config.json) for `Qwen3ForCausalLM` (the
Qwen3 and Qwen2/Qwen2.5 families) and `Qwen3_5ForCausalLM` (Qwen3.5 dense text): config.json's
`model_type` picks the family on import (`load_config`: `Qwen3Config.from_hf_dict` or
`Qwen3_5Config.from_hf_dict`) and is written back on export. A multimodal Qwen3.5 checkpoint
("qwen3_5") loads its text tower and exports as the text-only "qwen3_5_text".

Import reads each parameter straight into its (possibly sharded) jax.Array: for every device,
`jax.make_array_from_callback` asks for that device's index and we read only that slice from a
memory map of the safetensors file, so no full host copy of a large tensor is made (beyond one
slice; replicated parameters are small norms, or read once per device).

We parse safetensors ourselves (format: u64 little-endian header length, JSON header
{name: {dtype, shape, data_offsets}}, raw little-endian data) instead of `safe_open(...,
framework="numpy")` because the numpy backend cannot return bfloat16, the usual checkpoint dtype;
`ml_dtypes.bfloat16` (shipped with jax) can.

Scanned models (`Qwen3Config.scan_layers`): a stacked layer parameter [L, ...] is read from (and
written as) the L per-layer tensors, in the looped model's order, so a checkpoint is the same file
either way; the layer axis is never sharded, so each device reads its slice of every layer.

Export writes tensors one at a time (each gathered from its shards just before it is written), so
host memory holds one tensor, not the model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import struct
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from rubric_rl.core.sharding import param_shardings
from rubric_rl.models.gguf_io import gguf_config, gguf_path, is_gguf_source, load_gguf
from rubric_rl.models.hf_names import (
    MULTIMODAL_TEXT_PREFIX,
    hf_name,
    param_keys,
    stacked_layer_param,
)
from rubric_rl.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, get_config
from rubric_rl.models.qwen3_5 import Qwen3_5ForCausalLM
from rubric_rl.models.qwen3_5_config import QWEN3_5_MODEL_TYPES, Qwen3_5Config
from rubric_rl.models.rngs import init_rngs

_log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
_ST_DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_CONFIG_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


# ----------------------------------------------------------------------------- safetensors I/O


class SafetensorsFile:
    """Read-only, memory-mapped safetensors file: `.shape(name)`, `.read(name, index)`."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        self.header = header
        self._data_start = 8 + n
        self._mm = None

    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def array(self, name: str) -> np.ndarray:
        """Zero-copy memory-mapped view of a tensor."""
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        info = self.header[name]
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{self.path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        raw = self._mm[self._data_start + start : self._data_start + end]
        return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def write_safetensors(path: str, tensors: list[tuple[str, jax.ShapeDtypeStruct, Any]]) -> None:
    """Streams tensors to `path`. `tensors`: (name, shape/dtype, get) with get() -> np.ndarray,
    called one at a time so only one tensor is in host memory."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, sds, _ in tensors:
        nbytes = int(np.prod(sds.shape)) * np.dtype(sds.dtype).itemsize
        header[name] = {
            "dtype": _ST_NAMES[np.dtype(sds.dtype)],
            "shape": list(sds.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    hbytes = json.dumps(header, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)  # 8-byte alignment of the data section
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for name, sds, get in tensors:
            arr = np.ascontiguousarray(get(), dtype=sds.dtype)
            if arr.shape != tuple(sds.shape):
                raise ValueError(f"{path}: tensor {name} has shape {arr.shape}, expected {sds}")
            f.write(arr.tobytes())


def _checkpoint_files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file path for a checkpoint directory."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {k: os.path.join(path, v) for k, v in weight_map.items()}
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files and no {INDEX_FILE}")
    out = {}
    for fn in files:
        full = os.path.join(path, fn)
        for name in SafetensorsFile(full).names():
            out[name] = full
    return out


# ----------------------------------------------------------------------------- import


def _hf_model_type(path: str) -> str | None:
    fn = os.path.join(path, "config.json")
    if not os.path.isfile(fn):
        return None
    with open(fn) as f:
        return json.load(f).get("model_type")


def load_config(path: str) -> Qwen3Config | Qwen3_5Config:
    """The config of a checkpoint directory: `Qwen3_5Config` for config.json model_type
    "qwen3_5_text" / "qwen3_5" (a "qwen3_5_moe*" one is refused, naming the field), else
    `get_config` (Qwen3 / Qwen2 / Llama); a GGUF source (models/gguf_io.py: a *.gguf path or a
    name such as "smollm2-135m") reads its metadata."""
    if is_gguf_source(path):
        return gguf_config(gguf_path(path))
    mt = _hf_model_type(path)
    if mt is not None and (mt in QWEN3_5_MODEL_TYPES or str(mt).startswith("qwen3_5")):
        with open(os.path.join(path, "config.json")) as f:
            return Qwen3_5Config.from_hf_dict(json.load(f))
    return get_config(path)


def from_pretrained(
    path: str,
    *,
    mesh: jax.sharding.Mesh | None = None,
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    scan_layers: bool = False,
) -> Qwen3ForCausalLM | Qwen3_5ForCausalLM:
    """Loads a HF Qwen3, Qwen2/Qwen2.5 or Qwen3.5 (dense text) checkpoint directory (config.json
    + one or many *.safetensors, with model.safetensors.index.json when sharded) into the model
    of the family config.json names (`model_type`, else `architectures`): `Qwen3ForCausalLM`, or
    `Qwen3_5ForCausalLM` for "qwen3_5_text" and for a multimodal "qwen3_5" checkpoint, whose
    text tower (model.language_model.*, lm_head) is loaded and its vision (model.visual.*) and
    multi-token-prediction (mtp.*) tensors ignored, with one log line.

    dtype: compute dtype. param_dtype: parameter storage dtype; None = float32 (training master
    weights; pass param_dtype=jnp.bfloat16 for an inference-only copy). With `mesh`, parameters
    are sharded by `rubric_rl.core.sharding` rules and every device reads only its slice; without,
    they land on the default device. Raises ValueError / KeyError naming the file and tensor when a
    tensor is missing or has the wrong shape.

    scan_layers: build the scanned Qwen3 / Qwen2 model (`Qwen3Config.scan_layers`; same weights,
    stacked on a leading layer axis). Qwen3.5's mixed layers are not scanned: ValueError.

    A GGUF source (a *.gguf path or a `gguf_io.GGUF_MODELS` name) loads through
    `gguf_io.load_gguf` (dequantised to float32, then `param_dtype`).
    """
    if is_gguf_source(path):
        return load_gguf(
            path, mesh=mesh, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers
        )
    cfg = load_config(path)
    if scan_layers:
        if isinstance(cfg, Qwen3_5Config):
            raise ValueError(
                f"from_pretrained({path!r}, scan_layers=True): {cfg.model_type!r} (Qwen3.5, "
                "layers of two kinds) has no scanned layer stack; load it with scan_layers=False"
            )
        cfg = dataclasses.replace(cfg, scan_layers=True)
    param_dtype = jnp.float32 if param_dtype is None else param_dtype
    model_cls = Qwen3_5ForCausalLM if isinstance(cfg, Qwen3_5Config) else Qwen3ForCausalLM
    abstract = nnx.eval_shape(
        lambda: model_cls(cfg, rngs=init_rngs(0), dtype=dtype, param_dtype=param_dtype)
    )
    graphdef, abs_state = nnx.split(abstract)
    files = _checkpoint_files(path)
    prefix = "model."
    if _hf_model_type(path) == "qwen3_5":
        prefix = MULTIMODAL_TEXT_PREFIX
        ignored = [n for n in files if n.startswith(("model.visual.", "mtp."))]
        _log.info(
            "%s: multimodal Qwen3.5 checkpoint: loading the text tower (%s*, lm_head), "
            "ignoring %d vision / mtp tensors",
            path,
            prefix,
            len(ignored),
        )
    opened: dict[str, SafetensorsFile] = {}
    shardings = param_shardings(abs_state, mesh) if mesh is not None else None

    def source(name: str) -> tuple[SafetensorsFile, str]:
        if name not in files:
            where = (
                INDEX_FILE if os.path.isfile(os.path.join(path, INDEX_FILE)) else "*.safetensors"
            )
            raise KeyError(f"checkpoint {path}: tensor {name!r} not found in {where}")
        fn = files[name]
        if fn not in opened:
            if not os.path.isfile(fn):
                raise FileNotFoundError(f"checkpoint {path}: file {fn} (holds {name!r}) is missing")
            opened[fn] = SafetensorsFile(fn)
        f = opened[fn]
        if name not in f.header:
            raise KeyError(f"checkpoint {path}: tensor {name!r} not found in {fn}")
        return f, fn

    def load(path_keys, var, sharding):
        keys = param_keys(path_keys)
        if stacked_layer_param(keys):  # [L, ...]: layer i from tensor model.layers.i.*
            layer_shape = tuple(var.shape[1:])
            reads = [
                read_fn((keys[0], i, *keys[1:]), layer_shape, var.dtype)
                for i in range(var.shape[0])
            ]

            def read(index):
                layers = range(len(reads))[index[0]] if index else range(len(reads))
                inner = tuple(index[1:]) if index else ()
                return np.stack([reads[i](inner) for i in layers])

        else:
            read = read_fn(keys, tuple(var.shape), var.dtype)
        if sharding is None:
            value = jnp.asarray(read(tuple(slice(None) for _ in var.shape)))
        else:
            value = jax.make_array_from_callback(tuple(var.shape), sharding.get_value(), read)
        return var.replace(value)

    def read_fn(keys, shape, dtype):
        """read(index) -> np.ndarray: the index's slice of the tensor of `keys`, in our layout."""
        name, layout = hf_name(keys, prefix)
        f, fn = source(name)
        if layout == "conv":
            want = (shape[1], 1, shape[0])
        else:
            want = tuple(reversed(shape)) if layout else tuple(shape)
        if f.shape(name) != want:
            raise ValueError(
                f"{fn}: tensor {name!r} has shape {f.shape(name)}, expected {want} for config "
                f"{os.path.join(path, 'config.json')}"
            )

        def read(index):
            src = f.array(name)
            if layout == "conv":  # our [K, C] slice = HF [C, 1, K] slice, middle dim dropped
                k_idx, c_idx = index if index else (slice(None), slice(None))
                return np.ascontiguousarray(src[c_idx, 0, k_idx].T).astype(dtype)
            if layout:  # our [in, out] slice = HF [out, in] slice transposed
                index = tuple(reversed(index)) if index else index
                return np.ascontiguousarray(src[index].T).astype(dtype)
            return np.ascontiguousarray(src[index]).astype(dtype)

        return read

    is_var = lambda x: isinstance(x, nnx.Variable)
    if shardings is None:
        state = jax.tree_util.tree_map_with_path(
            lambda p, v: load(p, v, None), abs_state, is_leaf=is_var
        )
    else:
        state = jax.tree_util.tree_map_with_path(
            lambda p, v, s: load(p, v, s), abs_state, shardings, is_leaf=is_var
        )
    return nnx.merge(graphdef, state)


# ----------------------------------------------------------------------------- export


def _to_host(x: jax.Array) -> np.ndarray:
    """Gathers one (possibly sharded, possibly multi-host) array to host memory."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _hf_tensors(
    model: Qwen3ForCausalLM | Qwen3_5ForCausalLM, dtype: Any = None
) -> Iterator[tuple[str, jax.ShapeDtypeStruct, Any]]:
    state = nnx.state(model, nnx.Param)
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
    leaves = [(param_keys(p), v.get_value()) for p, v in leaves]
    # A scanned model's stacked layer parameters (contiguous in flatten order, all under
    # "layers") become per-layer tensors, layer-major: the looped model's order.
    stacked = [(k, a) for k, a in leaves if stacked_layer_param(k)]
    if stacked:
        first = next(i for i, (k, _) in enumerate(leaves) if stacked_layer_param(k))
        per_layer = [
            ((k[0], i, *k[1:]), a[i]) for i in range(stacked[0][1].shape[0]) for k, a in stacked
        ]
        rest = [(k, a) for k, a in leaves if not stacked_layer_param(k)]
        leaves = rest[:first] + per_layer + rest[first:]
    for keys, arr in leaves:
        name, layout = hf_name(keys)
        if layout == "conv":
            shape = (arr.shape[1], 1, arr.shape[0])
        else:
            shape = tuple(reversed(arr.shape)) if layout else tuple(arr.shape)
        dt = np.dtype(arr.dtype if dtype is None else dtype)

        def get(arr=arr, layout=layout):
            # Cast on the devices, before the gather: a bf16 export moves half the bytes.
            host = _to_host(arr if dtype is None else arr.astype(dtype))
            if layout == "conv":
                return host.T[:, None, :]
            return host.T if layout else host

        yield name, jax.ShapeDtypeStruct(shape, dt), get


def save_pretrained(
    model: Qwen3ForCausalLM | Qwen3_5ForCausalLM,
    path: str,
    *,
    max_shard_bytes: int = 4 * 1024**3,
    dtype: Any = None,
) -> None:
    """Writes `model` as a HF checkpoint that `transformers` loads as Qwen3ForCausalLM, or, for a
    `model_type="qwen2"` config, Qwen2ForCausalLM, or, for a `Qwen3_5ForCausalLM`,
    Qwen3_5ForCausalLM (model_type "qwen3_5_text"; a multimodal checkpoint's text tower is
    exported text-only):
    config.json, generation_config.json, model.safetensors (or model-0000i-of-0000n.safetensors +
    model.safetensors.index.json above `max_shard_bytes`). Tensors keep their parameter dtype
    (float32 / bfloat16), or are cast to `dtype` ("bfloat16": what a bf16 server loads; half of
    float32's bytes). In a multi-process run every process must call this (gathers are
    collective); only process 0 writes."""
    cfg: Qwen3Config | Qwen3_5Config = model.config
    tensors = list(_hf_tensors(model, None if dtype in (None, "") else jnp.dtype(dtype)))
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nbytes = int(np.prod(t[1].shape)) * t[1].dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    write = jax.process_index() == 0
    if write:
        os.makedirs(path, exist_ok=True)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map = {}
    for fn, shard in zip(names, shards, strict=True):
        if write:
            write_safetensors(os.path.join(path, fn), shard)
        else:  # still take part in the collective gathers
            for _, _, get in shard:
                get()
        weight_map.update({t[0]: fn for t in shard})
    if not write:
        return
    if len(shards) > 1:
        total = sum(int(np.prod(t[1].shape)) * t[1].dtype.itemsize for t in tensors)
        with open(os.path.join(path, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    dtypes = {_ST_NAMES[t[1].dtype] for t in tensors}
    dtype_name = _CONFIG_DTYPE[dtypes.pop()] if len(dtypes) == 1 else "float32"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(dtype=dtype_name), f, indent=2)
    gen = {"_from_model_config": True}
    if cfg.bos_token_id is not None:
        gen["bos_token_id"] = cfg.bos_token_id
    if cfg.eos_token_id is not None:
        eos = cfg.eos_token_id
        gen["eos_token_id"] = list(eos) if isinstance(eos, tuple) else eos
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
