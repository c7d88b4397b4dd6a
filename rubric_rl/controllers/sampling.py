"""Task samplers (DESIGN §6). All share the Controller interface: ``sample_tasks(step, rng)``.

``UniformSampler`` walks a shuffled epoch order with a data cursor. Epoch e's order is a
permutation drawn from ``default_rng([seed, e])``, so the order never depends on how the run was
interrupted: the state is just (epoch, position) and a resumed run draws exactly the same tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, TaskBatch
from rubric_rl.registry import Registry
from rubric_rl.rubrics.types import Task

SAMPLERS: Registry[type] = Registry("task sampler")


@SAMPLERS.register("uniform")
class UniformSampler(Controller):
    """Each task once per epoch, in a seeded shuffled order; importance weights u = 1."""

    name = "sampler"

    def __init__(self, tasks: Sequence[Task], batch_size: int, *, seed: int = 0):
        if not tasks:
            raise ValueError("UniformSampler: empty task list")
        if batch_size < 1:
            raise ValueError(f"UniformSampler: batch_size must be >= 1, got {batch_size}")
        self.tasks = tuple(tasks)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: np.ndarray | None = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = rng.permutation(len(self.tasks))
            self._order_epoch = epoch
        return self._order

    def next_indices(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch_size:
            order = self.epoch_order(self.epoch)
            take = min(self.batch_size - len(out), len(order) - self.position)
            out.extend(int(i) for i in order[self.position : self.position + take])
            self.position += take
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch:
        idx = self.next_indices()
        return TaskBatch(tuple(self.tasks[i] for i in idx), np.ones(len(idx)))

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_tasks": len(self.tasks),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["num_tasks"]) != len(self.tasks) or int(state["seed"]) != self.seed:
            raise ValueError(
                f"sampler state is for {state['num_tasks']} tasks / seed {state['seed']}, "
                f"this run has {len(self.tasks)} tasks / seed {self.seed}"
            )
        if not 0 <= int(state["position"]) < len(self.tasks):
            raise ValueError(f"sampler state position {state['position']} out of range")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
