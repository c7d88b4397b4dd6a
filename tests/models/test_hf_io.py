"""Checkpoint import onto meshes of 8 CPU devices, multi-file checkpoints, and import errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rubric_rl.core.sharding import make_mesh
from rubric_rl.models import PRESETS, Qwen3Config, Qwen3ForCausalLM, from_pretrained
from rubric_rl.models.hf_io import SafetensorsFile, hf_name, save_pretrained, write_safetensors

# Untied, and sized so every rule applies on tensor=2 / fsdp=4 except the 1-D norms.
CFG = Qwen3Config(96, 32, 64, 2, 4, 2, 8, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(dir, model, reference logits, ids, mask) of a single-file checkpoint."""
    path = str(tmp_path_factory.mktemp("ckpt"))
    model = Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(3))
    save_pretrained(model, path)
    ids = np.random.RandomState(0).randint(0, CFG.vocab_size, (8, 6)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :2] = 0
    return path, model, ids, mask


# Expected PartitionSpecs on a mesh where every named dim divides (the rules of core/sharding.py).
EXPECTED = {
    "model.embed_tokens.weight": P(("tensor", "fsdp"), None),
    "lm_head.weight": P("fsdp", "tensor"),
    "self_attn.q_proj.weight": P("fsdp", "tensor"),
    "self_attn.k_proj.weight": P("fsdp", "tensor"),
    "self_attn.v_proj.weight": P("fsdp", "tensor"),
    "self_attn.o_proj.weight": P("tensor", "fsdp"),
    "mlp.gate_proj.weight": P("fsdp", "tensor"),
    "mlp.up_proj.weight": P("fsdp", "tensor"),
    "mlp.down_proj.weight": P("tensor", "fsdp"),
    "norm.weight": P(None),
    "layernorm.weight": P(None),
}


def _expected_spec(name):
    for suffix, spec in EXPECTED.items():
        if name.endswith(suffix):
            return spec
    raise AssertionError(name)


@pytest.mark.parametrize("shape", [(1, 4, 2), (2, 2, 2)])
def test_sharded_import_matches_unsharded(ckpt, helpers, tmp_path, shape):
    path, model, ids, mask = ckpt
    ref = helpers.forward(model, ids, mask)
    mesh = make_mesh(*shape)
    sharded = from_pretrained(path, mesh=mesh)
    state = nnx.state(sharded, nnx.Param)
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
    assert len(leaves) == 2 + 1 + CFG.num_hidden_layers * 11
    for p, var in leaves:
        arr = var.get_value()
        name, _ = hf_name(p)
        assert arr.sharding.mesh == mesh
        assert arr.sharding.spec == _expected_spec(name), name
        # each device holds only its slice
        shard_shape = arr.sharding.shard_shape(arr.shape)
        assert all(s.data.shape == shard_shape for s in arr.addressable_shards)
    np.testing.assert_array_equal(
        np.asarray(sharded.layers[1].mlp.down_proj.kernel[...]),
        np.asarray(model.layers[1].mlp.down_proj.kernel[...]),
    )
    got = helpers.forward(sharded, ids, mask)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    # Export from the sharded model writes the same bytes as the original checkpoint.
    out = tmp_path / "export"
    save_pretrained(sharded, str(out))
    with open(out / "model.safetensors", "rb") as a, open(f"{path}/model.safetensors", "rb") as b:
        assert a.read() == b.read()


def test_indivisible_dims_fall_back_to_replicated(tmp_path):
    """A dim that its mesh axes' size does not divide is replicated; values are unchanged."""
    cfg = Qwen3Config(100, 36, 60, 1, 3, 1, 12)  # q [36, 36], k [36, 12], down [60, 36]
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    save_pretrained(model, str(tmp_path))
    spec = lambda m: {
        "q": m.layers[0].attn.q_proj.kernel[...].sharding.spec,
        "k": m.layers[0].attn.k_proj.kernel[...].sharding.spec,
        "down": m.layers[0].mlp.down_proj.kernel[...].sharding.spec,
        "embed": m.embed.embedding[...].sharding.spec,
    }
    # Every kernel dim divides; the vocabulary (100) divides by tensor (4) but not tensor x fsdp.
    ok = from_pretrained(str(tmp_path), mesh=make_mesh(fsdp=2, tensor=4))
    assert spec(ok) == {
        "q": P("fsdp", "tensor"),
        "k": P("fsdp", "tensor"),
        "down": P("tensor", "fsdp"),
        "embed": P("tensor", None),
    }
    fs8 = from_pretrained(str(tmp_path), mesh=make_mesh(fsdp=8, tensor=1))  # 36 % 8 != 0
    assert spec(fs8) == {
        "q": P(None, "tensor"),
        "k": P(None, "tensor"),
        "down": P("tensor", None),
        "embed": P("tensor", None),
    }
    tp8 = from_pretrained(str(tmp_path), mesh=make_mesh(fsdp=1, tensor=8))  # 36, 12, 60, 100 % 8
    assert spec(tp8) == {
        "q": P("fsdp", None),
        "k": P("fsdp", None),
        "down": P(None, "fsdp"),
        "embed": P(None, None),
    }
    for m in (fs8, tp8):
        np.testing.assert_array_equal(
            np.asarray(m.layers[0].attn.q_proj.kernel[...]),
            np.asarray(model.layers[0].attn.q_proj.kernel[...]),
        )


