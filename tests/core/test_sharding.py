"""Mesh construction, parameter sharding rules with the divisibility fallback, batch sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from rubric_rl.core import sharding as S
from rubric_rl.models import PRESETS, Qwen3ForCausalLM

CFG = PRESETS["tiny"]
# Tiny programs: XLA optimisation buys nothing here and halves the compile time.
FAST = {"xla_backend_optimization_level": 0}


def test_make_mesh_shapes_and_auto_axes():
    assert jax.device_count() == 8
    m = S.make_mesh()
    assert dict(m.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert m.axis_types == (AxisType.Auto,) * 3
    assert dict(S.make_mesh(data=2, fsdp=-1, tensor=2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(S.make_mesh(data=-1, fsdp=1, tensor=4).shape)["data"] == 2
    one = S.make_mesh(devices=jax.devices()[:1])
    assert dict(one.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    assert sorted(d.id for d in S.make_mesh(2, 2, 2).devices.flat) == list(range(8))


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"data": 3}, "fsdp"),  # 8 % 3: the -1 axis can't fill
        ({"data": 2, "fsdp": 2, "tensor": 1}, "must equal the number of devices"),
        ({"data": 0}, "mesh.data"),
        ({"data": -1, "fsdp": -1}, "only one"),
    ],
)
def test_make_mesh_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        S.make_mesh(**kwargs)


def test_spec_for_divisibility_fallback():
    mesh = S.make_mesh(data=2, fsdp=2, tensor=2)
    assert S.spec_for((8, 6), ("fsdp", "tensor"), mesh) == P("fsdp", "tensor")
    assert S.spec_for((7, 6), ("fsdp", "tensor"), mesh) == P(None, "tensor")
    assert S.spec_for((8, 5), ("fsdp", "tensor"), mesh) == P("fsdp", None)
    assert S.spec_for((8,), (("data", "fsdp"),), mesh) == P(("data", "fsdp"))
    # 6 % 4: the group's leading part that divides (data, 2); 5: none does.
    assert S.spec_for((6,), (("data", "fsdp"),), mesh) == P("data")
    assert S.spec_for((5,), (("data", "fsdp"),), mesh) == P(None)
    assert S.spec_for((4, 4), None, mesh) == P()
    assert S.spec_for((4,), ("nope",), mesh) == P(None)  # axis not in the mesh
    with pytest.raises(ValueError, match="do not match"):
        S.spec_for((4, 4), ("fsdp",), mesh)


def test_param_shardings_follow_rules():
    mesh = S.make_mesh(fsdp=4, tensor=2)
    model = Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0))
    sh = S.param_shardings(model, mesh)
    # The vocabulary over tensor x fsdp (128 divides by 8).
    assert sh["embed"]["embedding"].get_value().spec == P(("tensor", "fsdp"), None)
    layer = sh["layers"][0]
    assert layer["attn"]["q_proj"]["kernel"].get_value().spec == P("fsdp", "tensor")
    assert layer["attn"]["o_proj"]["kernel"].get_value().spec == P("tensor", "fsdp")
    assert layer["mlp"]["down_proj"]["kernel"].get_value().spec == P("tensor", "fsdp")
    assert layer["attn"]["q_norm"]["scale"].get_value().spec == P(None)
    assert layer["input_norm"]["scale"].get_value().spec == P(None)
    specs = S.param_partition_specs(model, mesh)
    assert specs["layers"][1]["mlp"]["gate_proj"]["kernel"].get_value() == P("fsdp", "tensor")
    # Optimizer states built on the params inherit the rules (mu has the params' metadata).
    import optax

    opt_abs = jax.eval_shape(optax.adamw(1e-3).init, nnx.state(model, nnx.Param))
    opt_sh = S.param_shardings(opt_abs, mesh)
    mu = opt_sh[0].mu
    assert mu["layers"][0]["attn"]["q_proj"]["kernel"].get_value().spec == P("fsdp", "tensor")
    assert opt_sh[0].count.spec == P()


@pytest.fixture(scope="module")
def reference():
    model = Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(4))
    ids = np.random.RandomState(0).randint(0, CFG.vocab_size, (8, 5)).astype(np.int32)
    fwd = nnx.jit(lambda m, i: m(i))
    return model, ids, fwd, np.asarray(fwd(model, jnp.asarray(ids)))


def _assert_same_params(a, b):
    la, lb = jax.tree.leaves(nnx.state(a, nnx.Param)), jax.tree.leaves(nnx.state(b, nnx.Param))
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.default_codegen
def test_init_sharded_matches_unsharded(reference):
    """Each device initialises its own shards; values equal the eager constructor's."""
    model, ids, fwd, ref = reference
    mesh = S.make_mesh(2, 2, 2)
    sharded = S.init_sharded(lambda: Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(4)), mesh)
    q = sharded.layers[0].attn.q_proj.kernel[...]
    assert q.sharding == NamedSharding(mesh, P("fsdp", "tensor"))
    assert q.addressable_shards[0].data.shape == (CFG.hidden_size // 2, q.shape[1] // 2)
    _assert_same_params(sharded, model)
    out = fwd(sharded, S.shard_batch(jnp.asarray(ids), mesh))
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5, rtol=0)


