"""The ``config.arise`` section read by the package: its start-up checks and the keyword arguments
of ``make_arise_controller`` built from it.

``configs/arise.py`` builds the section (variants, smoke settings) from ``arise_defaults()``; this
module only reads it, so the package never imports ``configs/``. ``validate_arise`` runs from
``rubric_rl.config_validation.validate_config`` through the arise ``Method``, so a bad
``arise.*`` value fails at start-up naming the field, before any model is built.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ml_collections import ConfigDict

from rubric_rl.controllers.sampling import SAMPLERS
from rubric_rl.methods.arise import (
    capability_sampler,  # noqa: F401  (registers "capability")
    reflection_llm,  # noqa: F401  (registers "llm")
)
from rubric_rl.methods.arise.arise import FROZEN_MODES, FROZEN_POOL_ENTRIES
from rubric_rl.methods.arise.arise_pool import AriseConfig
from rubric_rl.methods.arise.reflection import RANKINGS, REFLECTIONS
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


def arise_defaults() -> dict[str, Any]:
    """Every ``AriseConfig`` field at its default (rubric_rl/methods/arise/arise_pool.py)."""
    return dataclasses.asdict(AriseConfig())


def validate_arise(config: ConfigDict) -> None:
    """Start-up checks of the ``arise`` section (after overrides); errors name the field."""
    a = config.arise
    if a.reflection not in REFLECTIONS:
        raise ValueError(
            f"config.arise.reflection: must be one of {REFLECTIONS.names()}, got {a.reflection!r}"
        )
    if a.sampler not in SAMPLERS:
        raise ValueError(
            f"config.arise.sampler: must be one of {SAMPLERS.names()}, got {a.sampler!r}"
        )
    if a.reflection == "programmatic" and a.programmatic.rank not in RANKINGS:
        raise ValueError(
            f"config.arise.programmatic.rank: must be one of {RANKINGS}, "
            f"got {a.programmatic.rank!r}"
        )
    if a.frozen_pool_entries not in FROZEN_POOL_ENTRIES:
        raise ValueError(
            f"config.arise.frozen_pool_entries: must be one of {FROZEN_POOL_ENTRIES}, "
            f"got {a.frozen_pool_entries!r}"
        )
    mode = frozen_mode(config)
    if mode not in FROZEN_MODES:
        raise ValueError(f"config.arise.frozen_mode: must be one of {FROZEN_MODES}, got {mode!r}")
    if a.frozen_pool_from:
        if mode == "frozen_pool_and_skills" and a.evolve:
            raise ValueError(
                "config.arise.frozen_pool_from: a frozen pool needs arise.evolve=False "
                "(frozen_mode='frozen_pool_and_skills')"
            )
        if mode == "rubrics" and not (a.evolve and a.fixed_rubrics):
            raise ValueError(
                "config.arise.frozen_pool_from: a frozen pool with frozen_mode='rubrics' needs "
                "arise.evolve=True and arise.fixed_rubrics=True (the skills keep their lifecycle)"
            )
        if not os.path.isdir(a.frozen_pool_from):
            raise ValueError(
                f"config.arise.frozen_pool_from: run directory {a.frozen_pool_from!r} "
                "does not exist"
            )
        if mode == "rubrics":
            _check_other_seed(config)
    try:
        AriseConfig(**{k: a[k] for k in arise_defaults()})
    except ValueError as e:
        raise ValueError(f"config.arise: {e}") from None


def frozen_arm_settings(mode: str) -> dict[str, Any]:
    """The ``config.arise`` values of a frozen arm (``arise.FROZEN_MODES``): "rubrics" keeps the
    skills' lifecycle over a fixed rubric set, "frozen_pool_and_skills" stops every transition."""
    if mode not in FROZEN_MODES:
        raise ValueError(f"frozen mode must be one of {FROZEN_MODES}, got {mode!r}")
    rubrics = mode == "rubrics"
    return {"frozen_mode": mode, "evolve": rubrics, "fixed_rubrics": rubrics}


def frozen_mode(config: ConfigDict) -> str:
    """``config.arise.frozen_mode`` (``arise.FROZEN_MODES``); a config without the key (written
    before it existed) froze pool and skills, and reruns that way."""
    return str(config.arise.get("frozen_mode", "frozen_pool_and_skills"))


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
    validate_arise(config)
    a = config.arise
    kw: dict[str, Any] = {k: a[k] for k in arise_defaults()}
    kw["sampler"] = a.sampler
    options = {"capability": a.capability, "reward_variance": a.variance}.get(a.sampler)
    kw["sampler_options"] = options.to_dict() if options is not None else {}
    kw["reflection"] = a.reflection
    if a.reflection == "programmatic":
        kw["reflection_options"] = a.programmatic.to_dict()
    else:
        llm = a.llm.to_dict()
        kw["reflection_options"] = {k: llm[k] for k in _LLM_REFLECTION_OPTIONS}
        kw["reflection_options"]["max_failure_rate"] = role_max_failure_rate(config)
    return kw
