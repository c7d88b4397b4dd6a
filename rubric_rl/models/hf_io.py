"""Hugging Face checkpoint import/export for `Qwen3ForCausalLM` (safetensors + config.json), for
the Qwen3 and the Qwen2/Qwen2.5 families alike: config.json's `model_type` picks the family on
import (`Qwen3Config.from_hf_dict`) and is written back on export.

Import reads each parameter straight into its (possibly sharded) jax.Array: for every device,
`jax.make_array_from_callback` asks for that device's index and we read only that slice from a
memory map of the safetensors file, so no full host copy of a large tensor is made (beyond one
slice; replicated parameters are small norms, or read once per device).

We parse safetensors ourselves (format: u64 little-endian header length, JSON header
{name: {dtype, shape, data_offsets}}, raw little-endian data) instead of `safe_open(...,
framework="numpy")` because the numpy backend cannot return bfloat16, the usual checkpoint dtype;
`ml_dtypes.bfloat16` (shipped with jax) can.

Export writes tensors one at a time (each gathered from its shards just before it is written), so
host memory holds one tensor, not the model.
"""

from __future__ import annotations

import json
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
from rubric_rl.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, get_config

INDEX_FILE = "model.safetensors.index.json"
_ST_DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_CONFIG_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


# ----------------------------------------------------------------------------- name mapping

_LEAF_NAMES = {
    ("attn", "q_proj", "kernel"): ("self_attn.q_proj.weight", True),
    ("attn", "k_proj", "kernel"): ("self_attn.k_proj.weight", True),
    ("attn", "v_proj", "kernel"): ("self_attn.v_proj.weight", True),
    ("attn", "o_proj", "kernel"): ("self_attn.o_proj.weight", True),
    ("attn", "q_proj", "bias"): ("self_attn.q_proj.bias", False),  # Qwen2
    ("attn", "k_proj", "bias"): ("self_attn.k_proj.bias", False),
    ("attn", "v_proj", "bias"): ("self_attn.v_proj.bias", False),
    ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", False),
    ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", False),
    ("input_norm", "scale"): ("input_layernorm.weight", False),
    ("post_attention_norm", "scale"): ("post_attention_layernorm.weight", False),
    ("mlp", "gate_proj", "kernel"): ("mlp.gate_proj.weight", True),
    ("mlp", "up_proj", "kernel"): ("mlp.up_proj.weight", True),
    ("mlp", "down_proj", "kernel"): ("mlp.down_proj.weight", True),
}


def param_keys(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pytree path of our model's state as plain keys: ("embed", "embedding"), ("layers", 0, ...).
    A leaf inside an ``nnx.Variable`` keeps its trailing attribute key."""
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)


def hf_name(path: tuple[Any, ...]) -> tuple[str, bool]:
    """(HF tensor name, transpose?) for a parameter path of our model's state.

    Our kernels are [in, out]; torch Linear weights are [out, in], hence the transpose.
    """
    keys = param_keys(path)
    if keys == ("embed", "embedding"):
        return "model.embed_tokens.weight", False
    if keys == ("norm", "scale"):
        return "model.norm.weight", False
    if keys == ("lm_head", "kernel"):
        return "lm_head.weight", True
    if keys[0] == "layers" and keys[2:] in _LEAF_NAMES:
        name, transpose = _LEAF_NAMES[keys[2:]]
        return f"model.layers.{int(keys[1])}.{name}", transpose
    raise KeyError(f"no Hugging Face name for parameter {'/'.join(map(str, keys))}")


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


def from_pretrained(
    path: str,
    *,
    mesh: jax.sharding.Mesh | None = None,
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
) -> Qwen3ForCausalLM:
    """Loads a HF Qwen3 or Qwen2/Qwen2.5 checkpoint directory (config.json + one or many
    *.safetensors, with model.safetensors.index.json when sharded) into a `Qwen3ForCausalLM` of
    the family config.json names (`model_type`, else `architectures`).

    dtype: compute dtype. param_dtype: parameter storage dtype; None = float32 (training master
    weights; pass param_dtype=jnp.bfloat16 for an inference-only copy). With `mesh`, parameters
    are sharded by `rubric_rl.core.sharding` rules and every device reads only its slice; without,
    they land on the default device. Raises ValueError / KeyError naming the file and tensor when a
    tensor is missing or has the wrong shape.
    """
    cfg = get_config(path)
    param_dtype = jnp.float32 if param_dtype is None else param_dtype
    abstract = nnx.eval_shape(
        lambda: Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype)
    )
    graphdef, abs_state = nnx.split(abstract)
    files = _checkpoint_files(path)
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
        name, transpose = hf_name(path_keys)
        f, fn = source(name)
        want = tuple(reversed(var.shape)) if transpose else tuple(var.shape)
        if f.shape(name) != want:
            raise ValueError(
                f"{fn}: tensor {name!r} has shape {f.shape(name)}, expected {want} for config "
                f"{os.path.join(path, 'config.json')}"
            )

        def read(index):
            src = f.array(name)
            if transpose:  # our [in, out] slice = HF [out, in] slice transposed
                index = tuple(reversed(index)) if index else index
                return np.ascontiguousarray(src[index].T).astype(var.dtype)
            return np.ascontiguousarray(src[index]).astype(var.dtype)

        if sharding is None:
            value = jnp.asarray(read(tuple(slice(None) for _ in var.shape)))
        else:
            value = jax.make_array_from_callback(tuple(var.shape), sharding.get_value(), read)
        return var.replace(value)

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


def _hf_tensors(model: Qwen3ForCausalLM) -> Iterator[tuple[str, jax.ShapeDtypeStruct, Any]]:
    state = nnx.state(model, nnx.Param)
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
    for path_keys, var in leaves:
        name, transpose = hf_name(path_keys)
        arr = var.get_value()
        shape = tuple(reversed(arr.shape)) if transpose else tuple(arr.shape)
        dt = np.dtype(arr.dtype)

        def get(arr=arr, transpose=transpose):
            host = _to_host(arr)
            return host.T if transpose else host

        yield name, jax.ShapeDtypeStruct(shape, dt), get


def save_pretrained(
    model: Qwen3ForCausalLM, path: str, *, max_shard_bytes: int = 4 * 1024**3
) -> None:
    """Writes `model` as a HF checkpoint that `transformers` loads as Qwen3ForCausalLM or, for a
    `model_type="qwen2"` config, Qwen2ForCausalLM:
    config.json, generation_config.json, model.safetensors (or model-0000i-of-0000n.safetensors +
    model.safetensors.index.json above `max_shard_bytes`). Tensors keep their parameter dtype
    (float32 / bfloat16). In a multi-process run every process must call this (gathers are
    collective); only process 0 writes."""
    cfg: Qwen3Config = model.config
    tensors = list(_hf_tensors(model))
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
