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

# The suite's time is mostly XLA:CPU compiling tiny programs that then run for milliseconds, so
# tests compile for compile speed: XLA:CPU's older elemental emitters for fusions instead of its
# MLIR fusion emitters (a third of the compile time) and its LLVM backend at its lowest
# optimisation. Both change code generation, not XLA's HLO passes; every equality a test checks
# compares two programs compiled alike. Launch subprocesses get them too (launch_env.py).
# ``RUBRIC_RL_TEST_XLA_FLAGS`` set (even empty) replaces these flags.
# The older emitters fuse differently from XLA:CPU's default: see `pytest_runtest_protocol`.
_FAST_CODEGEN = "--xla_cpu_use_fusion_emitters=false"
# Each program also runs on one thread (no Eigen intra-op pool): with one test process per core,
# a pool per process oversubscribes the cores and spins while idle (two subsets of the suite: about
# a tenth less CPU; the full suite's time moved within its noise).
os.environ.setdefault(
    "RUBRIC_RL_TEST_XLA_FLAGS",
    f"{_FAST_CODEGEN} --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_multi_thread_eigen=false",
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


def pytest_addoption(parser):
    parser.addoption(
        "--e2e",
        action="store_true",
        help="also run the tests marked e2e: real-model end-to-end runs beyond each method's "
        "smoke run and exact resume (docs/testing.md)",
    )


def pytest_collection_modifyitems(session, config, items):
    """Tests marked ``e2e`` are skipped unless ``--e2e`` is given. (The order of files is
    xdist's: with ``--dist loadfile`` it hands out files by their number of tests, most first;
    replaying the suite's measured file times, other orders, longest first included, end the
    two workers within seconds of it.)"""
    if not config.getoption("--e2e"):
        import pytest

        skip = pytest.mark.skip(reason="e2e tier: run with --e2e (docs/testing.md)")
        for item in items:
            if item.get_closest_marker("e2e") is not None:
                item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["RUBRIC_RL_TEST_JAX_CACHE"], ignore_errors=True)


def pytest_runtest_protocol(item, nextitem):
    """A test marked ``default_codegen`` asserts bit-equality between two differently fused
    programs (an identical teacher's KL exactly 0, sharded init equal to eager init), which holds
    with XLA:CPU's default code generation and not with the suite's fast one: it runs in a child
    pytest with every other flag unchanged, and its outcome is reported here."""
    flags = os.environ["RUBRIC_RL_TEST_XLA_FLAGS"].split()
    if item.get_closest_marker("default_codegen") is None or _FAST_CODEGEN not in flags:
        return None
    import re
    import subprocess
    import sys
    import time

    from _pytest.reports import TestReport

    def without(value):
        return " ".join(f for f in value.split() if f != _FAST_CODEGEN)

    env = dict(os.environ)
    env.update(
        RUBRIC_RL_TEST_XLA_FLAGS=without(env["RUBRIC_RL_TEST_XLA_FLAGS"]),
        XLA_FLAGS=without(env["XLA_FLAGS"]),
    )
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--junitxml=", item.nodeid],
        cwd=str(item.config.rootpath), env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    took = time.time() - start
    out = proc.stdout + proc.stderr
    if proc.returncode == 0 and re.search(r"^1 passed", out, re.M):
        outcome, longrepr = "passed", None
    elif proc.returncode == 0 and re.search(r"^1 skipped", out, re.M):
        outcome, longrepr = "skipped", (str(item.path), item.location[1], out[-2000:])
    else:
        outcome = "failed"
        longrepr = f"(run with XLA:CPU's default code generation, exit {proc.returncode})\n"
        longrepr += out[-12000:]
    keywords = {k: 1 for k in item.keywords}
    for when in ("setup", "call", "teardown"):
        report = TestReport(
            item.nodeid, item.location, keywords,
            outcome if when == "call" else "passed",
            longrepr if when == "call" else None,
            when, duration=took if when == "call" else 0.0,
        )  # fmt: skip
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
