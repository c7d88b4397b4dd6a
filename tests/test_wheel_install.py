"""The package as a user installs it: a wheel built from the project's own files,
installed into a fresh virtual environment, used from a directory outside the repository.

The fresh environment gets the wheel and nothing else of the repository: ``rubric_rl`` is
installed from the wheel (``--no-deps``, offline), and the dependencies are the test
environment's, made visible through a ``.pth`` line naming its site-packages directory. A plain
path line adds that directory to ``sys.path`` without processing its own ``.pth`` files, so the
editable install of the checkout (a ``.pth`` import hook there) is not active: the test asserts
that ``rubric_rl`` is imported from the new environment's site-packages. ``configs/`` and
``examples/`` are not in the wheel; the run is ``examples/peer_workload.py`` copied into the
working directory, 2 GRPO steps (1 warm-up, 1 timed) with a plain Python reward function.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests.launch_env import suite_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "peer_workload.py")

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: str, env: dict[str, str] | None = None, timeout: int = 600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
        f"--- stderr\n{proc.stderr[-8000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(python of a fresh venv with only the wheel installed, a scratch dir outside the repo)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy, so the build's build/ and egg-info never touch the checkout
    os.makedirs(src)
    for f in ("setup.py", "pyproject.toml"):
        shutil.copy(os.path.join(ROOT, f), src / f)
    shutil.copytree(
        os.path.join(ROOT, "rubric_rl"),
        src / "rubric_rl",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    dist = tmp / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(dist), str(src)],
        cwd=str(tmp),
    )
    (wheel,) = list(dist.glob("rubric_rl-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "rubric_rl/trainer.py" in names and "rubric_rl/config/defaults.py" in names
    assert not [n for n in names if n.startswith(("configs/", "tests/", "examples/"))], names

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=str(tmp))
    python = str(venv / "bin" / "python")
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index"]
        + [str(wheel)],
        cwd=str(tmp),
    )
    site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=str(tmp)
    ).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    with open(os.path.join(site, "_test_env_dependencies.pth"), "w") as f:
        f.write("\n".join(sorted(deps)) + "\n")
    work = tmp / "work"
    os.makedirs(work)
    return python, site, str(work)


def _clean_env() -> dict[str, str]:
    """The test's environment without the repository on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = suite_xla_flags()  # one CPU device, as a user's script gets
    return env


def test_the_installed_wheel_imports_from_its_own_environment(wheel_env):
    python, site, work = wheel_env
    out = _run(
        [
            python,
            "-c",
            "import json, rubric_rl, rubric_rl.trainer, rubric_rl.config.defaults as d;"
            "import importlib.util as u;"
            "print(json.dumps([rubric_rl.__file__, u.find_spec('configs') is None,"
            " d.grpo_config().method]))",
        ],
        cwd=work,
        env=_clean_env(),
    )
    path, no_configs, method = json.loads(out.stdout.strip().splitlines()[-1])
    assert path.startswith(site), f"rubric_rl imported from {path}, not the wheel's {site}"
    assert no_configs, "configs/ is importable: the test would not show the package runs alone"
    assert method == "grpo"


def test_a_two_step_grpo_with_a_plain_reward_function_runs_outside_the_repository(wheel_env):
    python, _, work = wheel_env
    script = os.path.join(work, "peer_workload.py")
    shutil.copy(EXAMPLE, script)
    out = _run(
        [python, script, "--steps=1", "--warmup=1", f"--workdir={os.path.join(work, 'peer')}"],
        cwd=work,
        env=_clean_env(),
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == 2 and result["timed"] == 1  # the first step (warm-up) untimed
    # Every completion ran to 64 tokens (ignore_eos) and got the plain function's reward.
    assert result["completion_tokens_mean"] == 64.0
    assert 0.0 <= result["reward_mean"] <= 1.0 and result["reward_fn_failed"] == 0.0
    assert result["step_s_median"] > result["gen_s_median"] > 0 and result["train_s_median"] > 0
    assert result["params"] == 3_279_616  # the peer shape with the exact 512-id vocabulary
    rows = [json.loads(line) for line in open(os.path.join(work, "peer", "run", "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]
