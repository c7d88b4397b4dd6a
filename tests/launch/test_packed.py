"""launch/packed.py: a run archive packed into one .tar.xz gives the same tables as its tree, the
packed bytes are stable, archive.py adds runs to a packed archive, and every packed comparison
under benchmarks/results/runs re-aggregates to the tables of its results page."""

import gzip
import io
import os
import tarfile

import pytest

from launch import aggregate, archive, packed
from tests.launch.test_archive import _sweep

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RESULTS = os.path.join(REPO, "benchmarks", "results")


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            path = os.path.join(dirpath, n)
            data = open(path, "rb").read()
            rel = os.path.relpath(path, root)
            if rel.endswith(".gz"):
                rel, data = rel[: -len(".gz")], gzip.decompress(data)
            out[rel] = data
    return out


def test_packed_archive_aggregates_as_its_tree(tmp_path):
    root, tree, pk = str(tmp_path / "runs"), str(tmp_path / "tree"), str(tmp_path / "cmp.tar.xz")
    _sweep(root)
    archive.archive(root, tree)
    # 5 runs x (config, metrics), the 3 ARISE seeds' pool events, COMMITS
    assert packed.pack(tree, pk) == 14
    # The pack holds the tree file for file (metrics stored decompressed) and nothing else.
    assert _files(packed.unpack(pk, str(tmp_path / "un"))) == _files(tree)
    with tarfile.open(pk, "r:xz") as tar:
        names = tar.getnames()
        assert names == sorted(names) and "arise/seed0/metrics.jsonl" in names
        assert {(m.mtime, m.uid, m.gid, m.mode) for m in tar} == {(0, 0, 0, 0o644)}
    for src, out in ((tree, "a"), (pk, "b")):
        aggregate.main([src, "--reference", "arise", "--out", str(tmp_path / out)])
    a, b = _files(str(tmp_path / "a")), _files(str(tmp_path / "b"))
    assert a == b and {"results.md", "results.csv", "paired.csv", "pool.csv"} <= set(a)
    assert b"| outcome |" in a["results.md"]
    # Packing the same tree again gives the same bytes.
    before = open(pk, "rb").read()
    packed.pack(tree, pk)
    assert open(pk, "rb").read() == before


def test_archive_adds_runs_to_a_packed_archive(tmp_path):
    root, pk = str(tmp_path / "runs"), str(tmp_path / "cmp.tar.xz")
    _sweep(root)
    first = archive.archive_to(root, pk)
    assert len(first["archived"]) == 5 and first["unfinished"] == ["outcome/seed7"]
    before = open(pk, "rb").read()
    # Already archived runs are kept; the pack is rewritten with the same bytes.
    assert archive.archive_to(root, pk)["kept"] == first["archived"]
    assert open(pk, "rb").read() == before
    # A run that finishes later joins the pack; the others stay as they were.
    open(os.path.join(root, "outcome", "seed7", "SWEEP_DONE.json"), "w").close()
    assert archive.archive_to(root, pk)["archived"] == ["outcome/seed7"]
    with packed.opened(pk) as tree:
        assert sorted(os.listdir(os.path.join(tree, "outcome"))) == ["seed0", "seed1", "seed7"]
        assert open(os.path.join(tree, "COMMITS")).read() == "abc123\n"
        # The directory form, archived from the same runs, is the same tree.
        archive.archive(root, str(tmp_path / "d"))
        assert _files(tree) == _files(str(tmp_path / "d"))


def test_unpack_refuses_members_outside_the_tree(tmp_path):
    bad = str(tmp_path / "bad.tar.xz")
    with tarfile.open(bad, "w:xz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match=r"'\.\./escape\.txt' is not a plain relative file"):
        packed.unpack(bad, str(tmp_path / "out"))
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(ValueError, match="ends with .tar.xz"):
        packed.pack(str(tmp_path), str(tmp_path / "x.tgz"))


def test_packed_root_needs_out(tmp_path, capsys):
    with pytest.raises(SystemExit):
        aggregate.main([str(tmp_path / "cmp.tar.xz")])
    assert "--out is required" in capsys.readouterr().err


# Each packed comparison, the aggregate options its results page names, and the tables of the
# page that a later aggregate writes differently: the per-step cost table gained the stage
# columns (rollout_s, train_s, teacher_s) after these two pages were written.
COMPARISONS = [
    ("protocol_ar", "arise_rl.md",
     ["--reference", "arise_rl-protocol", "--dynamics",
      "--cost-reference", "arise_rl-protocol+solver_grpo"], ()),
    ("protocol_async", "async.md",
     ["--reference", "grpo-protocol", "--cost-reference", "grpo-protocol"], ("Per-step cost",)),
    ("protocol_h", "harness_rl.md",
     ["--reference", "harness_rl-protocol", "--dynamics", "--cost-reference", "grpo-protocol"],
     ("Per-step cost",)),
    ("protocol_r", "rised.md",
     ["--reference", "rised-protocol", "--dynamics",
      "--cost-reference", "rised-protocol+grpo_k"], ()),
    ("protocol_ws", "arise.md",
     ["--reference", "arise-protocol", "--match", "arise-protocol+outcome_only"], ()),
]  # fmt: skip


def _tables(markdown):
    """{section heading: its table lines} of an aggregate's results.md."""
    out, head = {}, None
    for line in markdown.splitlines():
        if line.startswith("#"):
            head = line.lstrip("# ")
        elif line.startswith("|"):
            out.setdefault(head, []).append(line)
    return out


@pytest.mark.parametrize("name,page,args,newer", COMPARISONS, ids=[c[0] for c in COMPARISONS])
def test_packed_comparisons_give_their_results_pages(tmp_path, name, page, args, newer):
    pk = os.path.join(RESULTS, "runs", name + packed.SUFFIX)
    aggregate.main([pk, "--out", str(tmp_path), *args])
    text = open(os.path.join(RESULTS, page), encoding="utf-8").read()
    tables = _tables((tmp_path / "results.md").read_text(encoding="utf-8"))
    checked = 0
    for head, lines in tables.items():
        if any(head.startswith(n) for n in newer):
            continue
        missing = [ln for ln in lines if ln not in text]
        assert not missing, f"{name}: table {head!r} differs from {page}: {missing[:2]}"
        checked += len(lines)
    assert checked >= 20, f"{name}: only {checked} table lines compared"
