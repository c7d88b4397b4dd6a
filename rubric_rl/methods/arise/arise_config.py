"""The ``config.arise`` section: ``AriseSection`` holds the one default of each field (the pool's
and lifecycle's, inherited from ``AriseConfig``, and the sampler's, reflection's and frozen arms')
and checks itself; ``configs/arise.py`` builds the section from ``section_defaults(AriseSection)``
and sets only what a variant changes; ``AriseSection.from_config`` reads it back, refusing a
missing, unknown or wrong-typed field with an error naming ``config.arise.<field>``. The package
never imports ``configs/``. ``validate_arise`` runs from
``rubric_rl.config.config_validation.validate_config`` through the arise ``Method``, so a bad
``arise.*`` value fails at start-up naming the field, before any model is built.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ml_collections import ConfigDict

from rubric_rl.controllers.sampling import SAMPLERS, RewardVarianceConfig
from rubric_rl.methods.arise import (
    capability_sampler,  # noqa: F401  (registers "capability")
    reflection_llm,  # noqa: F401  (registers "llm")
)
from rubric_rl.methods.arise.arise import FROZEN_MODES, FROZEN_POOL_ENTRIES
from rubric_rl.methods.arise.arise_pool import AriseConfig
from rubric_rl.methods.arise.capability_sampler import CapabilitySamplerConfig
from rubric_rl.methods.arise.reflection import RANKINGS, REFLECTIONS, ProgrammaticReflection
from rubric_rl.methods.arise.reflection_llm import LLMReflection
from rubric_rl.methods.method import complete_section, default_of
from rubric_rl.rubrics.llm import role_max_failure_rate

# The options that LLMReflection takes from ``arise.llm`` (the rest of that section selects the
# reflection model's client, which builders.py makes).
_LLM_REFLECTION_OPTIONS = (
    "propose_template",
    "refine_template",
    "max_examples",
    "max_chars",
    "temperature",
    "max_tokens",
)


@dataclasses.dataclass(frozen=True)
class VarianceSection:
    """``config.arise.variance``: the reward-variance selector's options
    (``sampling.RewardVarianceConfig``; ``arise.sampler="reward_variance"``). It scores the task
    (verifier) reward: ARISE's Evidence.rewards is the pool's rubric reward, undefined while the
    pool is empty."""

    explore_share: float = default_of(RewardVarianceConfig, "explore_share")
    ema: float = default_of(RewardVarianceConfig, "ema")
    floor: float = default_of(RewardVarianceConfig, "floor")
    reward: str = "task_verifier"  # ARISE's choice (docstring); RewardVarianceConfig: "evidence"
    min_group: int = default_of(RewardVarianceConfig, "min_group")


@dataclasses.dataclass(frozen=True)
class CapabilitySection:
    """``config.arise.capability``: the capability sampler's options (``CapabilitySamplerConfig``;
    ``arise.sampler="capability"``)."""

    # ARISE "prioritizes": draws are trained as drawn (u = 1). True multiplies each draw by
    # u = 1/(N p) (HarnessRL's correction), which returns the objective to uniform in
    # expectation: the earlier default, kept as an ablation.
    importance_weights: bool = default_of(CapabilitySamplerConfig, "importance_weights")
    discovery_share: float = default_of(CapabilitySamplerConfig, "discovery_share")
    prior_alpha: float = default_of(CapabilitySamplerConfig, "prior_alpha")
    prior_beta: float = default_of(CapabilitySamplerConfig, "prior_beta")
    decay: float = default_of(CapabilitySamplerConfig, "decay")
    # capability_sampler.PRIORITIES: variance = p(1-p), uniform
    priority: str = default_of(CapabilitySamplerConfig, "priority")
    min_priority: float = default_of(CapabilitySamplerConfig, "min_priority")
    min_cell_evidence: float = default_of(CapabilitySamplerConfig, "min_cell_evidence")


@dataclasses.dataclass(frozen=True)
class ProgrammaticSection:
    """``config.arise.programmatic``: ``ProgrammaticReflection``'s options
    (``arise.reflection="programmatic"``)."""

    min_support: int = default_of(ProgrammaticReflection, "min_support")
    min_failures: int = default_of(ProgrammaticReflection, "min_failures")
    min_separation: float = default_of(ProgrammaticReflection, "min_separation")
    redundant_agreement: float = default_of(ProgrammaticReflection, "redundant_agreement")
    # "progress_mass": propose the criteria whose verdicts vary inside the most failing groups
    # (partial progress the task reward cannot see), by Σ_g q_g(1 − q_g); "progress" ranks by the
    # mean over those groups (a criterion reaching one group ties one reaching ten), "separation"
    # ranks never-met criteria first, the earlier default (methods/arise/reflection.py).
    rank: str = default_of(ProgrammaticReflection, "rank")
    min_progress_variance: float = default_of(ProgrammaticReflection, "min_progress_variance")


@dataclasses.dataclass(frozen=True)
class LLMReflectionSection:
    """``config.arise.llm``: ``LLMReflection``'s options (``arise.reflection="llm"``) and the
    reflection model's client; an empty ``model`` (and client field) is the judge's
    (``judge.llm``)."""

    propose_template: str = default_of(LLMReflection, "propose_template")
    refine_template: str = default_of(LLMReflection, "refine_template")
    max_examples: int = default_of(LLMReflection, "max_examples")
    max_chars: int = default_of(LLMReflection, "max_chars")
    temperature: float = default_of(LLMReflection, "temperature")
    max_tokens: int = default_of(LLMReflection, "max_tokens")
    backend: str = ""
    model: str = ""
    base_url: str = ""
    api_key_env: str = ""


# A key missing from a run's config (a config.json written before the key existed) means the
# behaviour the code had then, so an archived config reruns as it ran. Not a second default: a
# config file starts the section from every field's default (``section_defaults``).
ABSENT_MEANS: dict[str, Any] = {
    "fixed_rubrics": False,  # the rubric set evolved with the skills
    "frozen_mode": "frozen_pool_and_skills",  # a frozen pool froze its skills too
}


@dataclasses.dataclass(frozen=True)
class AriseSection(AriseConfig):
    """``config.arise``: ``AriseConfig``'s fields (the pool, its lifecycle and the reward), the
    inner task sampler and the reflection with their options, and the frozen arms."""

    # The inner task sampler (a SAMPLERS name) and its options (capability / reward_variance).
    sampler: str = "capability"
    variance: VarianceSection = dataclasses.field(default_factory=VarianceSection)
    capability: CapabilitySection = dataclasses.field(default_factory=CapabilitySection)
    # The reflection role (a REFLECTIONS name) and each implementation's options.
    reflection: str = "programmatic"
    programmatic: ProgrammaticSection = dataclasses.field(default_factory=ProgrammaticSection)
    llm: LLMReflectionSection = dataclasses.field(default_factory=LLMReflectionSection)
    frozen_pool_from: str = ""  # a run directory (another seed's run): its rubric set, fixed
    frozen_pool_entries: str = "lifecycle"  # every pair ever added | "final": the final pool only
    # "rubrics": the rubric set fixed, skills from the base text through their lifecycle (needs
    # evolve=True, fixed_rubrics=True); "frozen_pool_and_skills": the pool as the source run
    # left it, skills included, no transition (needs evolve=False): the arm before.
    frozen_mode: str = "rubrics"

    def __post_init__(self):
        super().__post_init__()
        _one_of("reflection", self.reflection, REFLECTIONS.names())
        _one_of("sampler", self.sampler, SAMPLERS.names())
        if self.reflection == "programmatic":
            _one_of("programmatic.rank", self.programmatic.rank, RANKINGS)
        _one_of("frozen_pool_entries", self.frozen_pool_entries, FROZEN_POOL_ENTRIES)
        _one_of("frozen_mode", self.frozen_mode, FROZEN_MODES)
        for field, cls, options in (
            ("capability", CapabilitySamplerConfig, self.capability),
            ("variance", RewardVarianceConfig, self.variance),
        ):
            try:
                cls(batch_size=1, **dataclasses.asdict(options))
            except (ValueError, KeyError) as e:  # a registry's unknown name is a KeyError
                raise ValueError(f"config.arise.{field}: {e.args[0]}") from None
        if not self.frozen_pool_from:
            return
        if self.frozen_mode == "frozen_pool_and_skills" and self.evolve:
            raise ValueError(
                "config.arise.frozen_pool_from: a frozen pool needs arise.evolve=False "
                "(frozen_mode='frozen_pool_and_skills')"
            )
        if self.frozen_mode == "rubrics" and not (self.evolve and self.fixed_rubrics):
            raise ValueError(
                "config.arise.frozen_pool_from: a frozen pool with frozen_mode='rubrics' needs "
                "arise.evolve=True and arise.fixed_rubrics=True (the skills keep their lifecycle)"
            )

    @classmethod
    def from_config(cls, config: Any) -> AriseSection:
        """``config.arise`` as an ``AriseSection`` (``method.complete_section``; a key absent
        from the section: ``ABSENT_MEANS``); a refused value is an error naming
        ``config.arise``."""
        try:
            return complete_section(cls, config, "arise", absent=ABSENT_MEANS)
        except ValueError as e:
            if str(e).startswith("config.arise"):
                raise
            raise ValueError(f"config.arise: {e}") from None

    def pool(self) -> AriseConfig:
        """The pool's, lifecycle's and reward's settings (``AriseConfig``'s fields)."""
        return AriseConfig(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(AriseConfig)}
        )


def _one_of(field: str, value: str, allowed: Any) -> None:
    if value not in allowed:
        raise ValueError(f"config.arise.{field}: must be one of {list(allowed)}, got {value!r}")


# ARISE's earlier defaults, each still a flag so that setting stays an ablation
# (keys are paths under ``config.arise``): HarnessRL's importance weights on the capability
# sampler's draws, the separation ranking, no exit for a pair that never improves, candidates
# from the seed rubric only, and a pool of 8 filled at up to 2 pairs a step, retired after 4
# steps of mastery. benchmarks/arise_controller_check.py and its test compare the defaults to these.
EARLIER_DEFAULTS: dict[str, Any] = {
    "capability.importance_weights": True,
    "programmatic.rank": "separation",
    "retire_unlearnable": False,
    "bank": "seed_rubric",
    "pool_cap": 8,
    "max_add_per_reflection": 2,
    "reflect_every": 1,
    "retire_window": 4,
}


def with_arise_settings(config: ConfigDict, settings: dict[str, Any]) -> ConfigDict:
    """A locked copy of ``config`` with ``settings`` (paths under ``config.arise``) applied."""
    out = config.copy_and_resolve_references()
    out.unlock()
    for key, value in settings.items():
        node = out.arise
        *path, field = key.split(".")
        for p in path:
            node = node[p]
        if field not in node:
            raise KeyError(f"config.arise.{key}: no such field")
        node[field] = value
    out.lock()
    return out


def validate_arise(config: ConfigDict) -> AriseSection:
    """Start-up checks of the ``arise`` section (after overrides); errors name the field. A
    frozen arm's source run must exist (and, for ``frozen_mode="rubrics"``, be another seed's)."""
    section = AriseSection.from_config(config)
    if section.frozen_pool_from:
        if not os.path.isdir(section.frozen_pool_from):
            raise ValueError(
                f"config.arise.frozen_pool_from: run directory {section.frozen_pool_from!r} "
                "does not exist"
            )
        if section.frozen_mode == "rubrics":
            _check_other_seed(config)
    return section


def frozen_arm_settings(mode: str) -> dict[str, Any]:
    """The ``config.arise`` values of a frozen arm (``arise.FROZEN_MODES``): "rubrics" keeps the
    skills' lifecycle over a fixed rubric set, "frozen_pool_and_skills" stops every transition."""
    if mode not in FROZEN_MODES:
        raise ValueError(f"frozen mode must be one of {FROZEN_MODES}, got {mode!r}")
    rubrics = mode == "rubrics"
    return {"frozen_mode": mode, "evolve": rubrics, "fixed_rubrics": rubrics}


