"""The extension contracts, pinned: a controller hook's signature, a stage's signature, every
controller and every method pipeline of the package keeping them, and a stub controller that
implements every hook run through a real step on the scripted engine (so what each hook is
called with is checked, not only its name). A change here is a change to every method's code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import rubric_rl
from configs import grpo
from rubric_rl.checks.controller_check import scripted_run
from rubric_rl.config import builders
from rubric_rl.controllers.base import Controller, ControllerSet, TaskBatch
from rubric_rl.controllers.sampling import UniformSampler
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rollout.scripted import ScriptedEngine, prompt_words
from rubric_rl.rubrics.types import Task
from rubric_rl.step import DEFAULT_STAGES

# hook -> its parameters after ``self``, in call order (the ControllerSet passes them by position).
HOOKS = {
    "bind": ("services", "run_dir"),
    "sample_tasks": ("step", "rng"),
    "decorate": ("tasks", "prompts"),
    "sample_prompts": ("step", "tasks", "prompts", "n"),
    "reward_signals": ("rollouts",),
    "signal_weights": (),
    "shape_advantages": ("rollouts", "advantages"),
    "observe": ("rollouts",),
    "select": ("rollouts",),
    "teacher_context": ("task", "rollouts"),
    "sd_gate": ("rollouts",),
    "pop_events": (),
    "rollback": ("step",),
    "disk_records": (),
    "state_dict": (),
    "load_state_dict": ("state",),
}
STAGE_PARAMS = ("rollouts", "ctx")
METHOD_CONFIGS = ("grpo", "arise", "harness_rl", "rised", "arise_rl")


def _params(fn) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def _positional(fn) -> tuple[int, int]:
    """(required, total) positional parameters after ``self``."""
    ps = [
        p
        for name, p in inspect.signature(fn).parameters.items()
        if name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return sum(p.default is p.empty for p in ps), len(ps)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_the_controller_hooks_are_the_pinned_ones():
    public = {n for n, v in vars(Controller).items() if callable(v) and not n.startswith("_")}
    assert public == set(HOOKS), "a hook was added or removed: pin it in HOOKS"
    for name, params in HOOKS.items():
        assert _params(getattr(Controller, name)) == params, name


def test_every_controller_of_the_package_keeps_the_hook_signatures():
    skipped = []
    for mod in pkgutil.walk_packages(rubric_rl.__path__, "rubric_rl."):
        try:
            importlib.import_module(mod.name)
        except ImportError as e:  # an optional dependency (e.g. the SGLang client)
            skipped.append((mod.name, str(e)))
    subs = sorted(
        {c for c in _subclasses(Controller) if c.__module__.startswith("rubric_rl.")},
        key=lambda c: (c.__module__, c.__qualname__),
    )
    assert len(subs) >= 10, [c.__qualname__ for c in subs]  # the package's own, found
    wrong = []
    for cls in subs:
        for name, params in HOOKS.items():
            fn = vars(cls).get(name)
            if fn is None:
                continue
            required, total = _positional(fn)
            # Called with exactly len(params) positional arguments: no more required, no fewer
            # accepted (a keyword-only extra with a default is allowed).
            if not (required <= len(params) <= total):
                wrong.append(f"{cls.__module__}.{cls.__qualname__}.{name}{inspect.signature(fn)}")
    assert not wrong, wrong
    assert len(skipped) <= 3, skipped


@pytest.mark.parametrize("method", METHOD_CONFIGS)
def test_every_stage_of_every_method_takes_the_rollouts_and_the_context(method):
    config = importlib.import_module(f"configs.{method}").get_config("smoke")
    _, pipeline = builders.build_method(config, builders.build_domain(config))
    names = [name for name, _ in pipeline.stages]
    assert len(names) == len(set(names)) and names[0] == "sample", names
    for name, stage in pipeline.stages:
        required, total = _positional(stage)
        assert required <= len(STAGE_PARAMS) <= total, (method, name, inspect.signature(stage))
    for name, stage in DEFAULT_STAGES:
        assert _params(stage) == STAGE_PARAMS, name


class _Stub(Controller):
    """Implements every hook with its neutral value and records what it was called with."""

    name = "stub"

    def __init__(self):
        self.calls: dict[str, list[tuple]] = {}

    def _record(self, hook, *args):
        self.calls.setdefault(hook, []).append(args)

    def bind(self, services, run_dir):
        self._record("bind", services, run_dir)
        super().bind(services, run_dir)

    def sample_tasks(self, step, rng):
        self._record("sample_tasks", step, rng)
        return None

    def decorate(self, tasks, prompts):
        self._record("decorate", tasks, prompts)
        return [list(p) for p in prompts]

    def sample_prompts(self, step, tasks, prompts, n):
        self._record("sample_prompts", step, tasks, prompts, n)
        return None

    def reward_signals(self, rollouts):
        self._record("reward_signals", rollouts)
        return {}

    def signal_weights(self):
        self._record("signal_weights")
        return None

    def shape_advantages(self, rollouts, advantages):
        self._record("shape_advantages", rollouts, advantages)
        return None

    def observe(self, rollouts):
        self._record("observe", rollouts)
        return {"seen": 1.0}

    def select(self, rollouts):
        self._record("select", rollouts)
        return None

    def teacher_context(self, task, rollouts):
        self._record("teacher_context", task, rollouts)
        return None

    def sd_gate(self, rollouts):
        self._record("sd_gate", rollouts)
        return None

    def pop_events(self):
        self._record("pop_events")
        return []

    def rollback(self, step):
        self._record("rollback", step)

    def disk_records(self):
        self._record("disk_records")
        return {}

    def state_dict(self):
        self._record("state_dict")
        return {}

    def load_state_dict(self, state):
        self._record("load_state_dict", state)


def test_a_stub_controller_gets_every_hook_with_its_arguments(tmp_path):
    c = grpo.get_config("smoke")
    c.loss.update(sd_estimator="full", sd_coef=0.5)  # the teacher and gate stages run
    c.calibration.enabled = False
    domain = builders.build_domain(c)
    stub = _Stub()
    n, j = int(c.rollout.tasks_per_step), int(c.rollout.samples_per_task)
    sampler = UniformSampler(domain.train, n, seed=0)
    run = scripted_run(
        c, None, str(tmp_path), ControllerSet(sampler, [stub]),
        engine=lambda tok: ScriptedEngine(tok, prompt_words),
    )  # fmt: skip
    rollouts, ctx = run.step(1)
    assert ctx.metrics["stub/seen"] == 1.0
    calls = stub.calls
    (services, run_dir), *_ = calls["bind"]
    assert services.engine is run.services.engine and run_dir == str(tmp_path / "controllers/stub")
    assert "sample_tasks" not in calls  # only the sampler is asked for tasks
    assert isinstance(sampler.sample_tasks(2, np.random.default_rng(0)), TaskBatch)
    ((tasks, prompts),) = calls["decorate"]
    assert len(tasks) == len(prompts) == n and all(isinstance(t, Task) for t in tasks)
    assert all(isinstance(m, dict) and {"role", "content"} <= set(m) for p in prompts for m in p)
    ((step, tasks2, prompts2, n_samples),) = calls["sample_prompts"]
    assert (step, n_samples) == (1, j) and list(tasks2) == list(tasks) and len(prompts2) == n
    for hook in ("reward_signals", "observe", "select", "sd_gate"):
        ((r,),) = calls[hook]
        assert r is rollouts and isinstance(r, Rollouts), hook
    ((r, adv),) = calls["shape_advantages"]
    assert r is rollouts and np.asarray(adv).shape == (n, j)
    assert calls["signal_weights"]
    assert [t for t, _ in calls["teacher_context"]] == list(rollouts.tasks)
    assert all(r is rollouts for _, r in calls["teacher_context"])
    # The run's own hooks (checkpoint, resume, event logs), through the set as the trainer calls.
    run.controllers.pop_events()
    assert run.controllers.state_dict()["stub"] == {}
    run.controllers.load_state_dict(run.controllers.state_dict())
    run.controllers.rollback(1)
    run.controllers.disk_records()
    assert calls["pop_events"] == [()] and calls["state_dict"] == [(), ()]
    assert calls["load_state_dict"] == [({},)] and calls["rollback"] == [(1,)]
    assert calls["disk_records"] == [()]
    assert set(calls) == set(HOOKS) - {"sample_tasks"}
