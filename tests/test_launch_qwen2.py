"""Smoke RL runs on a tiny Qwen2 model through ``python -m rubric_rl.launch``:
``configs/grpo.py:smoke,model=qwen2_tiny`` (the embedded tokenizer and a random-init Qwen2: q/k/v
biases, no q/k norm) trains two GRPO steps and its checkpoints hold that model; a Qwen2
checkpoint directory written by ``save_pretrained`` as ``model.name`` is loaded and trained."""

import dataclasses
import json
import os

import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import PRESETS, Qwen3ForCausalLM, save_pretrained
from tests.launch_env import checkpoint_params, launch_train

STEPS = 2

pytestmark = pytest.mark.slow


def _launch(workdir, *overrides):
    launch_train(workdir, STEPS, *overrides)
    assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2"]


_params = checkpoint_params


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    w = tmp_path_factory.mktemp("qwen2_smoke") / "w"
    _launch(w, "--config=configs/grpo.py:smoke,model=qwen2_tiny")
    return w


def test_qwen2_preset_smoke_run_trains_through_launch(run):
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["name"] == "qwen2_tiny"
    before, after = (_params(str(run / "checkpoints" / s)) for s in ("1", "2"))
    assert before.keys() == after.keys()
    # A Qwen2 model: q/k/v biases in every layer, no q/k norm.
    for i in range(2):
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert f"layers/{i}/attn/{proj}/bias/value" in after
    assert not any("q_norm" in k or "k_norm" in k for k in after)
    # The RL step (2) moved the weights, the biases included (they start at zero and train).
    for key in ("layers/1/attn/v_proj/bias/value", "layers/0/mlp/up_proj/kernel/value"):
        assert np.abs(after[key] - before[key]).max() > 0, key
    assert np.abs(after["layers/0/attn/q_proj/bias/value"]).max() > 0


def test_qwen2_checkpoint_directory_trains_through_launch(run, tmp_path):
    """model.name = a directory written by save_pretrained (config.json model_type "qwen2"),
    the preset run's tokenizer, no warm start: step 1's parameters are the checkpoint's plus
    one AdamW update (each weight moves by at most about lr)."""
    run_config = json.loads((run / "config.json").read_text())
    ckpt = tmp_path / "qwen2_ckpt"
    cfg = dataclasses.replace(PRESETS["qwen2_tiny"], vocab_size=576)
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(5))
    bias = model.layers[1].attn.k_proj.bias
    bias[...] = np.linspace(-0.5, 0.5, bias.shape[0], dtype=np.float32)
    save_pretrained(model, str(ckpt))
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "qwen2"
    w = tmp_path / "w"
    _launch(
        w, "--config=configs/grpo.py:smoke", f"--config.model.name={ckpt}",
        f"--config.model.tokenizer={run / 'tokenizer'}", "--config.warmstart.steps=0",
        "--config.warmstart.tie_case=False",
    )  # fmt: skip
    lr = run_config["optim"]["lr"]
    step1 = _params(str(w / "checkpoints" / "1"))
    got = step1["layers/1/attn/k_proj/bias/value"]
    np.testing.assert_allclose(got, np.asarray(bias[...]), atol=3 * lr, rtol=0)
    assert np.abs(got - np.asarray(bias[...])).max() > 0  # and it trained
    kernel = np.asarray(model.layers[0].attn.q_proj.kernel[...])
    np.testing.assert_allclose(step1["layers/0/attn/q_proj/kernel/value"], kernel, atol=3 * lr)
