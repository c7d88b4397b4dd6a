"""Config keys checked at start-up, before the warm start, with errors naming the field and the
allowed values: the loss's registry names, the model's name and dtypes, and self-distillation
switched on with nothing to supply a teacher context."""

import os
import subprocess
import sys

import pytest

from configs import common, grpo
from rubric_rl.config import builders
from rubric_rl.controllers.base import Controller
from rubric_rl.models.qwen3_5_config import ALL_PRESETS as PRESETS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _smoke(**changes):
    c = grpo.get_config("smoke")
    for field, value in changes.items():
        sect, key = field.split(".")
        c[sect][key] = value
    return c


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("loss.advantage", "gpro", ["dr-grpo", "grpo", "mean_only"]),
        ("loss.reward", "weigthed", ["healthbench", "mean", "weighted", "task_verifier"]),
        ("loss.agg_mode", "token_mean", ["token-mean", "seq-mean-token-mean"]),
        ("loss.rollout_correction", "bypas", ["bypass", "off"]),
        ("model.dtype", "float33", ["float32", "bfloat16", "float16"]),
        ("model.param_dtype", "fp32", ["float32", "bfloat16", "float16"]),
        ("warmstart.schedule", "linear", ["constant", "cosine"]),
        ("controllers.sampler", "unifrom", ["uniform", "sec", "capability"]),
    ],
)
def test_a_misnamed_key_names_the_field_and_the_allowed_values(field, value, allowed):
    c = _smoke(**{field: value})
    with pytest.raises(ValueError) as info:
        common.validate_config(c, num_devices=8)
    msg = str(info.value)
    assert msg.startswith(f"config.{field}: must be one of [")
    assert msg.endswith(f"got {value!r}")
    assert all(repr(a) in msg for a in allowed)


def test_kl_kind_is_checked_when_the_kl_penalty_is_on():
    c = _smoke(**{"loss.kl_kind": "k4"})
    common.validate_config(c, num_devices=8)  # kl_beta = 0: the kind is never read
    c.loss.kl_beta = 0.01
    with pytest.raises(ValueError, match=r"^config\.loss\.kl_kind: must be one of \['k1', 'k2'"):
        common.validate_config(c, num_devices=8)


def test_task_verifier_reward_on_the_dataset_domain_is_refused():
    c = _smoke(**{"loss.reward": "task_verifier"})
    common.validate_config(c, num_devices=8)  # the embedded domain has a verifier
    c.domain.name = "dataset"
    c.domain.dataset.update(format="jsonl", train=os.path.join(REPO, "tests", "data"))
    c.warmstart.steps = 0
    with pytest.raises(ValueError, match=r"^config\.loss\.reward: 'task_verifier' needs"):
        common.validate_config(c, num_devices=8)


def test_unknown_model_name_says_so_and_lists_the_presets():
    # Before: validation passed and the run died on a missing tokenizer directory '5M'.
    with pytest.raises(ValueError) as info:
        common.validate_config(_smoke(**{"model.name": "5M"}), num_devices=8)
    msg = str(info.value)
    assert msg.startswith("config.model.name: unknown model '5M' (did you mean '5m'?")
    assert str(list(PRESETS)) in msg and "Hugging Face checkpoint directory" in msg
    assert "tokenizer" not in msg
    with pytest.raises(ValueError, match=r"^config\.model\.name: unknown model 'qwen9'"):
        common.validate_config(_smoke(**{"model.name": "qwen9"}), num_devices=8)


def test_a_real_shape_preset_needs_its_tokenizer(tmp_path):
    c = _smoke(**{"model.name": "qwen3_0_6b"})
    with pytest.raises(ValueError, match=r"^config\.model\.tokenizer: preset 'qwen3_0_6b'"):
        common.validate_config(c, num_devices=8)
    c.model.tokenizer = str(tmp_path)
    common.validate_config(c, num_devices=8)


def test_sd_coef_with_self_distillation_off_is_refused():
    c = _smoke(**{"loss.sd_coef": 0.5})
    with pytest.raises(ValueError, match=r"^config\.loss\.sd_coef: 0\.5 with loss\.sd_estimator"):
        common.validate_config(c, num_devices=8)


@pytest.mark.parametrize("beta", [-0.1, 1.5])
def test_sd_jsd_beta_outside_the_unit_interval_is_refused(beta):
    c = _smoke(**{"loss.sd_estimator": "jsd", "loss.sd_jsd_beta": beta})
    with pytest.raises(ValueError, match=r"^config\.loss\.sd_jsd_beta: must be in \[0, 1\]"):
        common.validate_config(c, num_devices=8)
    with pytest.raises(ValueError, match=r"TrainConfig\.sd_jsd_beta must be in \[0, 1\]"):
        builders.train_config(c)


