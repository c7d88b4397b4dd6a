"""Keeps a sweep's finished runs where ``launch/aggregate.py`` can read them after the run
directories are gone: per run, ``config.json``, ``metrics.jsonl`` gzipped and ARISE's pool events
when present, under the same ``<group>/seed<k>`` layout: every table of the aggregate but the
calibration's (its probe files are large; aggregate the run directories for that one).

    python launch/archive.py runs/protocol_h benchmarks/results/runs/protocol_h.tar.xz

A destination ending in ``.tar.xz`` is the packed form (``launch/packed.py``: one file per
comparison, the form the repository keeps); any other is a directory tree.

A protocol whose runs take longer than one machine's session adds its seeds to the archive as
they finish; ``aggregate.py <archive>`` (with ``--out <dir>`` for a packed one) then tables
every archived run. Unfinished runs are skipped and listed (never archived half-way); an archived
run is not replaced unless ``--force``. The archive's gzip files and packed members carry no
timestamp, so re-archiving a run gives the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from launch import packed  # noqa: E402
from rubric_rl import analysis as an  # noqa: E402

COPIED = ("config.json", "controllers/arise.jsonl", "COMMIT")


def archive_run(run_dir: str, dest: str) -> None:
    """Writes ``dest/config.json`` (and the other files of ``COPIED`` present) and
    ``dest/metrics.jsonl.gz``."""
    src = an.metrics_path(run_dir)
    if src is None:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (not a run directory?)")
    os.makedirs(dest, exist_ok=True)
    for name in COPIED:
        if os.path.exists(os.path.join(run_dir, name)):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copyfile(os.path.join(run_dir, name), os.path.join(dest, name))
    out = os.path.join(dest, "metrics.jsonl.gz")
    if src.endswith(".gz"):
        shutil.copyfile(src, out)
        return
    with open(src, "rb") as f, open(out + ".tmp", "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            shutil.copyfileobj(f, gz)
    os.replace(out + ".tmp", out)


def archive(root: str, dest_root: str, *, force: bool = False) -> dict[str, list[str]]:
    """Archives every finished ``root/<group>/seed<k>`` (module docstring); returns the runs
    ``archived``, ``kept`` (already archived) and ``unfinished``."""
    done: dict[str, list[str]] = {"archived": [], "kept": [], "unfinished": []}
    for group, seeds in sorted(an.find_runs(root).items()):
        for seed, run_dir in sorted(seeds.items()):
            name = f"{group}/seed{seed}"
            if not an.is_finished(run_dir):
                done["unfinished"].append(name)
                continue
            # A final checkpoint with metrics that stop short (rows lost or cut): not whole.
            short = an.stopped_short(an.load_run(run_dir))
            if short is not None:
                done["unfinished"].append(f"{name} (metrics end at {short})")
                continue
            dest = os.path.join(dest_root, group, f"seed{seed}")
            if an.metrics_path(dest) is not None and not force:
                done["kept"].append(name)
                continue
            archive_run(run_dir, dest)
            done["archived"].append(name)
    if os.path.exists(os.path.join(root, "COMMIT")):
        os.makedirs(dest_root, exist_ok=True)
        with open(os.path.join(root, "COMMIT"), encoding="utf-8") as f:
            commit = f.read().strip()
        with open(os.path.join(dest_root, "COMMITS"), "a+", encoding="utf-8") as f:
            f.seek(0)
            if commit not in f.read().split():
                f.write(commit + "\n")
    return done


def archive_to(root: str, dest: str, *, force: bool = False) -> dict[str, list[str]]:
    """``archive`` into ``dest``: a directory, or a packed archive (``<name>.tar.xz``,
    ``launch/packed.py``) that is unpacked when present, added to and packed again, so a
    comparison's runs can be archived as they finish."""
    if not packed.is_packed(dest):
        return archive(root, dest, force=force)
    with tempfile.TemporaryDirectory(prefix="archive-") as tmp:
        tree = os.path.join(tmp, "tree")
        if os.path.exists(dest):
            packed.unpack(dest, tree)
        done = archive(root, tree, force=force)
        if os.path.isdir(tree):
            packed.pack(tree, dest)
    return done


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="the sweep's root (<root>/<group>/seed<k>)")
    p.add_argument("dest", help="the archive: a directory, or a packed <name>.tar.xz")
    p.add_argument("--force", action="store_true", help="replace runs already archived")
    args = p.parse_args(argv)
    for what, names in archive_to(args.root, args.dest, force=args.force).items():
        print(f"{what}: {len(names)}" + (f" ({', '.join(names)})" if names else ""))


if __name__ == "__main__":
    main()
