"""The harness memory: time index by task, semantic index with top-k and the floor applied to
exact cosines, criterion versions (rewrite, delete), persistence, and rollback to a step."""

import numpy as np
import pytest

from rubric_rl.memory.embedder import make_embedder
from rubric_rl.memory.store import CriterionEntry, HarnessMemory

pytest.importorskip("chromadb")


@pytest.fixture(scope="module")
def embedder():
    return make_embedder("minilm")


@pytest.fixture
def memory(tmp_path, embedder):
    return HarnessMemory(str(tmp_path / "memory"), embedder)


COUNTS = [f"the response lists exactly {n} items" for n in (2, 3, 4, 5, 6, 7)]


def test_time_index_returns_a_tasks_records_oldest_first(memory):
    s = [[1, 0, None], [0, 0, 1]]  # None: the judge failed on that rollout, not a 0
    memory.record(1, "t1", "group", {"S": s, "rollouts": ["a", "b", "c"]})
    memory.record(1, "t2", "group", {"S": [[1]]})
    memory.record(2, "t1", "labels", {"count": {"label": "blind", "confidence": 0.5}})
    memory.record_many(3, [("t1", "update", {"status": "rejected", "delta": 1.5}),
                           ("t1", "update", {"status": "proposed"})])  # fmt: skip
    h = memory.history("t1")
    assert [(r.step, r.kind) for r in h] == [
        (1, "group"),
        (2, "labels"),
        (3, "update"),
        (3, "update"),
    ]
    assert h[0].data["S"] == s and h[2].data["delta"] == 1.5
    assert [r.data["status"] for r in memory.history("t1", kinds=["update"])] == [
        "rejected", "proposed"
    ]  # fmt: skip
    assert [r.step for r in memory.history("t1", since=2, until=2)] == [2]
    assert memory.history("t3") == []
    with pytest.raises(ValueError, match="kind 'score'"):
        memory.record(1, "t1", "score", {})
    with pytest.raises(ValueError, match=r"\('t1', 'group', step 4\): data is not JSON"):
        memory.record(4, "t1", "group", {"r": float("nan")})
    with pytest.raises(ValueError, match="kinds"):
        memory.history("t1", kinds=["nope"])


def _index(memory, step, rows):
    memory.index_criteria(step, [CriterionEntry(t, c, text) for t, c, text in rows])


def test_related_returns_the_top_k_above_the_floor_most_similar_first(memory):
    _index(memory, 1, [(f"t{i}", "count", text) for i, text in enumerate(COUNTS)])
    _index(memory, 1, [("t9", "category", "every word is one of the animals")])
    (hits,) = memory.related(["the response lists exactly 8 items"])
    assert len(hits) == memory.top_k == 4
    assert all(h.criterion_id == "count" for h in hits)
    cos = [h.cosine for h in hits]
    assert cos == sorted(cos, reverse=True)
    # The exact cosines, recomputed from the embeddings.
    q = memory.embed(["the response lists exactly 8 items"])[0].astype(np.float64)
    for h in hits:
        assert h.cosine == pytest.approx(float(memory.embed([h.text])[0] @ q), abs=1e-6)
    (wide,) = memory.related(["the response lists exactly 8 items"], k=10)
    assert len(wide) == 6  # the category criterion is below the floor
    assert memory.related(["every word is one of the plants"])[0][0].task_id == "t9"


def test_retrieval_at_the_floor(memory):
    """A criterion whose cosine equals η is retrieved; one just below it is not."""
    _index(memory, 1, [("t1", "count", COUNTS[0]), ("t2", "count", COUNTS[1])])
    query = "the response lists exactly 9 items"
    memory.floor = -1.0
    (hits,) = memory.related([query])
    low = min(h.cosine for h in hits)
    memory.floor = low
    assert len(memory.related([query])[0]) == 2
    memory.floor = float(np.nextafter(low, 2.0))
    (hits,) = memory.related([query])
    assert len(hits) == 1 and hits[0].cosine > low


def test_exclude_task_rewrites_and_deletes(memory):
    _index(memory, 1, [("t1", "count", COUNTS[0]), ("t2", "count", COUNTS[1])])
    q = "the response lists exactly 9 items"
    assert {h.task_id for h in memory.related([q], exclude_task="t1")[0]} == {"t2"}
    assert [h.task_id for h in memory.related([q, q], exclude_task=["t2", None])[0]] == ["t1"]
    # A rewrite supersedes the old text: the old version is never returned again.
    _index(memory, 2, [("t2", "count", "every word is one of the vehicles")])
    assert {h.task_id for h in memory.related([q])[0]} == {"t1"}
    assert memory.related(["every word is one of the animals"])[0][0].step == 2
    # A delete is a tombstone version.
    memory.index_criteria(3, [CriterionEntry("t1", "count", COUNTS[0], deleted=True)])
    assert memory.related([q])[0] == []
    assert memory.counts() == {"time_records": 0, "criterion_versions": 4, "criteria_live": 1}
    # Re-indexing an unchanged criterion adds nothing; a new weight is a new version.
    _index(memory, 4, [("t2", "count", "every word is one of the vehicles")])
    assert memory.counts()["criterion_versions"] == 4
    memory.index_criteria(4, [CriterionEntry("t2", "count", "every word is one of the vehicles",
                                             weight=-2.0)])  # fmt: skip
    (hit,) = memory.related(["every word is one of the animals"])[0]
    assert hit.weight == -2.0 and hit.step == 4
    with pytest.raises(ValueError, match="'c' of task 't5' has empty text"):
        memory.index_criteria(5, [CriterionEntry("t5", "c", "")])


