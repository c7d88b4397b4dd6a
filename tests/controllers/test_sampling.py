"""UniformSampler: epoch coverage, determinism from the seed, exact resume via state_dict."""

import numpy as np
import pytest

from rubric_rl.controllers.base import Controller, ControllerSet, TaskBatch
from rubric_rl.controllers.sampling import SAMPLERS, UniformSampler
from rubric_rl.rubrics.types import Criterion, Rubric, Task


def _tasks(n):
    rubric = Rubric((Criterion("c", "is short"),))
    return [
        Task(id=f"t{i}", prompt=({"role": "user", "content": f"q{i}"},), rubric=rubric)
        for i in range(n)
    ]


def _ids(batch):
    return [t.id for t in batch.tasks]


def test_each_epoch_is_a_permutation_and_weights_are_one():
    tasks = _tasks(10)
    s = UniformSampler(tasks, 4, seed=3)
    drawn = [_ids(s.sample_tasks(i, None)) for i in range(5)]  # 20 draws = 2 epochs
    flat = sum(drawn, [])
    assert sorted(flat[:10]) == sorted(t.id for t in tasks)
    assert sorted(flat[10:]) == sorted(t.id for t in tasks)
    assert flat[:10] != flat[10:]  # a fresh shuffle per epoch
    b = UniformSampler(tasks, 4, seed=3).sample_tasks(0, None)
    np.testing.assert_array_equal(b.weights, np.ones(4))


def test_same_seed_same_order_other_seed_differs():
    a = [_ids(UniformSampler(_tasks(50), 7, seed=1).sample_tasks(0, None))]
    b = [_ids(UniformSampler(_tasks(50), 7, seed=1).sample_tasks(0, None))]
    c = [_ids(UniformSampler(_tasks(50), 7, seed=2).sample_tasks(0, None))]
    assert a == b and a != c


def test_resume_from_state_dict_continues_exactly():
    tasks = _tasks(13)
    ref = UniformSampler(tasks, 5, seed=0)
    full = [_ids(ref.sample_tasks(i, None)) for i in range(8)]
    part = UniformSampler(tasks, 5, seed=0)
    for i in range(3):
        part.sample_tasks(i, None)
    state = part.state_dict()
    resumed = UniformSampler(tasks, 5, seed=0)
    resumed.load_state_dict(state)
    assert [_ids(resumed.sample_tasks(i, None)) for i in range(3, 8)] == full[3:]


def test_state_from_another_dataset_is_rejected():
    s = UniformSampler(_tasks(5), 2, seed=0)
    with pytest.raises(ValueError, match="5 tasks"):
        UniformSampler(_tasks(6), 2, seed=0).load_state_dict(s.state_dict())


def test_registry_and_controller_set():
    assert SAMPLERS.get("uniform") is UniformSampler

    class Tagger(Controller):
        name = "tagger"

        def decorate(self, tasks, prompts):
            return [p + [{"role": "system", "content": "hint"}] for p in prompts]

        def observe(self, evidence):
            return {"seen": 1.0}

    s = UniformSampler(_tasks(4), 2, seed=0)
    cs = ControllerSet(s, [Tagger()])
    b = cs.sample_tasks(0, None)
    out = cs.decorate(b.tasks, [t.messages for t in b.tasks])
    assert out[0][-1] == {"role": "system", "content": "hint"} and len(out[0]) == 2
    assert cs.observe(None) == {"tagger/seen": 1.0}
    assert set(cs.state_dict()) == {"sampler", "tagger"}
    with pytest.raises(KeyError, match="tagger"):
        cs.load_state_dict({"sampler": s.state_dict()})
    with pytest.raises(ValueError, match="weights"):
        TaskBatch(b.tasks, np.ones(3))