def test_shard_model_places_existing_params(reference):
    model = reference[0]
    mesh = S.make_mesh(fsdp=1, tensor=8)
    moved = S.shard_model(Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(4)), mesh)
    down = moved.layers[1].mlp.down_proj.kernel[...]
    assert down.sharding == NamedSharding(mesh, P("tensor", "fsdp"))
    assert down.addressable_shards[0].data.shape == (CFG.intermediate_size // 8, CFG.hidden_size)
    _assert_same_params(moved, model)


def test_batch_sharding_and_errors():
    mesh = S.make_mesh(data=2, fsdp=2, tensor=2)
    assert S.batch_sharding(mesh).spec == P(("data", "fsdp"))
    batch = {"input_ids": np.arange(24).reshape(8, 3), "step": np.int32(3)}
    out = S.shard_batch(batch, mesh)
    assert out["input_ids"].sharding == S.batch_sharding(mesh)
    assert out["input_ids"].sharding.shard_shape((8, 3)) == (2, 3)
    np.testing.assert_array_equal(np.asarray(out["input_ids"]), batch["input_ids"])
    assert out["step"].sharding.spec == P()
    with pytest.raises(ValueError, match=r"\['loss_mask'\].*6.*data\*fsdp = 4"):
        S.shard_batch({"loss_mask": np.zeros((6, 2))}, mesh)


def test_kv_cache_shardings():
    mesh = S.make_mesh(data=2, fsdp=2, tensor=2)
    model = Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0))  # kv heads 2
    cache = jax.eval_shape(lambda: model.init_cache(8, 16))
    sh = S.kv_cache_shardings(cache, mesh)
    assert sh[0]["k"].spec == P(("data", "fsdp"), "tensor", None, None)
    odd = S.kv_cache_shardings(jax.eval_shape(lambda: model.init_cache(6, 16)), mesh)
    # 6 % 4: the batch over data (2) alone
    assert odd[1]["v"].spec == P("data", "tensor", None, None)


def test_settle_waits_only_on_a_cpu_mesh_of_several_devices():
    """XLA:CPU can deadlock on independent programs with collectives in flight together, so a
    multi-device CPU mesh runs them one at a time; one device keeps asynchronous dispatch."""
    many, one = S.make_mesh(), S.make_mesh(devices=jax.devices()[:1])
    assert S.one_program_at_a_time(many) and not S.one_program_at_a_time(one)
    x = jax.device_put(np.ones((512, 512), np.float32), S.batch_sharding(many))
    y = S.settle(jax.jit(lambda a: (a @ a.T) @ a)(x), many)
    assert y.is_ready()
    z = jax.device_put(np.ones((8,), np.float32), S.batch_sharding(one))
    assert S.settle(z, one) is z


def test_embedding_sharded_over_fsdp_when_tensor_is_1_equals_unsharded():
    """tensor = 1: the embedding (tied: also the LM head) is split over the 8 fsdp devices,
    not replicated, and the sharded model's logits and every parameter's gradient equal the
    one-device model's."""
    mesh = S.make_mesh(1, 8, 1)
    model = Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(7))
    sharded = S.init_sharded(lambda: Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(7)), mesh)
    table = sharded.embed.embedding[...]
    assert table.sharding.spec == P(("tensor", "fsdp"), None)
    assert table.addressable_shards[0].data.shape == (CFG.vocab_size // 8, CFG.hidden_size)
    rs = np.random.RandomState(3)
    ids = rs.randint(0, CFG.vocab_size, (8, 12)).astype(np.int32)
    am = np.ones_like(ids)
    am[0, :4] = 0
    w = rs.randn(8, 12, CFG.vocab_size).astype(np.float32) * am[..., None]

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, r, i, a):
        logits = nnx.merge(graphdef, p, r)(i, attention_mask=a)
        return jnp.sum(logits * w), logits

    # one jitted function, compiled for each layout; XLA's lowest optimisation level
    step = jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=FAST)
    (_, want), want_g = step(params, rest, jnp.asarray(ids), jnp.asarray(am))
    batch = S.shard_batch({"ids": ids, "am": am}, mesh)
    _, sparams, srest = nnx.split(sharded, nnx.Param, ...)
    (_, got), got_g = step(sparams, srest, batch["ids"], batch["am"])
    assert jax.tree.leaves(sparams)[0].sharding.mesh.shape == mesh.shape  # it ran sharded
    real = am > 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-5, rtol=0)
    gw = jax.tree.leaves(got_g["embed"]["embedding"])[0]
    assert len(jax.tree.leaves(got_g)) == len(jax.tree.leaves(want_g)) > 0
    for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
        scale = float(np.abs(np.asarray(b)).max())
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4 * max(scale, 1.0))
    assert float(np.abs(np.asarray(gw)).max()) > 1e-3
