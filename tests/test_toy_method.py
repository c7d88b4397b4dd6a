"""Adding a method touches no file of the package: this file defines a fifth method (its config
section as one frozen dataclass that checks itself, a controller, a pipeline whose extra stage
closes over that controller), registers it, and trains it two steps through the real Trainer.
Also the registry's errors and the built-in methods' own parts."""

from __future__ import annotations

import dataclasses

import pytest
from ml_collections import ConfigDict

from configs import grpo
from rubric_rl.config.config_validation import validate_config
from rubric_rl.controllers.base import Controller
from rubric_rl.methods.method import (
    BUILTIN,
    Method,
    from_section,
    get_method,
    method_names,
    register_method,
    section_defaults,
)
from rubric_rl.rollout.scripted import ScriptedEngine, prompt_words
from rubric_rl.rubrics.types import append_to_last_user
from tests.trainer_spy import one_device, serve_scripted


@dataclasses.dataclass(frozen=True)
class ToySection:
    """``config.toy``: a hint appended to every prompt."""

    hint: str = "answer briefly ."
    repeat: int = 1

    def __post_init__(self):
        if self.repeat < 1:
            raise ValueError(f"toy.repeat must be >= 1, got {self.repeat}")


class ToyHint(Controller):
    name = "toy"

    def __init__(self, section: ToySection):
        self.text = " ".join([section.hint] * section.repeat)
        self.decorated = 0

    def decorate(self, tasks, prompts):
        self.decorated += len(prompts)
        return [append_to_last_user(p, self.text) for p in prompts]


def toy_controllers(config, domain):
    from rubric_rl.controllers.sampling import SAMPLERS

    sampler = SAMPLERS.get("uniform")(
        list(domain.train), int(config.rollout.tasks_per_step), seed=int(config.train.seed)
    )
    return [sampler, ToyHint(from_section(ToySection, config, "toy"))]


def toy_pipeline(config, controllers):
    from rubric_rl.step import default_pipeline

    hint = controllers[1]  # the list toy_controllers returned: no look-up by type

    def count(rollouts, ctx):
        last_user = [[m for m in g.messages if m["role"] == "user"][-1] for g in rollouts.groups]
        ctx.metrics["toy/hinted_frac"] = sum(
            m["content"].endswith(hint.text) for m in last_user
        ) / len(last_user)
        ctx.metrics["toy/decorated_total"] = float(hint.decorated)
        return rollouts

    return default_pipeline().insert_after("observe", "toy_count", count)


TOY = register_method(
    Method(
        "toy",
        toy_controllers,
        pipeline=toy_pipeline,
        validate=lambda config: from_section(ToySection, config, "toy"),
    )
)


def toy_config(**section) -> ConfigDict:
    c = grpo.get_config("smoke")
    c.unlock()
    c.method = "toy"
    c.toy = ConfigDict({**section_defaults(ToySection), **section})
    c.train.steps = 2
    c.warmstart.steps = 0
    c.calibration.enabled = False
    c.eval.update(at_start=False, every=0)
    c.lock()
    return c


def test_a_method_defined_in_a_test_file_trains_two_steps(tmp_path):
    from rubric_rl.trainer import Trainer

    c = toy_config(hint="be short .", repeat=2)
    validate_config(c)
    t = Trainer(c, str(tmp_path / "run"), devices=one_device())
    serve_scripted(t, ScriptedEngine(t.tokenizer, prompt_words))  # no generation compiled
    try:
        assert [name for name, _ in t.pipeline.stages].index("toy_count") == (
            [name for name, _ in t.pipeline.stages].index("observe") + 1
        )
        rows = t.run()
    finally:
        t.close()
    n = int(c.rollout.tasks_per_step)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["toy/hinted_frac"] for r in rows] == [1.0, 1.0]
    assert [r["toy/decorated_total"] for r in rows] == [n, 2 * n]
    assert all(r["loss"] == r["loss"] for r in rows)  # a real update: finite loss


def test_a_toy_section_checks_itself_at_start_up():
    with pytest.raises(ValueError, match="toy.repeat must be >= 1"):
        validate_config(toy_config(repeat=0))
    with pytest.raises(ValueError, match=r"config\.toy: .*unexpected keyword argument 'hnt'"):
        validate_config(toy_config(hnt="typo"))


def test_registry_errors_name_the_method():
    with pytest.raises(ValueError, match=r"config.method='nope': unknown method; known: \["):
        get_method("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_method(Method("toy", toy_controllers))
    assert register_method(TOY) is TOY  # the same object again is no error
    with pytest.raises(ValueError, match="must be an identifier"):
        Method("not a name", toy_controllers)
    with pytest.raises(ValueError, match="must be 'module:function'"):
        Method("bad_analysis", toy_controllers, analyses={"x": "no_function"})
    assert {"toy", *BUILTIN} <= set(method_names())


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_each_builtin_room_registers_its_method(name):
    m = get_method(name)
    assert m.name == name and m is get_method(name)
    for analysis in m.analyses:
        assert callable(m.analysis(analysis))


def test_rised_section_has_one_default_per_field():
    """configs/rised.py starts ``config.rised`` from RisedConfig's defaults, and the method
    builds the same RisedConfig back from it."""
    from configs import rised
    from rubric_rl.methods.rised.rised import FROM_OTHER_SECTIONS, RisedConfig

    c = rised.get_config("smoke")
    rc = RisedConfig.from_config(c)
    assert rc.k == c.rollout.train_groups and rc.seed == c.train.seed
    fields = {f.name for f in dataclasses.fields(RisedConfig)} - set(FROM_OTHER_SECTIONS)
    assert set(c.rised) == fields
    assert rised.get_rised_section().to_dict() == section_defaults(
        RisedConfig, *FROM_OTHER_SECTIONS
    )
    c.unlock()
    c.rised.retag_evry = 3
    with pytest.raises(ValueError, match=r"config\.rised: .*'retag_evry'"):
        validate_config(c)
