"""configs/arise.py: variants set the documented keys; ``arise_controller_kwargs`` builds the
controller; ``frozen_rubrics=<run dir>`` installs that run's lifecycle pool (read from its last
checkpoint) and keeps it fixed."""

import dataclasses
import io
import json
import os
import tarfile

import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import arise
from rubric_rl import analysis as an
from rubric_rl.config import builders
from rubric_rl.config.config_validation import validate_config
from rubric_rl.envs.constraint_corpus import warmstart_example
from rubric_rl.methods.arise.arise import domain_kwargs, make_arise_controller
from rubric_rl.methods.arise.arise_config import ABSENT_MEANS, AriseSection
from rubric_rl.methods.arise.arise_pool import AriseConfig
from rubric_rl.methods.method import section_defaults
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.judges import JudgeItem, ProgrammaticJudge


def Evidence(step, tasks, prompts, responses, verdicts, scores, rewards, advantages):  # noqa: N802
    """The step record controllers observe, built from plain data (``Rollouts.from_responses``)."""
    return Rollouts.from_responses(
        step, tasks, responses, verdicts or None, prompts=prompts or None, rewards=rewards,
        advantages=advantages,
    )  # fmt: skip


@pytest.mark.parametrize(
    "variant, evolve, inject, sampler, pool_cap",
    [
        ("", True, True, "capability", 16),
        ("no_skills", True, False, "capability", 16),
        ("sampler=uniform", True, True, "uniform", 16),
        ("sampler=variance", True, True, "reward_variance", 16),
        ("outcome_only", False, False, "uniform", 0),
        ("smoke", True, True, "capability", 4),
    ],
)
def test_variants(variant, evolve, inject, sampler, pool_cap):
    c = arise.get_config(variant)
    a = c.arise
    assert (a.evolve, a.inject_skills, a.sampler, a.pool_cap) == (evolve, inject, sampler, pool_cap)
    assert c.controllers.sampler == "arise" and c.method == "arise"
    assert set(a.keys()) == {f.name for f in dataclasses.fields(arise.AriseSection)}


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


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("reflection", "oracle", r"config\.arise\.reflection: must be one of \['llm', 'prog"),
        ("sampler", "bandit", r"config\.arise\.sampler: must be one of"),
        ("hide_above", 0.1, r"config\.arise: AriseConfig thresholds"),
        ("pool_cap", -1, r"config\.arise: AriseConfig\.pool_cap must be >= 0"),
        ("frozen_pool_from", "/no/such/run", r"config\.arise\.frozen_pool_from: a frozen pool"),
        ("frozen_pool_entries", "all", r"config\.arise\.frozen_pool_entries: must be one of"),
    ],
)
def test_start_up_validation_runs_the_arise_checks(field, value, match):
    # validate_config (what launch and the Trainer call) runs the method's own section checks, so
    # a bad arise.* value fails at start-up naming the field, not when the controller is built.
    c = arise.get_config("smoke")
    validate_config(c, num_devices=8)
    c.arise[field] = value
    with pytest.raises(ValueError, match=match):
        validate_config(c, num_devices=8)


def test_the_section_is_the_dataclass_defaults_and_reads_back_the_same():
    """configs/arise.py starts ``config.arise`` from AriseSection's defaults (one default per
    field, the pool's inherited from AriseConfig), and the method reads the same values back."""
    assert arise.get_arise_section().to_dict() == section_defaults(AriseSection)
    assert AriseSection.from_config(arise.get_config()) == AriseSection()
    a = AriseSection.from_config(arise.get_config("smoke"))
    assert (a.pool_cap, a.programmatic.min_support, a.capability.min_cell_evidence) == (4, 4, 1.0)
    assert a.pool() == AriseConfig(
        **{f.name: getattr(a, f.name) for f in dataclasses.fields(AriseConfig)}
    )
    assert a.pool().pool_cap == 4 and type(a.pool()) is AriseConfig


