"""launch/archive.py: finished runs kept as config + gzipped metrics that aggregate.py reads
exactly as it reads the run directories; unfinished runs skipped; re-archiving is byte-stable."""

import os

from launch import aggregate, archive
from rubric_rl import analysis as an
from tests.launch.test_aggregate import RUNS, write_run


def _sweep(root):
    for group, seeds in RUNS.items():
        for seed, (heldout, ood, fail_base, pool) in seeds.items():
            d = os.path.join(root, group, f"seed{seed}")
            write_run(d, heldout, ood, fail_base, pool)
            open(os.path.join(d, an.FINISHED_MARKER), "w").close()
    # An unfinished run: no marker, no final checkpoint.
    write_run(os.path.join(root, "outcome", "seed7"), *RUNS["outcome"][0][:3], None)
    with open(os.path.join(root, "COMMIT"), "w") as f:
        f.write("abc123\n")


def test_archive_keeps_what_aggregate_reads(tmp_path):
    root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
    _sweep(root)
    done = archive.archive(root, dest)
    assert done["unfinished"] == ["outcome/seed7"] and not done["kept"]
    assert len(done["archived"]) == 5
    assert not os.path.exists(os.path.join(dest, "outcome", "seed7"))
    assert sorted(os.listdir(os.path.join(dest, "arise", "seed0"))) == [
        "config.json", "controllers", "metrics.jsonl.gz"
    ]  # fmt: skip
    src = aggregate.load_groups(root, ["arise", "outcome"])
    src["outcome"] = [r for r in src["outcome"] if not r.path.endswith("seed7")]
    got = aggregate.load_groups(dest)
    assert {g: [(r.config, r.metrics) for r in rs] for g, rs in got.items()} == {
        g: [(r.config, r.metrics) for r in rs] for g, rs in src.items()
    }
    assert an.read_events(os.path.join(dest, "arise", "seed0")) == an.read_events(
        os.path.join(root, "arise", "seed0")
    )
    # The same tables from the archive as from the runs.
    for src_root, out in ((root, "a"), (dest, "b")):
        aggregate.main([src_root, "--groups", "arise", "--out", str(tmp_path / out)])
    for name in ("results.csv", "rise.csv", "pool.csv"):
        a, b = ((tmp_path / d / name).read_text() for d in ("a", "b"))
        assert a == b and len(a.splitlines()) > 1
    # Kept unless --force; re-archiving writes the same bytes; COMMITS lists the sweep's commit.
    gz = os.path.join(dest, "arise", "seed1", "metrics.jsonl.gz")
    before = open(gz, "rb").read()
    assert archive.archive(root, dest)["kept"] == done["archived"]
    os.remove(gz)
    archive.archive(root, dest)
    assert open(gz, "rb").read() == before
    assert archive.archive(root, dest, force=True)["archived"] == done["archived"]
    assert open(os.path.join(dest, "COMMITS")).read() == "abc123\n"


def test_a_run_whose_metrics_stop_short_of_its_final_checkpoint_is_not_archived(tmp_path):
    root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
    d = os.path.join(root, "arise", "seed0")
    write_run(d, *RUNS["arise"][0][:3], None)
    os.makedirs(os.path.join(d, "checkpoints", "150"))  # the final checkpoint: "finished"
    with open(os.path.join(d, "metrics.jsonl")) as f:
        rows = f.readlines()[:101]  # steps 0..100 of 150
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.writelines(rows)
    assert an.is_finished(d)
    done = archive.archive(root, dest)
    assert done == {"archived": [], "kept": [], "unfinished": [
        "arise/seed0 (metrics end at step 100 of 150)"
    ]}  # fmt: skip
    assert not os.path.exists(os.path.join(dest, "arise"))
