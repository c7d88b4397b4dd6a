"""ARISE (seed 000): the rubric–skill pool that co-evolves with the policy.

Modules: ``arise`` (the controller: pool, reflection and capability sampler in the step),
``arise_pool`` (entries and their lifecycle, ``AriseConfig``), ``arise_config`` (the
``config.arise`` section, ``AriseSection``: its defaults, checks and the controller's arguments),
``capability_sampler`` (task-type × capability adaptive sampling), ``reflection_base`` /
``reflection`` / ``reflection_llm`` (the programmatic and the LLM reflection).
"""

from __future__ import annotations

from typing import Any

from rubric_rl.envs.base import DomainContract
from rubric_rl.methods.method import Method, register_method


def arise_controllers(config: Any, domain: DomainContract) -> list[Any]:
    """The ARISE controller over the domain's training tasks (it is the step's sampler); with
    ``arise.frozen_pool_from`` its pool is loaded from that run's final pool."""
    from rubric_rl.methods.arise.arise import domain_kwargs, make_arise_controller
    from rubric_rl.methods.arise.arise_config import arise_controller_kwargs, validate_arise

    section = validate_arise(config)
    client = None
    if section.reflection == "llm":
        from rubric_rl.rubrics.llm import client_from_settings

        client = client_from_settings(config.arise.llm, config.judge.llm)
    ctrl = make_arise_controller(
        domain.train,
        int(config.rollout.tasks_per_step),
        seed=int(config.train.seed),
        llm_client=client,
        **domain_kwargs(domain),
        **arise_controller_kwargs(config),
    )
    if section.frozen_pool_from:
        from rubric_rl.analysis import final_pool_state

        ctrl.load_pool(
            final_pool_state(section.frozen_pool_from),
            section.frozen_pool_entries,
            mode=section.frozen_mode,
        )
    return [ctrl]


def validate_arise(config: Any) -> None:
    """``config.arise``'s start-up checks (``arise_config.validate_arise``)."""
    from rubric_rl.methods.arise.arise_config import validate_arise as check

    check(config)


METHOD = register_method(
    Method(
        "arise",
        arise_controllers,
        validate=validate_arise,
        analyses={"final_pool": "rubric_rl.analysis:final_pool_state"},
    )
)

__all__ = ["METHOD", "arise_controllers", "validate_arise"]
