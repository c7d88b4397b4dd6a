"""The SGLang server's command line and environment, and the trainer's GPUs, from the config
(rollout/placement.py): no server is started."""

import pytest

from configs import grpo
from rubric_rl.config.config_validation import validate_config
from rubric_rl.rollout import placement
from rubric_rl.rollout.sglang_server import SGLangServer


def _config(**sglang):
    c = grpo.get_config("gpu")
    c.rollout.sglang.update(**sglang)
    return c


def _command(c, environ=None, model_path="/ckpt/m"):
    cfg = placement.server_config(c, model_path, environ=environ or {})
    return SGLangServer(cfg).command(30000), dict(cfg.extra_env)


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_server_command_line_carries_tp_dp_memory_seed_mode_and_extra_flags():
    c = _config(gpus="4,5,6,7", tp_size=2, mem_fraction=0.7, deterministic_inference=True,
                extra_flags="--chunked-prefill-size 4096 --log-level 'warning'")  # fmt: skip
    cmd, env = _command(c)
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and _flag(cmd, "--model-path") == "/ckpt/m"
    assert _flag(cmd, "--tp-size") == "2" and _flag(cmd, "--dp-size") == "2"  # 4 GPUs / tp 2
    assert _flag(cmd, "--mem-fraction-static") == "0.7" and _flag(cmd, "--device") == "cuda"
    assert cmd.count("--enable-deterministic-inference") == 1
    assert cmd[-4:] == ["--chunked-prefill-size", "4096", "--log-level", "warning"]
    assert "--attention-backend" not in cmd  # the CPU recipe's flags stay off a GPU server
    assert env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in [f"{k}={v}" for k, v in _server_env(c).items()]


def _server_env(c):
    return SGLangServer(placement.server_config(c, "/ckpt/m", environ={})).environment()


def test_defaults_one_replica_no_gpu_restriction_no_deterministic_flag():
    cmd, env = _command(_config())
    assert _flag(cmd, "--tp-size") == "1" and "--dp-size" not in cmd
    assert _flag(cmd, "--mem-fraction-static") == "0.8"
    assert "--enable-deterministic-inference" not in cmd and env == {}
    cmd, env = _command(_config(gpus="7", tp_size=1))
    assert "--dp-size" not in cmd and env == {"CUDA_VISIBLE_DEVICES": "7"}


