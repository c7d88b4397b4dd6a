"""configs/arise.py: variants set the documented keys; ``arise_controller_kwargs`` builds the
controller; ``frozen_rubrics=<run dir>`` installs that run's final pool (read from its last
checkpoint) and keeps it fixed."""

import json

import numpy as np
import pytest

from configs import arise
from rubric_rl import analysis as an
from rubric_rl import builders
from rubric_rl.controllers.arise import make_arise_controller
from rubric_rl.controllers.base import Evidence
from rubric_rl.envs.constraint_corpus import warmstart_example
from rubric_rl.rubrics.judges import JudgeItem, ProgrammaticJudge


@pytest.mark.parametrize(
    "variant, evolve, inject, sampler, pool_cap",
    [
        ("", True, True, "capability", 8),
        ("no_skills", True, False, "capability", 8),
        ("sampler=uniform", True, True, "uniform", 8),
        ("sampler=variance", True, True, "reward_variance", 8),
        ("outcome_only", False, False, "uniform", 0),
        ("smoke", True, True, "capability", 4),
    ],
)
def test_variants(variant, evolve, inject, sampler, pool_cap):
    c = arise.get_config(variant)
    a = c.arise
    assert (a.evolve, a.inject_skills, a.sampler, a.pool_cap) == (evolve, inject, sampler, pool_cap)
    assert c.controllers.sampler == "arise" and c.method == "arise"
    assert set(arise.arise_defaults()) <= set(a.keys())  # every AriseConfig field is a key


def test_bad_variants_and_fields_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown variant"):
        arise.get_config("no_skill")
    with pytest.raises(ValueError, match="sampler='bandit'"):
        arise.get_config("sampler=bandit")
    with pytest.raises(ValueError, match="config.arise.frozen_pool_from: run directory"):
        arise.arise_controller_kwargs(arise.get_config(f"frozen_rubrics={tmp_path}/none"))
    c = arise.get_config("smoke")
    with pytest.raises(AttributeError):
        c.arise.pool_capp = 3  # locked: a typo is an error
    c.arise.hide_above = 0.1  # below activate_below
    with pytest.raises(ValueError, match="config.arise: AriseConfig thresholds"):
        arise.arise_controller_kwargs(c)


def _simulate(ctl, tasks_per_step, j, steps):
    judge = ProgrammaticJudge()
    for step in range(1, steps + 1):
        rng = np.random.default_rng(step)
        batch = ctl.sample_tasks(step, rng)
        responses = [
            [warmstart_example(ctl.base_task(t), rng, guided=False)[1] for _ in range(j)]
            for t in batch.tasks
        ]
        flat = judge.score([JudgeItem(t, r) for t, rs in zip(batch.tasks, responses) for r in rs])
        groups = tuple(
            tuple(tuple(v) for v in flat[g * j : (g + 1) * j]) for g in range(len(batch.tasks))
        )
        zeros = np.zeros((tasks_per_step, j))
        ctl.observe(
            Evidence(
                step, batch.tasks, (), tuple(map(tuple, responses)), groups, None, zeros, zeros
            )
        )


def test_smoke_pool_evolves_and_frozen_rubrics_reloads_it(tmp_path):
    c = arise.get_config("smoke")
    domain = builders.build_domain(c)
    b, j = int(c.rollout.tasks_per_step), int(c.rollout.samples_per_task)
    ctl = make_arise_controller(domain.train, b, seed=0, **arise.arise_controller_kwargs(c))
    _simulate(ctl, b, j, 3)
    events = ctl.pop_events()
    assert [e["event"] for e in events].count("add") >= 2  # the smoke thresholds move the pool
    # A run directory whose last checkpoint holds that controller's state.
    run = tmp_path / "src"
    (run / "checkpoints" / "3" / "run_state").mkdir(parents=True)
    state = {"step": 3, "controllers": {"arise": ctl.state_dict()}}
    (run / "checkpoints" / "3" / "run_state" / "metadata").write_text(json.dumps(state))
    fc = arise.get_config(f"smoke,frozen_rubrics={run}")
    assert fc.arise.frozen_pool_from == str(run) and fc.arise.evolve is False
    frozen = make_arise_controller(domain.train, b, seed=0, **arise.arise_controller_kwargs(fc))
    frozen.load_pool(an.final_pool_state(fc.arise.frozen_pool_from))
    before = {e.id: (e.state, e.skill) for e in frozen.pool.entries.values()}
    assert before == {e.id: (e.state, e.skill) for e in ctl.pool.entries.values()} and before
    _simulate(frozen, b, j, 2)
    assert {e.id: (e.state, e.skill) for e in frozen.pool.entries.values()} == before
    assert frozen.pop_events() == []
