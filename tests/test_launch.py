"""Configs: variants, locking, start-up validation naming the field."""

import os
import sys

import pytest

from configs import common, grpo


def test_variants():
    base = grpo.get_config()
    assert base.model.name == "1m" and base.rollout.engine == "jax"
    smoke = grpo.get_config("smoke")
    assert smoke.model.name == "tiny" and smoke.train.steps < base.train.steps
    assert grpo.get_config("smoke,model=5m").model.name == "5m"
    gpu = grpo.get_config("gpu=/ckpt/q")
    assert (gpu.rollout.engine, gpu.judge.kind, gpu.model.name) == ("sglang", "llm", "/ckpt/q")
    with pytest.raises(ValueError, match="unknown variant"):
        grpo.get_config("smok")


def test_locked_config_rejects_a_typo():
    c = grpo.get_config("smoke")
    with pytest.raises(AttributeError):
        c.rollout.temprature = 0.5
    c.rollout.temperature = 0.5  # existing keys stay writable
    assert c.rollout.temperature == 0.5


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("rollout.samples_per_task", 1, "config.rollout.samples_per_task"),
        ("loss.clip_eps_low", -0.1, "config.loss.clip_eps_low"),
        ("rollout.engine", "vllm", "config.rollout.engine"),
        ("rollout.buckets", (16, 8), "config.rollout.buckets"),
        ("model.name", "/no/such/ckpt", "config.model.name"),
        ("rollout.top_p", 0.9, "config.rollout.top_p"),
        ("optim.epochs", 0, "config.optim.epochs"),
        ("warmstart.p_keep", 1.5, "config.warmstart.p_keep"),
        ("warmstart.copy_fraction", -0.1, "config.warmstart.copy_fraction"),
        ("warmstart.copy_steps", 99, "config.warmstart.copy_steps"),
        ("domain.n_validation", -1, "config.domain.n_validation"),
        ("optim.mini_batches", 3, "config.optim.mini_batches"),
    ],
)
def test_validation_names_the_field(field, value, match):
    c = grpo.get_config("smoke")
    sect, key = field.split(".")
    c[sect][key] = value
    with pytest.raises(ValueError, match=match.replace(".", r"\.")):
        common.validate_config(c, num_devices=8)


def test_batch_must_divide_the_mesh():
    c = grpo.get_config("smoke")  # 4 tasks x 4 samples = 16 sequences
    common.validate_config(c, num_devices=8)
    c.rollout.tasks_per_step = 3  # 12 sequences on 8 data shards
    with pytest.raises(ValueError, match=r"config\.rollout\.tasks_per_step.*divisible"):
        common.validate_config(c, num_devices=8)
    c.rollout.tasks_per_step = 4
    c.mesh.data = 3
    with pytest.raises(ValueError, match=r"config\.mesh"):
        common.validate_config(c, num_devices=8)
    assert common.mesh_shape(grpo.get_config(), 8) == (8, 1, 1)


def test_acceptance_bands_must_be_ordered():
    c = common.get_base_config()
    c.critic = dict(rollout_band=(28.0, 10.2))
    with pytest.raises(ValueError, match=r"config\.critic\.rollout_band"):
        common.validate_config(c)


def test_explicit_coordinator_needs_the_process_count_and_index(monkeypatch):
    # jax reads only the coordinator address from the environment; without these two the run
    # would fail deep inside jax ("Number of processes must be defined").
    import pytest

    from rubric_rl.launch import maybe_initialize_distributed

    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
    monkeypatch.setenv("JAX_PROCESS_ID", "0")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES is not"):
        maybe_initialize_distributed()
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    assert maybe_initialize_distributed() is False  # one host: nothing to initialise


def test_compilation_cache_by_default_for_launches():
    """A launch keeps jax's persistent compilation cache: the user's cache directory unless
    jax's own variable names one, RUBRIC_RL_JAX_CACHE chooses another, or turns it off."""
    import os

    from rubric_rl.launch import compilation_cache_dir

    home = os.path.expanduser("~")
    assert compilation_cache_dir({}) == os.path.join(home, ".cache", "rubric_rl", "jax")
    assert compilation_cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/rubric_rl/jax"
    assert compilation_cache_dir({"RUBRIC_RL_JAX_CACHE": "/d"}) == "/d"
    assert compilation_cache_dir({"RUBRIC_RL_JAX_CACHE": "off"}) is None
    assert compilation_cache_dir({"JAX_COMPILATION_CACHE_DIR": "/e"}) is None  # jax reads it


def test_tcmalloc_reexec_preloads_once_and_can_be_turned_off():
    import sys

    from rubric_rl.launch import tcmalloc_reexec
    from rubric_rl.util.tcmalloc import TCMALLOC

    argv = ["/x/rubric_rl/launch.py", "--config=configs/grpo.py", "--workdir=w"]

    def there(environ):  # the library search (test_tcmalloc.py tests it) finds TCMALLOC
        return TCMALLOC

    args, env = tcmalloc_reexec(argv, {"LD_PRELOAD": "/lib/other.so", "A": "1"}, find=there)
    assert args == [sys.executable, "-m", "rubric_rl.launch", *argv[1:]]
    assert env["LD_PRELOAD"] == f"{TCMALLOC}:/lib/other.so" and env["A"] == "1"
    # The re-executed process sees it preloaded and runs: no loop.
    assert tcmalloc_reexec(argv, env, find=there) is None
    assert tcmalloc_reexec(argv, {"RUBRIC_RL_TCMALLOC": "0"}, find=there) is None
    assert tcmalloc_reexec(argv, {}, find=lambda environ: None) is None
    assert tcmalloc_reexec(argv, {}, find=there)[1]["LD_PRELOAD"] == TCMALLOC


def test_library_info_lines_are_filtered_and_warnings_kept():
    import logging

    import optax

    from rubric_rl.launch import quiet_library_info

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(quiet_library_info)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        # optax logs this INFO line for every zero-length warm-up schedule (every launch).
        optax.polynomial_schedule(1.0, 1.0, power=1, transition_steps=0)
        logging.getLogger("rubric_rl").info("kept")
        logging.getLogger("absl").warning("kept too")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert [r.getMessage() for r in records] == ["kept", "kept too"]


def test_launch_refuses_server_gpus_the_process_cannot_see(tmp_path):
    """rollout.sglang.gpus naming a GPU the process does not see (CUDA_VISIBLE_DEVICES lists one):
    one line naming the key, exit 1, no run directory."""
    import subprocess

    from tests.launch_env import launch_env

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(launch_env(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="0")
    cmd = [sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke",
           "--config.rollout.engine=sglang", "--config.rollout.sglang.gpus=1",
           f"--workdir={tmp_path / 'run'}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    want = "rubric_rl.launch: config.rollout.sglang.gpus='1': index 1 but this process sees 1 GPUs"
    assert want in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()
