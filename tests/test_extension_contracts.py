"""The extension points of ``docs/extending.md``, pinned: the controller hooks' and a stage's
signatures, the default stage names, the step-callback contract and what a method registers. A
stub of each kind, written against the documented signature, is checked and run (no model)."""

import dataclasses
import inspect

import numpy as np
import pytest

from rubric_rl import step as step_lib
from rubric_rl.controllers.base import Controller, ControllerSet, TaskBatch
from rubric_rl.methods.method import Method
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.rubrics.types import Criterion, Rubric, Task
from rubric_rl.step_callbacks import StepCallbackError, call_step_end, check_callback

# hook -> its parameters after ``self``, as docs/extending.md lists them.
HOOKS = {
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
}
# The lifecycle a controller may override besides the hooks (binding, events, state, files).
LIFECYCLE = {
    "bind": ("services", "run_dir"),
    "pop_events": (),
    "rollback": ("step",),
    "disk_records": (),
    "state_dict": (),
    "load_state_dict": ("state",),
}
STAGES = (
    "sample", "decorate", "generate", "judge", "reward", "advantage", "observe", "select",
    "teacher", "gate",
)  # fmt: skip


def _params(fn):
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def test_controller_hooks_and_lifecycle_have_the_documented_signatures():
    public = {n for n, v in vars(Controller).items() if callable(v) and not n.startswith("_")}
    assert public == set(HOOKS) | set(LIFECYCLE), "a hook was added or removed: update the docs"
    for name, params in {**HOOKS, **LIFECYCLE}.items():
        assert _params(getattr(Controller, name)) == params, name
        # The set that composes them calls each controller's hook with those arguments.
        if name in HOOKS:
            set_params = _params(getattr(ControllerSet, name))
            assert set_params[: len(params)] == params, name


def _task(i):
    return Task(
        id=f"t{i}", prompt=({"role": "user", "content": f"q{i}"},),
        rubric=Rubric((Criterion("c", "x"),)),
    )  # fmt: skip


def _rollouts(n_groups=2, j=2):
    groups = []
    for g in range(n_groups):
        trajs = [Trajectory((1,), (-0.1,), "stop", 0, f"r{g}{k}", sample_index=k) for k in range(j)]
        groups.append(Group(_task(g), trajectories=trajs))
    return Rollouts(1, groups)


class StubSampler(Controller):
    name = "stub_sampler"

    def sample_tasks(self, step, rng):
        return TaskBatch([_task(0), _task(1)], np.ones(2))


class StubController(Controller):
    """Every hook overridden with the documented signature (keyword names included)."""

    name = "stub"

    def decorate(self, tasks, prompts):
        return [[*p, {"role": "system", "content": "stub"}] for p in prompts]

    def sample_prompts(self, step, tasks, prompts, n):
        return None

    def reward_signals(self, rollouts):
        return {"stub": np.full((len(rollouts), 2), 0.5)}

    def signal_weights(self):
        return {"stub": 1.0}

    def shape_advantages(self, rollouts, advantages):
        return advantages * 2.0

    def observe(self, rollouts):
        return {"seen": float(len(rollouts))}

    def select(self, rollouts):
        return np.array([True, False])

    def teacher_context(self, task, rollouts):
        return f"hint for {task.id}"

    def sd_gate(self, rollouts):
        return np.array([0.5, 1.0])


def test_a_stub_controller_written_against_the_hooks_composes_as_documented():
    for name, params in HOOKS.items():
        if name in vars(StubController):
            assert _params(getattr(StubController, name)) == params, name
    cs = ControllerSet(StubSampler(), [StubController()])
    r = _rollouts()
    rng = np.random.default_rng(0)
    assert [t.id for t in cs.sample_tasks(step=3, rng=rng).tasks] == ["t0", "t1"]
    tasks = [g.task for g in r.groups]
    decorated = cs.decorate(tasks, [t.messages for t in tasks])
    assert all(p[-1]["content"] == "stub" for p in decorated)
    assert set(cs.reward_signals(r)) == {"stub"} and cs.signal_weights() == {"stub": 1.0}
    np.testing.assert_array_equal(cs.shape_advantages(r, np.ones((2, 2))), np.full((2, 2), 2.0))
    np.testing.assert_array_equal(cs.select(r), [True, False])
    assert cs.teacher_context(tasks[0], r) == "hint for t0"
    np.testing.assert_array_equal(cs.sd_gate(r), [0.5, 1.0])


def test_default_stage_names_and_the_stage_signature():
    assert step_lib.default_pipeline().names == STAGES
    for name, stage in step_lib.DEFAULT_STAGES:
        assert _params(stage) == ("rollouts", "ctx"), name


def _ctx(controllers):
    return step_lib.StepContext(
        step=1, config=None, rng=np.random.default_rng(0), services=None,
        controllers=controllers, domain=None,
    )  # fmt: skip


def test_a_stub_stage_closed_over_its_controller_runs_in_a_pipeline():
    """A stage built with its controller closed over (as ``Method.pipeline`` builds one) fills
    the record; one that returns anything but ``Rollouts`` is refused, naming it."""
    mine = StubController()

    def make(rollouts, ctx):
        return _rollouts()

    def my_teacher(rollouts, ctx):
        for g in rollouts.groups:
            for t in g.trajectories:
                t.teacher_prompt = [
                    {"role": "user", "content": mine.teacher_context(g.task, rollouts)}
                ]
        return rollouts

    assert _params(make) == _params(my_teacher) == ("rollouts", "ctx")
    ctx = _ctx(ControllerSet(StubSampler()))
    out = step_lib.Pipeline([("sample", make), ("teacher", my_teacher)])(ctx)
    assert [t.teacher_prompt[0]["content"] for g in out.groups for t in g.trajectories] == [
        "hint for t0", "hint for t0", "hint for t1", "hint for t1",
    ]  # fmt: skip
    assert set(ctx.seconds) == {"sample", "teacher"}
    with pytest.raises(TypeError, match="stage 'broken' returned NoneType, not Rollouts"):
        step_lib.Pipeline([("sample", make), ("broken", lambda r, c: None)])(ctx)
    p = step_lib.default_pipeline().replace("teacher", my_teacher)
    assert dict(p.stages)["teacher"] is my_teacher and p.names == STAGES


def test_step_callbacks_object_or_function_and_errors_name_the_callback():
    seen = []

    class Recorder:
        def on_step_end(self, step, metrics, state):
            seen.append(("object", step, metrics, state))

    def record(step, metrics, state):
        seen.append(("function", step, metrics, state))
        metrics["changed"] = True  # a copy: the next callback sees the row unchanged

    callbacks = [check_callback(record), check_callback(Recorder())]
    call_step_end(callbacks, 7, {"loss": 1.0}, "state")
    assert seen == [("function", 7, {"loss": 1.0, "changed": True}, "state"),
                    ("object", 7, {"loss": 1.0}, "state")]  # fmt: skip
    with pytest.raises(TypeError, match="on_step_end"):
        check_callback(object())

    def broken(step, metrics, state):
        raise KeyError("x")

    with pytest.raises(
        StepCallbackError, match=r"test_extension_contracts\..*broken raised at step 7"
    ):
        call_step_end([broken], 7, {}, None)


def test_a_method_registers_controllers_pipeline_checks_and_analyses():
    assert [f.name for f in dataclasses.fields(Method)] == [
        "name", "controllers", "pipeline", "validate", "analyses",
    ]  # fmt: skip
    assert _params(Method.__dataclass_fields__["pipeline"].default) == ("config", "controllers")
    assert _params(Method.__dataclass_fields__["validate"].default) == ("config",)
