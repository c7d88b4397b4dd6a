"""RISED's deliberately hard environment: ``domain.hard_min_constraints`` moves every
embedded task with at least that many stated constraints to env "hard", nothing else changes."""

import dataclasses

import pytest

from rubric_rl.config import builders
from rubric_rl.config.defaults import get_base_config
from rubric_rl.envs.constraints import hard_constraints, task_bank, with_hard_env


def test_tasks_with_many_constraints_move_to_the_hard_env_unchanged_otherwise():
    tasks = task_bank("train", 200)
    moved = with_hard_env(tasks, 5)
    assert len(moved) == len(tasks)
    n_hard = 0
    for a, b in zip(tasks, moved, strict=True):
        hard = len(hard_constraints(a)) >= 5
        n_hard += hard
        assert b.env_name == ("hard" if hard else a.env_name)
        assert dataclasses.replace(b, env_name=a.env_name) == a  # only the env changed
    assert 0 < n_hard < len(tasks)
    with pytest.raises(ValueError, match="min_constraints"):
        with_hard_env(tasks, 0)


def test_the_domain_builder_applies_it_to_every_split_and_is_off_by_default():
    c = get_base_config()
    c.domain.update(n_train=64, n_heldout=32, n_ood=16, n_validation=16)
    off = builders.build_domain(c)
    assert not any(t.env_name == "hard" for t in off.train + off.heldout + off.validation)
    c.domain.hard_min_constraints = 5
    on = builders.build_domain(c)
    for split in ("train", "heldout", "validation", "ood"):
        a, b = getattr(off, split), getattr(on, split)
        assert [t.id for t in a] == [t.id for t in b]
        assert [t.env_name for t in b] == [t.env_name for t in with_hard_env(a, 5)]
    assert any(t.env_name == "hard" for t in on.train)
