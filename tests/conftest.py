"""Test-session setup: 8 forced host CPU devices, set before jax is imported anywhere, and one
persistent compilation cache shared by every test of the session (both xdist workers and the
`python -m rubric_rl.launch` subprocesses the tests start).

Most of the suite's time is XLA compiling the same tiny-model programs again in test after test
(each test builds its own step and engine); with the shared cache a program compiles once per
session. A cached executable is the one the compiler produced for the same program, so results do
not change. ``RUBRIC_RL_TEST_JAX_CACHE=off`` turns the sharing off (each launch test then keeps its
own cache, as before); a path there names the directory to use."""

import os
import shutil
import tempfile

# XLA:CPU's backend (LLVM) at its lowest optimisation: the suite's time is mostly compiling
# tiny programs that then run for milliseconds, and this cuts compile time by about a quarter.
# It changes code generation, not XLA's HLO passes; every equality a test checks compares two
# programs compiled alike. Launch subprocesses get it too (launch_env.py).
# ``RUBRIC_RL_TEST_XLA_FLAGS`` set (even empty) replaces these flags.
os.environ.setdefault(
    "RUBRIC_RL_TEST_XLA_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
)
os.environ["XLA_FLAGS"] = " ".join(
    f
    for f in (
        os.environ.get("XLA_FLAGS", ""),
        os.environ["RUBRIC_RL_TEST_XLA_FLAGS"],
        "--xla_force_host_platform_device_count=8",
    )
    if f
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Named by the first process to load this file (the xdist controller, or a plain pytest run);
# the workers and every subprocess inherit the name through the environment. The one that named
# it removes it when its session ends.
_OWN_CACHE = "RUBRIC_RL_TEST_JAX_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["RUBRIC_RL_TEST_JAX_CACHE"] = os.path.join(
        tempfile.gettempdir(), f"rubric_rl-test-jax-cache-{os.getpid()}"
    )
if os.environ["RUBRIC_RL_TEST_JAX_CACHE"] != "off":
    # Set as environment, so subprocesses (launches, the wheel and notebook tests) share it too.
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["RUBRIC_RL_TEST_JAX_CACHE"]
    # Only programs worth a disk round trip (steps, engines), not every eager op; launches
    # (launch_env.py) cache everything.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.3"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    # No size limit: with one, jax scans the whole directory (and reads every entry's access
    # time) on each write under a file lock, which grew into minutes per launch late in the
    # suite. Without it an entry read mid-write fails to decompress, and jax then warns and
    # compiles the program itself: slower, never a wrong executable.

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["RUBRIC_RL_TEST_JAX_CACHE"], ignore_errors=True)
