"""Smoke RL runs on a tiny Qwen3.5 (hybrid Gated DeltaNet + gated attention) through
``python -m rubric_rl.launch``: ``configs/grpo.py:smoke,model=qwen3_5_tiny`` (the
embedded tokenizer, random init) trains two GRPO steps; a directory written by
``save_pretrained`` (config.json model_type "qwen3_5_text") as ``model.name`` loads and trains."""

import dataclasses
import json
import os

import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import QWEN3_5_PRESETS, Qwen3_5ForCausalLM, save_pretrained
from tests.launch_env import checkpoint_params, launch_train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    w = tmp_path_factory.mktemp("qwen3_5_smoke") / "w"
    launch_train(w, 2, "--config=configs/grpo.py:smoke,model=qwen3_5_tiny")
    return w


def test_qwen3_5_preset_smoke_run_trains_through_launch(run):
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["name"] == "qwen3_5_tiny"
    before, after = (checkpoint_params(str(run / "checkpoints" / s)) for s in ("1", "2"))
    assert before.keys() == after.keys()
    # The hybrid stack: layers 0, 2 Gated DeltaNet, layers 1, 3 gated attention (q_proj makes
    # query and gate: 2·H·hd columns).
    cfg = QWEN3_5_PRESETS["qwen3_5_tiny"]
    for i, kind in enumerate(cfg.layer_types):
        mixer = "linear_attn/A_log" if kind == "linear_attention" else "attn/q_norm/scale"
        assert f"layers/{i}/{mixer}/value" in after, (i, kind)
    q = after["layers/1/attn/q_proj/kernel/value"]
    assert q.shape == (cfg.hidden_size, 2 * cfg.num_attention_heads * cfg.head_dim)
    for key in (
        "layers/0/linear_attn/in_proj_qkv/kernel/value",
        "layers/2/linear_attn/out_proj/kernel/value",
        "layers/1/attn/q_proj/kernel/value",
    ):  # the RL step (2) moved them
        assert np.abs(after[key] - before[key]).max() > 0, key


def test_qwen3_5_checkpoint_directory_trains_through_launch(run, tmp_path):
    """Step 1's parameters are the checkpoint's plus one AdamW update (each weight moves by at
    most about lr, and moves), the Gated DeltaNet's and the gated attention's included."""
    tok_run = run  # its embedded tokenizer
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