def test_server_gpus_are_indices_among_the_visible_gpus():
    """Under SLURM (CUDA_VISIBLE_DEVICES=4,5,6,7) index 0 is physical GPU 4: the server's
    variable is written in physical ids, the trainer gets the other indices."""
    c = _config(gpus="2,3")
    slurm = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert _command(c, slurm)[1] == {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert placement.trainer_gpus(c, slurm) == [0, 1]
    assert placement.local_device_ids(c, slurm) == [0, 1]


def test_trainer_gets_every_gpu_but_the_servers(tmp_path):
    proc = tmp_path / "gpus"  # the NVIDIA driver's listing: one directory per GPU
    for i in range(8):
        (proc / f"0000:{i:02x}:00.0").mkdir(parents=True)
    c = _config(gpus="6,7", tp_size=2)
    assert placement.trainer_gpus(c, {}, proc) == [0, 1, 2, 3, 4, 5]
    # No started server on GPUs of its own: jax's default (every GPU).
    assert placement.trainer_gpus(_config(), {}, proc) is None
    # External servers on this node's GPUs 6 and 7 (url lists them): still not jax's.
    assert placement.trainer_gpus(_config(gpus="6,7", url="http://h:1"), {}, proc) == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    with pytest.raises(ValueError, match=r"rollout\.sglang\.gpus='8'.* sees 8 GPUs"):
        placement.trainer_gpus(_config(gpus="8"), {}, proc)
    with pytest.raises(ValueError, match="takes every visible GPU; the trainer needs one"):
        placement.trainer_gpus(_config(gpus="0,1,2,3,4,5,6,7"), {}, proc)
    with pytest.raises(ValueError, match="shows no GPUs"):
        placement.trainer_gpus(c, {}, tmp_path / "none")


def test_slurm_one_task_per_node_gives_jax_every_local_gpu(tmp_path):
    """jax's SLURM detection alone would give each process one GPU (its local task id)."""
    env = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    external = _config(url="http://node3:30000")
    assert placement.local_device_ids(external, env) == [0, 1, 2, 3]
    per_gpu = dict(env, SLURM_NTASKS_PER_NODE="4")  # one task per GPU: jax's default is right
    assert placement.local_device_ids(external, per_gpu) is None
    step = {"SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert placement.local_device_ids(external, step) == [0, 1]
    assert placement.local_device_ids(external, dict(step, SLURM_TASKS_PER_NODE="2(x2)")) is None
    assert placement.local_device_ids(_config(gpus="3"), env) == [0, 1, 2]


@pytest.mark.parametrize(
    "override, field",
    [
        (dict(gpus="6,x"), "rollout.sglang.gpus: 'x' is not a GPU index"),
        (dict(gpus="6,6"), "rollout.sglang.gpus: repeated"),
        (dict(gpus="5,6,7", tp_size=2), "3 GPUs do not split into replicas of tp_size=2"),
        (dict(tp_size=0), "rollout.sglang.tp_size: must be >= 1"),
        (dict(mem_fraction=1.5), r"rollout.sglang.mem_fraction: must be in \(0, 1\]"),
        (dict(export_dtype="fp8"), "rollout.sglang.export_dtype"),
        (dict(extra_flags="--x 'unclosed"), "rollout.sglang.extra_flags"),
    ],
)
def test_bad_placement_settings_fail_at_start_up_naming_the_field(override, field):
    c = grpo.get_config()  # the embedded model (the gpu variant names a checkpoint path)
    c.rollout.engine = "sglang"
    validate_config(c, num_devices=8)
    c.rollout.sglang.update(**override)
    with pytest.raises(ValueError, match=field):
        validate_config(c, num_devices=8)


def test_urls_are_comma_separated():
    assert placement.split_list("http://a:1, http://b:2,", "f") == ("http://a:1", "http://b:2")
    assert placement.split_list("", "f") == ()


def test_server_on_the_trainers_gpus_needs_both_memory_shares(tmp_path):
    """jax would take 75 % of each GPU, then the server its mem_fraction of the same GPU."""
    gpus = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    with pytest.raises(ValueError, match="gpus is empty: the SGLang server would start on"):
        placement.local_device_ids(_config(), gpus)
    shared = dict(gpus, XLA_PYTHON_CLIENT_MEM_FRACTION="0.5")
    with pytest.raises(ValueError, match=r"mem_fraction=0.8 \+ XLA_PYTHON_CLIENT_MEM_FRACTION"):
        placement.local_device_ids(_config(), shared)
    assert placement.local_device_ids(_config(mem_fraction=0.4), shared) is None
    # Nothing to share: external servers, a CPU server, or no GPU on this machine.
    assert placement.local_device_ids(_config(url="http://h:30000"), gpus) is None
    assert placement.local_device_ids(_config(device="cpu"), gpus) is None
    assert placement.local_device_ids(_config(), {}, tmp_path / "no_driver") is None


def test_qwen3_5_server_starts_from_the_trainers_text_only_export(tmp_path):
    """Weight updates carry the text-only Qwen3_5ForCausalLM names: a server started from a
    multimodal qwen3_5 checkpoint would not have them, so it starts from the export."""
    import json

    from flax import nnx

    from rubric_rl.config.builders import served_checkpoint
    from rubric_rl.models import PRESETS, QWEN3_5_PRESETS, Qwen3_5ForCausalLM, Qwen3ForCausalLM

    hybrid = Qwen3_5ForCausalLM(QWEN3_5_PRESETS["qwen3_5_tiny"], rngs=nnx.Rngs(0))
    dense = Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(0))
    for model_type in ("qwen3_5", "qwen3_5_text"):
        (tmp_path / model_type).mkdir()
        (tmp_path / model_type / "config.json").write_text(json.dumps({"model_type": model_type}))
    multimodal, text = str(tmp_path / "qwen3_5"), str(tmp_path / "qwen3_5_text")
    assert served_checkpoint(multimodal, hybrid) == ""  # "" = export the model as built
    assert served_checkpoint(text, hybrid) == text
    assert served_checkpoint(multimodal, dense) == multimodal  # a Qwen3 exports its own names
    assert served_checkpoint("", hybrid) == ""
