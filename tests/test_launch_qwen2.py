"""A tiny Qwen2 model trains through ``python -m rubric_rl.launch``: ``configs/grpo.py:smoke,
model=qwen2_tiny`` builds a random-init Qwen2 (q/k/v biases, no q/k norm) over the embedded
tokenizer; written by ``save_pretrained`` (config.json model_type "qwen2") and given as
``model.name``, it is loaded and trained two GRPO steps, biases included.

One launch serves the family: the preset is built in this process (what the launcher's
``builders.build_model`` makes of the name) and the launch trains its checkpoint directory, so the
directory loader, the Qwen2 layers' gradients and the optimizer's updates all run in the real
launcher without a warm start or a calibration pass (neither depends on the model family)."""

import json
import os

import numpy as np
import pytest

from configs import grpo
from rubric_rl.config import builders
from rubric_rl.models import save_pretrained
from tests.launch_env import checkpoint_params, launch_train
from tests.trainer_spy import one_device

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_qwen2_preset_checkpoint_directory_trains_through_launch(tmp_path):
    c = grpo.get_config("smoke,model=qwen2_tiny")
    tok = builders.build_tokenizer(c, builders.build_domain(c), str(tmp_path / "tok"))
    model = builders.build_model(c, tok, builders.build_mesh(c, one_device()))
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 2
    # A non-zero bias, so that loading it (and not a fresh zero bias) is what the check sees.
    bias = model.layers[1].attn.k_proj.bias
    bias[...] = np.linspace(-0.5, 0.5, bias.shape[0], dtype=np.float32)
    ckpt = tmp_path / "qwen2_ckpt"
    save_pretrained(model, str(ckpt))
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "qwen2"

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
    # A Qwen2 model: q/k/v biases in every layer, no q/k norm.
    for i in range(2):
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert f"layers/{i}/attn/{proj}/bias/value" in step2
    assert not any("q_norm" in k or "k_norm" in k for k in step2)
    # Step 1's parameters are the checkpoint's plus one AdamW update (each weight moves by at
    # most about lr), and they moved.
    got = step1["layers/1/attn/k_proj/bias/value"]
    np.testing.assert_allclose(got, np.asarray(bias[...]), atol=3 * lr, rtol=0)
    assert np.abs(got - np.asarray(bias[...])).max() > 0  # and it trained
    kernel = np.asarray(model.layers[0].attn.q_proj.kernel[...])
    np.testing.assert_allclose(step1["layers/0/attn/q_proj/kernel/value"], kernel, atol=3 * lr)
    # The RL step (2) moved the weights again, the biases included (the q bias starts at zero
    # and trains).
    for key in ("layers/1/attn/v_proj/bias/value", "layers/0/mlp/up_proj/kernel/value"):
        assert np.abs(step2[key] - step1[key]).max() > 0, key
    assert not np.asarray(model.layers[0].attn.q_proj.bias[...]).any()
    assert np.abs(step2["layers/0/attn/q_proj/bias/value"]).max() > 0