@pytest.mark.parametrize(
    "path, value, match",
    [
        ("pool_capp", 3, r"^config\.arise: unknown field\(s\) \['pool_capp'\]"),
        ("pool_cap", "4", r"^config\.arise\.pool_cap must be of type int .*got '4'"),
        ("evolve", 1, r"^config\.arise\.evolve must be of type bool"),
        ("capability.decay", "1", r"^config\.arise\.capability\.decay must be of type float"),
        ("capability.decay", 0.0, r"^config\.arise\.capability: .*decay must be in \(0, 1\]"),
        ("variance.reward", "nope", r"^config\.arise\.variance: "),
        ("programmatic.rankk", "x", r"^config\.arise\.programmatic: unknown field\(s\) \['rankk"),
        ("llm.max_tokens", 1.5, r"^config\.arise\.llm\.max_tokens must be of type int"),
        ("frozen_mode", "all", r"^config\.arise\.frozen_mode: must be one of"),
    ],
)
def test_a_wrong_field_is_named_at_start_up(path, value, match):
    c = arise.get_config("smoke").to_dict()
    node = c["arise"]
    *parents, field = path.split(".")
    for p in parents:
        node = node[p]
    node[field] = value
    with pytest.raises(ValueError, match=match):
        validate_config(ConfigDict(c), num_devices=8)


@pytest.mark.parametrize("field", ["sampler", "capability", "programmatic.rank"])
def test_a_missing_field_is_named(field):
    c = arise.get_config("smoke").to_dict()
    *parents, name = field.split(".")
    node = c["arise"]
    for p in parents:
        node = node[p]
    del node[name]
    where = ".".join(["config.arise", *parents])
    with pytest.raises(ValueError, match=rf"^{where}: missing field\(s\) \['{name}'\]"):
        AriseSection.from_config(ConfigDict(c))


ARCHIVE = os.path.join(
    os.path.dirname(__file__), "..", "..", "benchmarks", "results", "runs", "protocol_ws.tar.xz"
)


def test_archived_configs_without_the_later_keys_read_as_they_ran():
    """The ARISE comparison's archived runs (written before ``fixed_rubrics`` and ``frozen_mode``
    existed) read back with those keys at ``ABSENT_MEANS``: an evolving rubric set, and a frozen
    arm that froze pool and skills."""
    sections = {}
    with tarfile.open(ARCHIVE) as tar:
        for m in tar.getmembers():
            if m.name.endswith("seed0/config.json") and m.name.startswith("arise-"):
                config = json.load(io.TextIOWrapper(tar.extractfile(m), encoding="utf-8"))
                sections[m.name.split("/")[0]] = config
    assert len(sections) >= 4, sorted(sections)
    for name, config in sections.items():
        assert not set(ABSENT_MEANS) & set(config["arise"]), name  # the keys are absent
        a = AriseSection.from_config(ConfigDict(config))
        assert (a.fixed_rubrics, a.frozen_mode) == (False, "frozen_pool_and_skills"), name
        # the frozen arm (a pool and skills frozen, no transition) passes the arm's checks
        assert not a.frozen_pool_from or not a.evolve, name
    assert any(config["arise"]["frozen_pool_from"] for config in sections.values())
    c = arise.get_config("smoke").to_dict()
    del c["arise"]["frozen_mode"], c["arise"]["fixed_rubrics"]
    a = AriseSection.from_config(ConfigDict(c))
    assert (a.fixed_rubrics, a.frozen_mode) == (False, "frozen_pool_and_skills")


def test_a_bad_reflection_ranking_is_named_at_start_up():
    c = arise.get_config("smoke")
    c.arise.programmatic.rank = "oracle"
    with pytest.raises(ValueError, match=r"config\.arise\.programmatic\.rank: must be one of"):
        validate_config(c, num_devices=8)


