"""Orbax round trip of a TrainState: bit-exact, onto another mesh shape and onto one device."""

import jax
import numpy as np
import pytest
from flax import nnx

from rubric_rl.core import checkpointing as ck
from rubric_rl.core import sharding
from rubric_rl.core import train_step as ts
from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    mesh = sharding.make_mesh(2, 2, 2)
    model = sharding.init_sharded(lambda: Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(0)), mesh)
    _, state = ts.init_train_state(model, ts.TrainConfig(), mesh)
    # non-trivial optimiser moments and step, so a restore that dropped them would show (noise
    # drawn on the host: one device_put, no compiled program per leaf)
    rng = np.random.default_rng(1)
    noisy = lambda x: (x + rng.normal(size=x.shape)).astype(x.dtype)
    host = jax.tree.map(
        lambda x: noisy(x) if x.dtype.kind == "f" else x + 7, jax.tree.map(np.asarray, state)
    )
    state = jax.device_put(host, ts.train_state_shardings(state, mesh))
    manager = ck.make_checkpoint_manager(str(tmp_path_factory.mktemp("ckpt")))
    assert ck.save_train_state(manager, 7, state)
    return manager, state, host


def assert_bit_exact(restored, host):
    leaves, want = jax.tree.leaves(restored), jax.tree.leaves(host)
    assert len(leaves) == len(want)
    for got, ref in zip(leaves, want, strict=True):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(np.asarray(got), ref)  # bit-exact, not allclose


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 4, 2), (8, 1, 1)])
def test_restore_onto_mesh(saved, shape):
    manager, state, host = saved
    mesh = sharding.make_mesh(*shape)
    shardings = ts.train_state_shardings(state, mesh)
    restored = ck.restore_train_state(manager, ck.abstract_train_state(state, shardings))
    assert isinstance(restored, ts.TrainState)
    assert_bit_exact(restored, host)
    kernel = restored.params["layers"][0]["mlp"]["up_proj"]["kernel"]
    assert kernel.sharding == shardings.params["layers"][0]["mlp"]["up_proj"]["kernel"].value
    assert int(restored.step) == 7


def test_restore_onto_one_device(saved):
    manager, state, host = saved
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    shardings = ts.train_state_shardings(state, mesh)
    restored = ck.restore_train_state(manager, ck.abstract_train_state(state, shardings), step=7)
    assert_bit_exact(restored, host)
    assert all(len(x.devices()) == 1 for x in jax.tree.leaves(restored))


def test_missing_checkpoint_is_a_clear_error(tmp_path, saved):
    _, state, _ = saved
    empty = ck.make_checkpoint_manager(str(tmp_path / "none"))
    shardings = ts.train_state_shardings(state, sharding.make_mesh(2, 2, 2))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ck.restore_train_state(empty, ck.abstract_train_state(state, shardings))
