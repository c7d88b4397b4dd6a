"""A run archive packed into one file per comparison: ``benchmarks/results/runs/<name>.tar.xz``.

A run archive (``launch/archive.py``) is a tree of ``<group>/seed<k>/{config.json,
metrics.jsonl.gz, controllers/arise.jsonl}`` plus a few files at its root (``COMMITS``). Packed,
the same tree is one xz-compressed tar that ``launch/aggregate.py`` and ``launch/archive.py`` read
and write directly:

    python launch/packed.py pack benchmarks/results/runs/protocol_r    # -> protocol_r.tar.xz
    python launch/packed.py unpack benchmarks/results/runs/protocol_r.tar.xz /tmp/protocol_r

Inside the tar, ``metrics.jsonl.gz`` is stored decompressed as ``metrics.jsonl``: xz compresses
across the seeds' near-identical rows, which per-file gzip cannot (the RISED comparison's 40 runs:
2.1 MB against 3.7 MB for the tar of the gzip files). Members are in name order with mtime 0,
owner 0 and fixed modes, so packing the same tree twice gives the same bytes. Reading extracts
into a temporary directory and hands that to the unchanged directory readers
(``rubric_rl.analysis``), so a packed archive gives exactly the tables its tree gives.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import lzma
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Sequence

SUFFIX = ".tar.xz"
_GZ_METRICS = "metrics.jsonl.gz"
# The xz preset: the highest ratio; a comparison packs in seconds and unpacks in well under one.
_PRESET = 9 | lzma.PRESET_EXTREME


def is_packed(path: str) -> bool:
    """Whether ``path`` names a packed archive (by its suffix; it need not exist yet)."""
    return path.endswith(SUFFIX)


def _members(tree: str) -> Iterator[tuple[str, str]]:
    """(name inside the tar, path on disk) of every file under ``tree``, in name order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for f in filenames:
            path = os.path.join(dirpath, f)
            if os.path.islink(path) or not os.path.isfile(path):
                raise ValueError(f"{path}: not a plain file; a run archive holds only files")
            found.append((os.path.relpath(path, tree).replace(os.sep, "/"), path))
    yield from sorted(found)


def pack(tree: str, dest: str) -> int:
    """Packs the archive ``tree`` into ``dest`` (``<name>.tar.xz``, written atomically);
    returns the number of files packed."""
    if not is_packed(dest):
        raise ValueError(f"{dest}: a packed archive's name ends with {SUFFIX}")
    if not os.path.isdir(tree):
        raise FileNotFoundError(f"{tree}: no such directory")
    buf = io.BytesIO()
    n = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in _members(tree):
            if os.path.basename(name) == _GZ_METRICS:
                name = name[: -len(".gz")]
                with gzip.open(path, "rb") as f:
                    data = f.read()
            else:
                with open(path, "rb") as f:
                    data = f.read()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
            n += 1
    if n == 0:
        raise ValueError(f"{tree}: no files to pack")
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with open(dest + ".tmp", "wb") as f:
        f.write(lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, preset=_PRESET))
    os.replace(dest + ".tmp", dest)
    return n


def unpack(packed: str, dest: str) -> str:
    """Extracts ``packed`` into the directory ``dest`` (created); returns ``dest``. A member that
    is not a plain file, or whose name is absolute or climbs out with ``..``, is an error naming
    it (nothing is written outside ``dest``)."""
    if not os.path.isfile(packed):
        raise FileNotFoundError(f"{packed}: no such packed archive")
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(packed, mode="r:xz") as tar:
        for info in tar:
            parts = info.name.split("/")
            if not info.isfile() or info.name.startswith("/") or ".." in parts:
                raise ValueError(f"{packed}: member {info.name!r} is not a plain relative file")
            out = os.path.join(dest, *parts)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            src = tar.extractfile(info)
            assert src is not None  # a regular file always has a body
            with src, open(out, "wb") as f:
                shutil.copyfileobj(src, f)
    return dest


@contextlib.contextmanager
def opened(root: str) -> Iterator[str]:
    """A directory holding ``root``'s runs: ``root`` itself when it is a directory, else a
    temporary extraction of the packed archive (removed on exit)."""
    if not is_packed(root):
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="packed-") as tmp:
        yield unpack(root, os.path.join(tmp, os.path.basename(root)[: -len(SUFFIX)]))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pk = sub.add_parser("pack", help="pack a run archive's directory into <dir>.tar.xz")
    pk.add_argument("tree")
    pk.add_argument("dest", nargs="?", help=f"default: <tree>{SUFFIX}")
    up = sub.add_parser("unpack", help="extract a packed archive into a directory")
    up.add_argument("packed")
    up.add_argument("dest")
    args = p.parse_args(argv)
    if args.cmd == "pack":
        dest = args.dest or os.path.normpath(args.tree) + SUFFIX
        print(f"{dest}: {pack(args.tree, dest)} files")
    else:
        print(unpack(args.packed, args.dest))


if __name__ == "__main__":
    main()
