"""A Qwen3.5 (hybrid Gated DeltaNet + gated attention) checkpoint directory trains through
``python -m rubric_rl.launch`` (issue 14): ``model.name`` = a directory written by
``save_pretrained`` (config.json model_type "qwen3_5_text"), the tokenizer of a tiny preset run."""

import dataclasses
import json
import os

import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import QWEN3_5_PRESETS, Qwen3_5ForCausalLM, save_pretrained
from tests.launch_env import checkpoint_params, launch_train

pytestmark = pytest.mark.slow


def test_qwen3_5_checkpoint_directory_trains_through_launch(tmp_path):
    """Step 1's parameters are the checkpoint's plus one AdamW update (each weight moves by at
    most about lr, and moves), the Gated DeltaNet's and the gated attention's included."""
    tok_run = tmp_path / "tok"
    launch_train(tok_run, 1, "--config=configs/grpo.py:smoke")  # only for its embedded tokenizer
    lr = json.loads((tok_run / "config.json").read_text())["optim"]["lr"]
    ckpt = tmp_path / "qwen3_5_ckpt"
    cfg = dataclasses.replace(QWEN3_5_PRESETS["qwen3_5_tiny"], vocab_size=576)
    model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(5))
    save_pretrained(model, str(ckpt))
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "qwen3_5_text"
    w = tmp_path / "w"
    launch_train(
        w, 2, "--config=configs/grpo.py:smoke", f"--config.model.name={ckpt}",
        f"--config.model.tokenizer={tok_run / 'tokenizer'}", "--config.warmstart.steps=0",
        "--config.warmstart.tie_case=False",
    )  # fmt: skip
    assert sorted(os.listdir(w / "checkpoints")) == ["1", "2"]
    step1 = checkpoint_params(str(w / "checkpoints" / "1"))
    assert cfg.layer_types[0] == "linear_attention" and cfg.layer_types[1] == "full_attention"
    gdn, attn = model.layers[0].linear_attn, model.layers[1].attn
    for key, ours in (
        ("layers/0/linear_attn/conv1d/kernel/value", gdn.conv1d.kernel),
        ("layers/0/linear_attn/in_proj_qkv/kernel/value", gdn.in_proj_qkv.kernel),
        ("layers/1/attn/q_proj/kernel/value", attn.q_proj.kernel),
    ):
        want = np.asarray(ours[...])
        np.testing.assert_allclose(step1[key], want, atol=3 * lr, rtol=0, err_msg=key)
        assert np.abs(step1[key] - want).max() > 0, key  # and it trained
