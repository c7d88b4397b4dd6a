"""A tiny Qwen3.5 (hybrid Gated DeltaNet + gated attention) trains through ``python -m
rubric_rl.launch``: ``configs/grpo.py:smoke,model=qwen3_5_tiny`` builds the hybrid stack over the
embedded tokenizer (random init); a directory written by ``save_pretrained`` (config.json
model_type "qwen3_5_text") as ``model.name`` loads and trains two GRPO steps.

One launch serves the family: the preset is built in this process (what the launcher's
``builders.build_model`` makes of the name) and its layer stack checked; the launch trains a
two-layer checkpoint of the same shapes (one layer of each kind: the preset repeats that pair), so
the directory loader, both mixers' gradients and the optimizer's updates run in the real
launcher with half the layers to compile, without a warm start or a calibration pass (neither
depends on the model family)."""

import dataclasses
import json
import os

import numpy as np
import pytest
from flax import nnx

from configs import grpo
from rubric_rl.config import builders
from rubric_rl.models import QWEN3_5_PRESETS, Qwen3_5ForCausalLM, save_pretrained
from tests.launch_env import checkpoint_params, launch_train
from tests.trainer_spy import one_device

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_qwen3_5_preset_and_checkpoint_directory_train_through_launch(tmp_path):
    c = grpo.get_config("smoke,model=qwen3_5_tiny")
    tok = builders.build_tokenizer(c, builders.build_domain(c), str(tmp_path / "tok"))
    preset = builders.build_model(c, tok, builders.build_mesh(c, one_device()))
    cfg = preset.config
    assert isinstance(preset, Qwen3_5ForCausalLM)
    # The hybrid stack: layers 0, 2 Gated DeltaNet, layers 1, 3 gated attention (q_proj makes
    # query and gate: 2·H·hd columns).
    assert cfg.layer_types == QWEN3_5_PRESETS["qwen3_5_tiny"].layer_types
    assert cfg.layer_types == ("linear_attention", "full_attention") * 2
    for i, kind in enumerate(cfg.layer_types):
        layer = preset.layers[i]
        if kind == "linear_attention":
            assert hasattr(layer, "linear_attn") and not hasattr(layer, "attn"), i
        else:
            assert hasattr(layer, "attn") and hasattr(layer.attn, "q_norm"), i
    q = preset.layers[1].attn.q_proj.kernel
    assert q.shape == (cfg.hidden_size, 2 * cfg.num_attention_heads * cfg.head_dim)

    small = dataclasses.replace(cfg, num_hidden_layers=2, layer_types=cfg.layer_types[:2])
    model = Qwen3_5ForCausalLM(small, rngs=nnx.Rngs(5))
    ckpt = tmp_path / "qwen3_5_ckpt"
    save_pretrained(model, str(ckpt))
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "qwen3_5_text"
    w = tmp_path / "w"
    launch_train(
        w, 2, "--config=configs/grpo.py:smoke", f"--config.model.name={ckpt}",
        f"--config.model.tokenizer={tmp_path / 'tok' / 'tokenizer'}",
        "--config.warmstart.steps=0", "--config.warmstart.tie_case=False",
        "--config.calibration.enabled=False",
    )  # fmt: skip
    assert sorted(os.listdir(w / "checkpoints")) == ["1", "2"]
    config = json.loads((w / "config.json").read_text())
    assert config["model"]["name"] == str(ckpt)
    lr = config["optim"]["lr"]
    step1, step2 = (checkpoint_params(str(w / "checkpoints" / s)) for s in ("1", "2"))
    assert step1.keys() == step2.keys()
    for i, kind in enumerate(small.layer_types):
        mixer = "linear_attn/A_log" if kind == "linear_attention" else "attn/q_norm/scale"
        assert f"layers/{i}/{mixer}/value" in step2, (i, kind)
    assert step2["layers/1/attn/q_proj/kernel/value"].shape == q.shape
    # Step 1's parameters are the checkpoint's plus one AdamW update (each weight moves by at
    # most about lr, and moves), the Gated DeltaNet's and the gated attention's included.
    gdn, attn = model.layers[0].linear_attn, model.layers[1].attn
    for key, ours in (
        ("layers/0/linear_attn/conv1d/kernel/value", gdn.conv1d.kernel),
        ("layers/0/linear_attn/in_proj_qkv/kernel/value", gdn.in_proj_qkv.kernel),
        ("layers/1/attn/q_proj/kernel/value", attn.q_proj.kernel),
    ):
        want = np.asarray(ours[...])
        np.testing.assert_allclose(step1[key], want, atol=3 * lr, rtol=0, err_msg=key)
        assert np.abs(step1[key] - want).max() > 0, key  # and it trained
    for key in (
        "layers/0/linear_attn/in_proj_qkv/kernel/value",
        "layers/0/linear_attn/out_proj/kernel/value",
        "layers/1/attn/q_proj/kernel/value",
    ):  # the RL step (2) moved them again
        assert np.abs(step2[key] - step1[key]).max() > 0, key