def test_llm_reflection_is_registered_where_the_arise_section_is_read():
    # The `gpu` variant's reflection="llm" lives in reflection_llm.py, which registers itself on
    # import; arise_config imports it, so the name validate_arise accepts also builds (imported
    # here only after the build, so that this test alone does not register it).
    c = arise.get_config("smoke")
    c.arise.reflection = "llm"
    c.arise.llm.max_examples = 5
    validate_config(c, num_devices=8)
    domain = builders.build_domain(c)
    b = int(c.rollout.tasks_per_step)
    client = object()  # never called while the controller is built
    kw = arise.arise_controller_kwargs(c)
    ctl = make_arise_controller(
        domain.train, b, seed=0, llm_client=client, **kw, **domain_kwargs(domain)
    )
    from rubric_rl.methods.arise.reflection_llm import LLMReflection

    assert isinstance(ctl.reflection, LLMReflection)
    assert ctl.reflection.client is client and ctl.reflection.max_examples == 5


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
    ctl = make_arise_controller(
        domain.train, b, seed=0, **arise.arise_controller_kwargs(c), **domain_kwargs(domain)
    )
    _simulate(ctl, b, j, 3)
    events = ctl.pop_events()
    assert [e["event"] for e in events].count("add") >= 2  # the smoke thresholds move the pool
    # A run directory whose last checkpoint holds that controller's state.
    run = tmp_path / "src"
    (run / "checkpoints" / "3" / "run_state").mkdir(parents=True)
    state = {"step": 3, "controllers": {"arise": ctl.state_dict()}}
    (run / "checkpoints" / "3" / "run_state" / "metadata").write_text(json.dumps(state))
    # The earlier arm (tests/controllers/test_arise_frozen.py: the frozen-rubrics arm itself).
    fc = arise.get_config(f"smoke,frozen_rubrics={run},frozen_pool_and_skills")
    assert fc.arise.frozen_pool_from == str(run) and fc.arise.evolve is False
    frozen = make_arise_controller(
        domain.train, b, seed=0, **arise.arise_controller_kwargs(fc), **domain_kwargs(domain)
    )
    frozen.load_pool(an.final_pool_state(fc.arise.frozen_pool_from), mode=fc.arise.frozen_mode)
    before = {e.id: (e.state, e.skill) for e in frozen.pool.entries.values()}
    assert before == {e.id: (e.state, e.skill) for e in ctl.pool.entries.values()} and before
    _simulate(frozen, b, j, 2)
    assert {e.id: (e.state, e.skill) for e in frozen.pool.entries.values()} == before
    assert frozen.pop_events() == []


def test_nested_sections_take_their_defaults_from_the_parts_they_configure():
    import dataclasses

    from rubric_rl.controllers.sampling import RewardVarianceConfig
    from rubric_rl.methods.arise.arise_config import (
        CapabilitySection,
        LLMReflectionSection,
        ProgrammaticSection,
        VarianceSection,
    )
    from rubric_rl.methods.arise.capability_sampler import CapabilitySamplerConfig
    from rubric_rl.methods.arise.reflection import ProgrammaticReflection
    from rubric_rl.methods.arise.reflection_llm import LLMReflection
    from rubric_rl.methods.method import default_of

    def section(cls):
        return {f.name: f.default for f in dataclasses.fields(cls)}

    cap = section(CapabilitySection)
    assert cap == {k: default_of(CapabilitySamplerConfig, k) for k in cap}
    prog = section(ProgrammaticSection)
    assert prog == {k: default_of(ProgrammaticReflection, k) for k in prog}
    llm = {k: v for k, v in section(LLMReflectionSection).items() if k in (
        "propose_template", "refine_template", "max_examples", "max_chars", "temperature",
        "max_tokens")}  # fmt: skip
    assert llm == {k: default_of(LLMReflection, k) for k in llm} and len(llm) == 6
    var = section(VarianceSection)
    # ARISE scores the task verifier's reward; the selector's own default is the evidence's.
    assert var.pop("reward") == "task_verifier" != default_of(RewardVarianceConfig, "reward")
    assert var == {k: default_of(RewardVarianceConfig, k) for k in var}
    with pytest.raises(TypeError, match="batch_size has no default"):
        default_of(CapabilitySamplerConfig, "batch_size")
    with pytest.raises(TypeError, match=r"ProgrammaticReflection\(nope=\) has no default"):
        default_of(ProgrammaticReflection, "nope")
