"""Rollback on resume: a controller's harness memory, restored with the checkpoint's step,
equals the memory of the uninterrupted run after the replayed step."""

import os

import pytest

from configs import grpo
from rubric_rl.controllers.base import Controller
from rubric_rl.memory.embedder import make_embedder
from rubric_rl.memory.store import CriterionEntry, HarnessMemory

pytest.importorskip("chromadb")


class MemoryRecorder(Controller):
    """Writes each step's groups (responses, rewards) and one criterion version per task."""

    name = "memrec"

    def __init__(self, embedder):
        self.embedder = embedder
        self.memory = None

    def bind(self, services, run_dir):
        super().bind(services, run_dir)
        self.memory = HarnessMemory(os.path.join(run_dir, "memory"), self.embedder)

    def observe(self, rollouts):
        rows = [
            (g.task.id, "group", {"responses": [t.response for t in g.trajectories],
                                  "rewards": [float(t.reward) for t in g.trajectories]})
            for g in rollouts.groups
        ]  # fmt: skip
        self.memory.record_many(rollouts.step, rows)
        self.memory.index_criteria(
            rollouts.step,
            [CriterionEntry(g.task.id, "c", f"the response has {rollouts.step} words")
             for g in rollouts.groups],
        )  # fmt: skip
        return {}

    def rollback(self, step):
        self.memory.rollback(step)


def _snapshot(memory):
    got = memory._time.get(include=["documents", "metadatas"])
    time = sorted((m["step"], m["task_id"], d) for m, d in zip(got["metadatas"], got["documents"]))
    got = memory._sem.get(include=["documents", "metadatas"])
    sem = sorted((m["step"], m["task_id"], d) for m, d in zip(got["metadatas"], got["documents"]))
    return time, sem


def test_resumed_memory_equals_the_uninterrupted_one(tmp_path):
    from rubric_rl.trainer import Trainer

    emb = make_embedder("minilm")
    c = grpo.get_config("smoke")
    c.eval.at_start, c.eval.every = False, 0
    t = Trainer(c, str(tmp_path), extra_controllers=[rec := MemoryRecorder(emb)])
    try:
        t._restore_or_warmstart(resume=False)
        t.train_one_step()
        t.train_one_step()
        t.save(wait=True)
        at_two = _snapshot(rec.memory)
        t.train_one_step()
        full = _snapshot(rec.memory)
    finally:
        t.close()
    assert {s for s, _, _ in full[0]} == {1, 2, 3}
    resumed = Trainer(c, str(tmp_path), extra_controllers=[rec2 := MemoryRecorder(emb)])
    try:
        resumed._restore_or_warmstart(resume=True)
        assert resumed.step == 2
        assert _snapshot(rec2.memory) == at_two  # step 3's records and versions are gone
        resumed.train_one_step()
        assert _snapshot(rec2.memory) == full  # the replayed step writes the same memory
    finally:
        resumed.close()
