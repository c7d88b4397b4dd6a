"""The extension points of ``docs/extending.md`` that ``tests/test_contracts.py`` (controller
hooks, every method's stages) leaves: a stage closed over its controller run in a pipeline, the
default stage names, the step-callback contract and what a method registers. Stubs written
against the documented signatures are checked and run (no model)."""

import dataclasses
import inspect

import numpy as np
import pytest

from rubric_rl import step as step_lib
from rubric_rl.controllers.base import Controller, ControllerSet, TaskBatch
from rubric_rl.loop.step_callbacks import StepCallbackError, call_step_end, check_callback
from rubric_rl.methods.method import Method
from rubric_rl.rollout.batch import Group, Rollouts, Trajectory
from rubric_rl.rubrics.types import Criterion, Rubric, Task

STAGES = (
    "sample", "decorate", "generate", "judge", "reward", "advantage", "observe", "select",
    "teacher", "gate",
)  # fmt: skip


def _params(fn):
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


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
    name = "stub"

    def teacher_context(self, task, rollouts):
        return f"hint for {task.id}"


def test_default_stage_names():
    assert step_lib.default_pipeline().names == STAGES


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
