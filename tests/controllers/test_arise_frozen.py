"""ARISE's frozen-rubrics arm on the scripted policy (rubric_rl/checks/controller_check.py: the real
ARISE controller, pipeline and judge): the rubric set of another seed's run is fixed from step 1,
while its skills start as the domain's base texts in the "added" state and keep their lifecycle;
the earlier arm (``frozen_pool_and_skills``) shows the source run's skills, refined texts
included, from step 1."""

from __future__ import annotations

import json

import pytest

from configs import arise
from rubric_rl.checks.controller_check import ScriptedPolicy, scripted_run
from rubric_rl.config import builders
from rubric_rl.envs.constraint_lexicon import SKILL_TEXTS
from rubric_rl.methods.arise.arise import ACTIVE, ADDED, AriseController

REFINED = "remember the rule ; check every item before the answer"


def _config(seed: int, mode: str | None = None):
    c = arise.get_config()
    c.unlock()
    c.rollout.tasks_per_step = 16
    c.domain.n_train = 512
    c.train.seed = seed
    if mode is not None:
        c.arise.update(**arise.frozen_arm_settings(mode))
    c.lock()
    return c


def _ctl(run) -> AriseController:
    return next(x for x in run.controllers.controllers if isinstance(x, AriseController))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Seed 1's pool after 30 scripted steps, one of its active pairs given a refined skill."""
    run = scripted_run(_config(1), ScriptedPolicy(seed=1), str(tmp_path_factory.mktemp("src")))
    for step in range(1, 31):
        run.step(step)
    state = _ctl(run).pool.state_dict()
    active = [e for e in state["entries"] if e["state"] == ACTIVE]
    assert active and len(state["entries"]) >= 8
    active[0].update(skill=REFINED, skill_version=2, refinements=1)
    return state


def _frozen(state, mode, workdir):
    c = _config(0, mode)
    controllers = builders.build_controllers(c, builders.build_domain(c))
    ctl = next(x for x in controllers.controllers if isinstance(x, AriseController))
    ctl.load_pool(state, c.arise.frozen_pool_entries, mode=mode)
    return ctl, scripted_run(c, ScriptedPolicy(seed=0), workdir, controllers)


def test_the_frozen_arms_first_step_skills_are_the_base_texts(source, tmp_path):
    ctl, run = _frozen(source, "rubrics", str(tmp_path))
    entries = list(ctl.pool.entries.values())
    assert len(entries) == len(source["entries"])
    assert all(e.state == ADDED and e.skill_version == 1 and not e.obs for e in entries)
    assert all(e.skill == SKILL_TEXTS.get(e.capability, "{criterion}") for e in entries)
    r, _ = run.step(1)
    prompts = [g.messages[-1]["content"] for g in r.groups]
    assert not any(REFINED in p for p in prompts)
    assert not any(text in p for p in prompts for text in SKILL_TEXTS.values())
    ids = set(ctl.pool.entries)
    shown: set[str] = set()
    for step in range(2, 13):
        r, _ = run.step(step)
        shown |= {s for g in r.groups for s in ctl.pool.skills_for(g.task)}
    # The skills move through their lifecycle (some activate), the rubric set does not.
    events = ctl.pop_events()
    assert {e["event"] for e in events} <= {"activate", "hide", "refine"}
    assert any(e["event"] == "activate" for e in events)
    assert set(ctl.pool.entries) == ids and len(ctl.pool.live()) == len(ids)
    refined = {e["evidence"]["new_skill"] for e in events if e["event"] == "refine"}
    assert shown and REFINED not in shown
    assert all(any(b in s for b in SKILL_TEXTS.values()) or s in refined for s in shown)


def test_the_earlier_arm_shows_the_source_runs_skills_from_step_one(source, tmp_path):
    ctl, run = _frozen(source, "frozen_pool_and_skills", str(tmp_path))
    r, _ = run.step(1)
    assert any(REFINED in g.messages[-1]["content"] for g in r.groups)
    before = json.dumps(ctl.pool.state_dict(), sort_keys=True)
    for step in range(2, 5):
        run.step(step)
    assert json.dumps(ctl.pool.state_dict(), sort_keys=True) == before


def test_config_frozen_modes_and_the_other_seed_check(source, tmp_path):
    src = tmp_path / "src"
    (src / "checkpoints" / "3" / "run_state").mkdir(parents=True)
    meta = {"step": 3, "controllers": {"arise": {"pool": source}}}
    (src / "checkpoints" / "3" / "run_state" / "metadata").write_text(json.dumps(meta))
    (src / "config.json").write_text(json.dumps({"train": {"seed": 1}}))
    c = arise.get_config(f"frozen_rubrics={src}")
    a = c.arise
    assert (a.frozen_mode, a.evolve, a.fixed_rubrics) == ("rubrics", True, True)
    ctl = builders.build_controllers(c, builders.build_domain(c)).controllers[0]
    assert isinstance(ctl, AriseController)
    assert {e.state for e in ctl.pool.entries.values()} == {ADDED}
    old = arise.get_config(f"frozen_rubrics={src},frozen_pool_and_skills").arise
    assert (old.frozen_mode, old.evolve, old.fixed_rubrics) == ("frozen_pool_and_skills", False,
                                                                False)  # fmt: skip
    (src / "config.json").write_text(json.dumps({"train": {"seed": 0}}))
    with pytest.raises(ValueError, match="another seed's run"):
        arise.arise_controller_kwargs(arise.get_config(f"frozen_rubrics={src}"))
    with pytest.raises(ValueError, match="needs frozen_rubrics=DIR"):
        arise.get_config("frozen_pool_and_skills")
