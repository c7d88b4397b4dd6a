"""``*_env`` settings hold the NAME of an environment variable: a key pasted there is refused at
start-up (naming the field, never echoing the value) and reaches no file of the run directory;
a setting a client will read that names an unset variable is a warning."""

import logging
import os
import subprocess
import sys

import pytest

from configs import arise, arise_rl, grpo
from rubric_rl.config.config_validation import validate_config
from rubric_rl.rubrics.llm import check_env_settings, looks_like_a_key, redact_env_settings
from tests.launch_env import suite_xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Made-up keys in the shapes of real ones (OpenAI project key, Google API key, a bare token).
KEYS = [
    "sk-proj-Zq81mXv0aBcDeFgHiJkLmNoPqRsTuV",
    "AIzaSyD3x4mpl3K3yV4lu3F0rT3st1ng00000",
    "a8F3kq92LmZx0PqR7sT4vW1yB6nC5dE",
    "Bearer abc.def",
]
NAMES = ["OPENAI_API_KEY", "GEMINI_API_KEY", "MY_JUDGE_KEY", "judge_key", "KEY2"]


@pytest.mark.parametrize("value", KEYS)
def test_a_key_like_value_is_refused_naming_the_field_not_the_value(value):
    assert looks_like_a_key(value)
    c = grpo.get_config("smoke")
    c.judge.llm.api_key_env = value  # refused even when no client reads it
    with pytest.raises(ValueError) as err:
        validate_config(c, num_devices=8)
    msg = str(err.value)
    assert msg.startswith("config.judge.llm.api_key_env: takes the NAME of an environment")
    assert value not in msg and value[6:] not in msg


@pytest.mark.parametrize("name", NAMES)
def test_variable_names_are_accepted(name):
    assert looks_like_a_key(name) is None
    c = grpo.get_config("smoke")
    c.judge.llm.api_key_env = name
    validate_config(c, num_devices=8)


def test_an_unset_variable_is_a_warning_when_a_client_reads_it(caplog):
    c = grpo.get_config("smoke")
    c.judge.llm.api_key_env = "RUBRIC_RL_TEST_UNSET_KEY"
    assert check_env_settings(c, {}) == []  # judge.kind="programmatic": no client reads it
    c.judge.kind = "llm"
    with caplog.at_level(logging.WARNING):
        (warning,) = check_env_settings(c, {})
    assert warning.startswith(
        "config.judge.llm.api_key_env names the environment variable RUBRIC_RL_TEST_UNSET_KEY, "
        "which is not set"
    )
    assert warning in caplog.text
    assert check_env_settings(c, {"RUBRIC_RL_TEST_UNSET_KEY": "k"}) == []
    c.judge.llm.backend = "genai"  # reads GEMINI_API_KEY / GOOGLE_API_KEY, not this setting
    assert check_env_settings(c, {}) == []


def test_arise_reflection_reads_its_own_setting_and_the_judges_fallback():
    c = arise.get_config()
    c.arise.reflection = "llm"
    c.arise.llm.api_key_env = "RUBRIC_RL_REFLECTION_KEY"
    warnings = check_env_settings(c, {})
    assert [w.split(" names ")[0] for w in warnings] == ["config.arise.llm.api_key_env"]
    c.arise.llm.api_key_env = ""  # empty: the judge's setting is the one read
    warnings = check_env_settings(c, {})
    assert [w.split(" names ")[0] for w in warnings] == ["config.judge.llm.api_key_env"]
    c.arise.llm.api_key_env = KEYS[0]
    with pytest.raises(ValueError, match=r"^config\.arise\.llm\.api_key_env: takes the NAME"):
        check_env_settings(c, {})


def test_the_arise_rl_llm_coach_reads_its_own_setting_and_the_judges_fallback():
    c = arise_rl.get_config()
    c.judge.llm.backend = "openai"
    c.arise_rl.coach_llm.api_key_env = "RUBRIC_RL_COACH_KEY"
    assert check_env_settings(c, {}) == []  # the rule coach: no client reads it
    c.arise_rl.coach = "llm"
    warnings = check_env_settings(c, {})
    assert [w.split(" names ")[0] for w in warnings] == ["config.arise_rl.coach_llm.api_key_env"]
    c.arise_rl.coach_llm.api_key_env = ""  # empty: the judge's setting is the one read
    warnings = check_env_settings(c, {})
    assert [w.split(" names ")[0] for w in warnings] == ["config.judge.llm.api_key_env"]
    c.arise_rl.coach_llm.api_key_env = KEYS[0]
    with pytest.raises(ValueError, match=r"^config\.arise_rl\.coach_llm\.api_key_env: takes"):
        check_env_settings(c, {})


def test_redaction_of_a_config_record():
    record = {"judge": {"llm": {"api_key_env": KEYS[0], "model": "m"}}, "x_env": ["A_B", KEYS[1]]}
    assert redact_env_settings(record) == {
        "judge": {"llm": {"api_key_env": "<redacted: looked like an API key>", "model": "m"}},
        "x_env": ["A_B", "<redacted: looked like an API key>"],
    }


def test_launch_refuses_a_pasted_key_and_writes_it_nowhere(tmp_path):
    # Before: the run trained and config.json held the key, with no warning.
    key = KEYS[0]
    workdir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke",
        f"--workdir={workdir}", f"--config.judge.llm.api_key_env={key}",
        "--config.train.steps=1",
    ]  # fmt: skip
    env = dict(os.environ, XLA_FLAGS=suite_xla_flags(), JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=REPO, env=env, timeout=300, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config.judge.llm.api_key_env: takes the NAME of an environment variable" in log
    assert key not in log
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(key.encode() not in p.read_bytes() for p in written), written
    assert not (workdir / "config.json").exists()