def test_multi_file_checkpoint_with_index(ckpt, helpers, tmp_path):
    path, model, ids, mask = ckpt
    save_pretrained(model, str(tmp_path), max_shard_bytes=20_000)
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    with open(tmp_path / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == 4 * CFG.num_params()
    ref = helpers.forward(model, ids, mask)
    for mesh in (None, make_mesh(data=2, fsdp=2, tensor=2)):
        got = helpers.forward(from_pretrained(str(tmp_path), mesh=mesh), ids, mask)
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


def test_bf16_export_is_the_float32_export_rounded_in_half_the_bytes(ckpt, tmp_path):
    """``save_pretrained(dtype="bfloat16")`` (the SGLang weight sync's export): each tensor is
    the float32 one rounded to bf16 (cast on the devices of a sharded model), config says so."""
    path, model, _, _ = ckpt
    sharded = from_pretrained(path, mesh=make_mesh(data=1, fsdp=4, tensor=2))
    save_pretrained(sharded, str(tmp_path), dtype="bfloat16")
    f32 = SafetensorsFile(os.path.join(path, "model.safetensors"))
    bf16 = SafetensorsFile(str(tmp_path / "model.safetensors"))
    assert bf16.names() == f32.names()
    for name in f32.names():
        want = np.asarray(f32.array(name)).astype(jnp.bfloat16)
        got = np.asarray(bf16.array(name))
        assert got.dtype == jnp.bfloat16, name
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=name)
    size = os.path.getsize(tmp_path / "model.safetensors")
    assert size < 0.52 * os.path.getsize(os.path.join(path, "model.safetensors"))
    with open(tmp_path / "config.json") as fh:
        assert json.load(fh)["torch_dtype"] == "bfloat16"


def _rewrite(src: str, dst: str, drop: str | None = None, reshape: str | None = None):
    """Copies safetensors `src` to `dst`, dropping or truncating one tensor."""
    f = SafetensorsFile(src)
    tensors = []
    for name in f.names():
        if name == drop:
            continue
        arr = np.asarray(f.array(name))
        if name == reshape:
            arr = arr[:-1]
        tensors.append((name, jax.ShapeDtypeStruct(arr.shape, arr.dtype), lambda a=arr: a))
    write_safetensors(dst, tensors)


def test_missing_tensor_names_tensor_and_file(ckpt, tmp_path):
    path = ckpt[0]
    for fn in ("config.json",):
        (tmp_path / fn).write_text(open(os.path.join(path, fn)).read())
    name = "model.layers.1.self_attn.k_norm.weight"
    _rewrite(
        os.path.join(path, "model.safetensors"), str(tmp_path / "model.safetensors"), drop=name
    )
    with pytest.raises(KeyError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight") as e:
        from_pretrained(str(tmp_path))
    assert str(tmp_path) in str(e.value)


def test_wrong_shape_names_tensor_and_file(ckpt, tmp_path):
    path = ckpt[0]
    (tmp_path / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    name = "model.layers.0.mlp.up_proj.weight"
    dst = tmp_path / "model.safetensors"
    _rewrite(os.path.join(path, "model.safetensors"), str(dst), reshape=name)
    with pytest.raises(ValueError, match=r"up_proj\.weight.*\(63, 32\).*expected \(64, 32\)") as e:
        from_pretrained(str(tmp_path), mesh=make_mesh(fsdp=8))
    assert str(dst) in str(e.value)


def test_missing_file_in_index(ckpt, tmp_path):
    model = ckpt[1]
    save_pretrained(model, str(tmp_path), max_shard_bytes=20_000)
    os.remove(tmp_path / f"model-00002-of-{len(os.listdir(tmp_path)) - 3:05d}.safetensors")
    with pytest.raises(FileNotFoundError, match="model-00002-of"):
        from_pretrained(str(tmp_path))


def test_preset_config_and_get_config(tmp_path):
    from rubric_rl.models import get_config

    save_pretrained(Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(0)), str(tmp_path))
    assert get_config(str(tmp_path)) == PRESETS["tiny"]
    assert get_config("qwen3_4b") is PRESETS["qwen3_4b"]
    with pytest.raises(ValueError, match="no_such_model"):
        get_config("no_such_model")