def test_rollback_restores_the_memory_of_a_step_and_persists(tmp_path, embedder):
    path = str(tmp_path / "memory")
    m = HarnessMemory(path, embedder)
    q = "the response lists exactly 9 items"
    for step in (1, 2, 3):
        m.record(step, "t1", "group", {"step": step})
    _index(m, 1, [("t1", "count", COUNTS[0])])
    _index(m, 3, [("t1", "count", "every word is one of the vehicles"), ("t2", "count", COUNTS[1])])
    assert [h.task_id for h in m.related([q])[0]] == ["t2"]
    before = m.counts()
    assert m.rollback(2) == {"time": 1, "semantic": 2}
    after = m.counts()
    assert after == {"time_records": 2, "criterion_versions": 1, "criteria_live": 1}
    assert before != after
    # The step-1 version is current again.
    assert [(h.task_id, h.text) for h in m.related([q])[0]] == [("t1", COUNTS[0])]
    # Reopened from disk: the same records, and new ids never collide with the old ones.
    del m
    m2 = HarnessMemory(path, embedder)
    assert m2.counts() == after
    assert [r.data["step"] for r in m2.history("t1")] == [1, 2]
    m2.record(2, "t1", "outcome", {"x": 1})
    assert [r.kind for r in m2.history("t1")] == ["group", "group", "outcome"]
    assert [(h.task_id, h.text) for h in m2.related([q])[0]] == [("t1", COUNTS[0])]
    assert m2.rollback(0) == {"time": 3, "semantic": 1}
    assert m2.counts() == {"time_records": 0, "criterion_versions": 0, "criteria_live": 0}


def test_a_memory_keeps_its_embedder(tmp_path, embedder):
    path = str(tmp_path / "memory")
    HarnessMemory(path, embedder)

    class Other:
        name, dim = "other", 384

        def embed(self, texts):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="built with embedder 'all-MiniLM-L6-v2'"):
        HarnessMemory(path, Other(), floor=0.5)
    with pytest.raises(ValueError, match="memory.top_k=0"):
        HarnessMemory(str(tmp_path / "m2"), embedder, top_k=0)


def test_related_equals_an_exhaustive_numpy_search(tmp_path, embedder):
    """Many criteria sharing texts (exact ties), rewrites, deletes and per-text exclusions: the
    retrieved lists equal a plain float64 search over every current version, also after the
    memory is reopened from disk, and ``histories`` equals one ``history`` per task."""
    rng = np.random.default_rng(0)
    texts = COUNTS + [f"every word is one of the {w}" for w in ("animals", "plants", "tools")]
    m = HarnessMemory(str(tmp_path / "memory"), embedder, floor=0.5)
    current: dict[tuple[str, str], tuple[str, bool]] = {}
    for step in range(1, 6):
        entries = []
        for t in rng.choice(40, size=25, replace=False):
            for c in ("a", "b", "c"):
                text = texts[int(rng.integers(len(texts)))]
                deleted = bool(rng.random() < 0.15)
                entries.append(CriterionEntry(f"t{t}", c, text, weight=1.0, deleted=deleted))
                current[(f"t{t}", c)] = (text, deleted)
        m.index_criteria(step, entries)
        m.record_many(step, [(f"t{t}", "group", {"step": step}) for t in range(0, 40, 7)])
    m.flush()  # the reopened copy below reads Chroma
    queries = texts + ["the response lists exactly 12 items"]
    excl = [None if i % 3 == 0 else f"t{i}" for i in range(len(queries))]

    def reference(k):
        out = []
        for q, ex in zip(queries, excl, strict=True):
            qv = m.embed([q])[0].astype(np.float64)
            hits = []
            for (t, c), (text, deleted) in current.items():
                cos = float(m.embed([text])[0].astype(np.float64) @ qv)
                if not deleted and t != ex and cos >= m.floor:
                    hits.append((-cos, t, c))
            out.append([(t, c) for _, t, c in sorted(hits)[:k]])
        return out

    for mem in (m, HarnessMemory(str(tmp_path / "memory"), embedder, floor=0.5)):
        for k in (4, 30):
            got = mem.related(queries, exclude_task=excl, k=k)
            assert [[(h.task_id, h.criterion_id) for h in row] for row in got] == reference(k)
        assert any(len(row) == 30 for row in got)  # the ties were really exercised
        tasks = ["t0", "t7", "t3", "t99"]
        assert mem.histories(tasks) == {t: mem.history(t) for t in tasks}
        assert [r.step for r in mem.histories(tasks, since=2, until=3)["t7"]] == [2, 3]


def test_background_writes_are_flushed_before_every_read_and_failures_surface(tmp_path, embedder):
    """The writer thread's Chroma adds land before any read (the same records as writing in
    the caller), and a failed write is raised at the next read, not lost."""
    mems = [HarnessMemory(str(tmp_path / f"m{b}"), embedder, background_writes=b) for b in (0, 1)]
    for m in mems:
        for step in range(1, 4):
            m.record_many(step, [(f"t{i}", "group", {"i": i, "s": step}) for i in range(20)])
            _index(m, step, [(f"t{i}", "count", COUNTS[(i + step) % 6]) for i in range(20)])
    sync, bg = mems
    assert bg.counts() == sync.counts() == {
        "time_records": 60, "criterion_versions": 60, "criteria_live": 20
    }  # fmt: skip
    assert bg.histories([f"t{i}" for i in range(20)]) == sync.histories(
        [f"t{i}" for i in range(20)]
    )

    def fail(**_):
        raise OSError("disk full")

    bg._write(fail)
    with pytest.raises(RuntimeError, match="a harness memory write failed") as e:
        bg.history("t1")
    assert isinstance(e.value.__cause__, OSError)
    bg.close()