def _check_other_seed(config: ConfigDict) -> None:
    """The frozen-rubrics arm takes its rubric set from ANOTHER seed's run: a same-seed source
    mined its pairs from the same warm start and the same task draws, which the arm would then
    see from step 1. Checked against the source's ``config.json`` when it has one."""
    path = os.path.join(config.arise.frozen_pool_from, "config.json")
    if not os.path.exists(path):
        return
    import json

    with open(path, encoding="utf-8") as f:
        src_seed = json.load(f).get("train", {}).get("seed")
    if src_seed is not None and int(src_seed) == int(config.train.seed):
        raise ValueError(
            f"config.arise.frozen_pool_from: {config.arise.frozen_pool_from!r} is a run of "
            f"train.seed={src_seed}, this run's seed: frozen_mode='rubrics' takes the rubric set "
            "from another seed's run"
        )


def arise_controller_kwargs(config: ConfigDict) -> dict[str, Any]:
    """Keyword arguments of ``make_arise_controller`` (all but tasks, batch size, seed and the
    LLM client): every AriseConfig field, the sampler and reflection with their options."""
    a = validate_arise(config)
    kw: dict[str, Any] = dataclasses.asdict(a.pool())
    kw["sampler"] = a.sampler
    options = {"capability": a.capability, "reward_variance": a.variance}.get(a.sampler)
    kw["sampler_options"] = dataclasses.asdict(options) if options is not None else {}
    kw["reflection"] = a.reflection
    if a.reflection == "programmatic":
        kw["reflection_options"] = dataclasses.asdict(a.programmatic)
    else:
        llm = dataclasses.asdict(a.llm)
        kw["reflection_options"] = {k: llm[k] for k in _LLM_REFLECTION_OPTIONS}
        kw["reflection_options"]["max_failure_rate"] = role_max_failure_rate(config)
    return kw
