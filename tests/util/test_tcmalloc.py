"""The tcmalloc preload's library search: the directories it is told to search (fake library
files in temp dirs), LD_LIBRARY_PATH and the Python environment's lib in the default search, the
multiarch directories, ctypes.util.find_library as the fallback. No re-exec here
(test_launch.py checks the re-exec's environment)."""

import ctypes.util
import os
import platform
import sys
import sysconfig

import pytest

from rubric_rl.util.tcmalloc import TCMALLOC, find_tcmalloc, library_dirs, preload_env


def _fake_library(directory, name):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b"\x7fELF not really")
    return path


def test_the_first_directory_holding_a_library_wins_and_minimal_is_preferred(tmp_path):
    empty, full_only, both = tmp_path / "empty", tmp_path / "full", tmp_path / "both"
    empty.mkdir()
    full = _fake_library(full_only, "libtcmalloc.so.4")
    _fake_library(both, "libtcmalloc.so")
    minimal = _fake_library(both, "libtcmalloc_minimal.so.4")
    assert find_tcmalloc({}, dirs=[str(empty), str(both), str(full_only)]) == minimal
    assert find_tcmalloc({}, dirs=[str(empty), str(full_only), str(both)]) == full
    # a directory named like the library is not a library
    (tmp_path / "dir" / "libtcmalloc_minimal.so.4").mkdir(parents=True)
    assert find_tcmalloc({}, dirs=[str(tmp_path / "dir"), str(both)]) == minimal


def test_ld_library_path_is_searched_first_by_default(tmp_path):
    lib = _fake_library(tmp_path / "custom", "libtcmalloc_minimal.so")
    environ = {"LD_LIBRARY_PATH": f"{tmp_path / 'nothing'}{os.pathsep}{tmp_path / 'custom'}"}
    assert find_tcmalloc(environ) == lib
    env = preload_env(dict(environ, LD_PRELOAD="/lib/other.so"))
    assert env["LD_PRELOAD"] == f"{lib}:/lib/other.so"


def test_default_dirs_cover_the_python_environment_and_multiarch_paths(tmp_path):
    dirs = library_dirs({"CONDA_PREFIX": str(tmp_path / "conda")})
    assert dirs[0] == str(tmp_path / "conda" / "lib")
    assert os.path.join(sys.prefix, "lib") in dirs
    arch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    assert dirs.index(f"/usr/lib/{arch}") < dirs.index("/usr/lib") < dirs.index("/usr/lib64")
    assert f"/lib/{arch}" in dirs and f"/usr/local/lib/{arch}" in dirs
    assert len(dirs) == len(set(dirs))


def test_find_library_is_the_fallback(tmp_path):
    (tmp_path / "empty").mkdir()
    want = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    assert find_tcmalloc({}, dirs=[str(tmp_path / "empty")]) == want


def test_a_system_install_is_found_by_the_default_search():
    if not os.path.isfile(TCMALLOC):
        pytest.skip(f"{TCMALLOC} not installed here")
    assert find_tcmalloc({}) == TCMALLOC