def test_sd_jsd_beta_reaches_the_train_config():
    assert grpo.get_config("smoke").loss.sd_jsd_beta == 0.5  # TRL's default β
    c = _smoke(**{"loss.sd_estimator": "jsd", "loss.sd_jsd_beta": 0.9})
    common.validate_config(c, num_devices=8)
    tc = builders.train_config(c)
    assert (tc.sd_estimator, tc.sd_jsd_beta, tc.sd_per_token_kl) == ("jsd", 0.9, True)


class _Coach(Controller):
    name = "coach"

    def teacher_context(self, task, rollouts):
        return "<coach> be brief </coach>"


def test_self_distillation_without_a_teacher_context_source_is_refused():
    # GRPO's controllers (a sampler, calibration) supply no teacher context: every group's SD
    # term was exactly 0 and the run trained plain GRPO. Refused when the controllers are built,
    # in Trainer.__init__, before the warm start.
    c = _smoke(**{"loss.sd_estimator": "full", "loss.sd_coef": 0.5})
    common.validate_config(c, num_devices=8)
    domain = builders.build_domain(c)
    with pytest.raises(ValueError) as info:
        builders.build_controllers(c, domain)
    msg = str(info.value)
    assert msg.startswith("config.loss.sd_coef: self-distillation is on (sd_estimator='full'")
    assert "no active controller supplies a teacher context (method 'grpo'" in msg
    controllers = builders.build_controllers(c, domain, [_Coach()])
    assert controllers.controllers[-1].name == "coach"
    c.loss.sd_coef = 0.0  # nothing trained by SD: nothing to refuse
    builders.build_controllers(c, domain)


def test_launch_refuses_a_misnamed_loss_key_before_the_warm_start(tmp_path):
    # Before: the smoke config warm-started, then the first RL step raised a KeyError.
    cmd = [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke",
        f"--workdir={tmp_path / 'run'}", "--config.loss.advantage=gpro",
    ]  # fmt: skip
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=REPO, env=env, timeout=300, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "config.loss.advantage: must be one of ['dr-grpo', 'grpo', 'mean_only'], got 'gpro'" in log
    )
    assert "warm start" not in log
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("rollout.min_new_tokens", -1, "must be an int in [0, max_new_tokens="),
        ("rollout.min_new_tokens", 10_000, "must be an int in [0, max_new_tokens="),
        # (the ConfigDict refuses a string for this bool field itself; None gets through)
        ("rollout.ignore_eos", None, "must be True or False, got None"),
    ],
)
def test_min_new_tokens_and_ignore_eos_are_checked_naming_the_field(field, value, expected):
    c = _smoke(**{field: value})
    with pytest.raises(ValueError) as info:
        common.validate_config(c, num_devices=8)
    assert str(info.value).startswith(f"config.{field}: {expected}")


def test_rollout_sampling_options_reach_the_sampling_params():
    import types

    from rubric_rl.services.sampler import Sampler

    c = _smoke()
    assert (c.rollout.min_new_tokens, c.rollout.ignore_eos) == (0, False)  # the defaults
    sp = Sampler.sampling_params(types.SimpleNamespace(config=c), 3)
    assert (sp.min_new_tokens, sp.ignore_eos, sp.n) == (0, False, 3)
    c.rollout.min_new_tokens, c.rollout.ignore_eos = 4, True
    common.validate_config(c, num_devices=8)
    sp = Sampler.sampling_params(types.SimpleNamespace(config=c), 3)
    assert (sp.min_new_tokens, sp.ignore_eos) == (4, True)


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("checkpoint.every", -1, "must be >= 0 (0 = no periodic checkpoints), got -1"),
        ("checkpoint.keep", 0, "must be >= 1, got 0"),
        ("checkpoint.final", None, "must be True or False, got None"),
    ],
)
def test_checkpoint_settings_are_checked_naming_the_field(field, value, expected):
    common.validate_config(
        _smoke(**{"checkpoint.every": 0, "checkpoint.final": False}), num_devices=8
    )
    with pytest.raises(ValueError) as info:
        common.validate_config(_smoke(**{field: value}), num_devices=8)
    assert str(info.value) == f"config.{field}: {expected}"


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("sd_sampled_logps", "stale", "loss.sd_sampled_logps"),
        ("sd_agg_mode", "per-token", "loss.sd_agg_mode"),
    ],
)
def test_sd_fidelity_options_are_checked(field, value, match):
    from rubric_rl.config.config_validation import validate_config

    c = grpo.get_config("smoke")
    with c.unlocked():
        c.loss[field] = value
    with pytest.raises(ValueError, match=match):
        validate_config(c, num_devices=1)
