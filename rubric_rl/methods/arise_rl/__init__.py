"""ARISE-RL (seed 002): generator–solver co-evolution on one policy, with RG-SED for both roles.

Modules: ``arise_rl`` (the controller, ``AriseRLConfig`` — the ``config.arise_rl`` section — and
the step pipeline), ``arise_rl_rewards`` (R_G, the solver reward, the baselines' proposer
rewards), ``rgsed`` / ``rgsed_coach`` (RG-SED's gate, schedules and programmatic coach),
``arise_rl_domain`` (the generator-domain interface over a domain's task writer,
``Domain.task_writer``: the embedded constraint domain's ``envs/constraint_writer.py`` with its
warm-start demonstrations ``envs/constraint_writer_corpus.py``, the SQL environment's
``envs/sql_writer.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rubric_rl.envs.base import DomainContract
from rubric_rl.methods.method import Method, register_method


def arise_rl_config(config: Any) -> Any:
    """``config.arise_rl`` as an ``AriseRLConfig`` (``AriseRLConfig.from_config``: a missing,
    unknown or wrong-typed field names ``config.arise_rl.<field>``)."""
    from rubric_rl.methods.arise_rl.arise_rl import AriseRLConfig

    return AriseRLConfig.from_config(config)


def arise_rl_controllers(config: Any, domain: DomainContract) -> list[Any]:
    """One controller that is the sampler (the cycle schedule: generator tasks, then the pool of
    generated tasks) and owns R_G, the solver reward and RG-SED. The generator role writes tasks
    of the solver domain through its task writer (``Domain.task_writer``), which must be the one
    ``config.arise_rl.generator_domain`` names (``arise_rl_domain.py``)."""
    from rubric_rl.methods.arise_rl.arise_rl import AriseRLController
    from rubric_rl.methods.arise_rl.arise_rl_domain import build_generator_domain

    cfg = arise_rl_config(config)
    generator_domain = build_generator_domain(
        cfg.generator_domain, domain, rubric_completion=cfg.rubric_completion
    )
    mode = str(config.rollout.mode)
    if generator_domain.solver_agent and mode not in ("agent", "auto"):
        raise ValueError(
            f"config.arise_rl.generator_domain={cfg.generator_domain!r}: the solver answers "
            f"its tasks in agent episodes; config.rollout.mode must be 'agent', got {mode!r}"
        )
    external = bool(config.get("teacher") is not None and config.teacher.model)
    if (cfg.teacher != "self") != external:
        raise ValueError(
            f"config.arise_rl.teacher={cfg.teacher!r} with config.teacher.model="
            f"{config.teacher.model!r}: the OPCD / GKD baselines need an external teacher "
            "(config.teacher.model and .params), RG-SED ('self') must not have one"
        )
    # Generated tasks train the solver, which is evaluated on these: never generate one of them.
    forbidden = generator_domain.forbidden_signatures([*domain.heldout, *domain.validation])
    llm_coach = None
    if cfg.coach == "llm":
        from rubric_rl.methods.arise_rl.rgsed_llm_coach import LLMCoach
        from rubric_rl.rubrics.llm import client_from_settings, role_max_failure_rate

        client = client_from_settings(config.arise_rl.coach_llm, config.judge.llm)
        llm_coach = LLMCoach(
            client, cfg.coach_llm, style=domain.style,
            max_failure_rate=role_max_failure_rate(config),
        )  # fmt: skip
    return [
        AriseRLController(
            cfg,
            fallback_tasks=domain.train,
            forbidden=forbidden,
            tasks_per_step=int(config.rollout.tasks_per_step),
            seed=int(config.train.seed),
            generator_domain=generator_domain,
            style=domain.style,
            llm_coach=llm_coach,
        )  # fmt: skip
    ]


def arise_rl_pipeline(config: Any, controllers: Sequence[Any]) -> Any:
    """``arise_rl.pipeline`` over the one controller ``arise_rl_controllers`` returns."""
    from rubric_rl.methods.arise_rl.arise_rl import AriseRLController, pipeline

    if len(controllers) != 1 or not isinstance(controllers[0], AriseRLController):
        raise TypeError(
            "the arise_rl pipeline is built over arise_rl_controllers' own list, one "
            f"AriseRLController; got {[type(c).__name__ for c in controllers]}"
        )
    return pipeline(controllers[0])


def validate_arise_rl(config: Any) -> None:
    """``config.arise_rl`` builds an ``AriseRLConfig``, whose checks name the field."""
    arise_rl_config(config)


METHOD = register_method(
    Method(
        "arise_rl",
        arise_rl_controllers,
        pipeline=arise_rl_pipeline,
        validate=validate_arise_rl,
    )
)

__all__ = ["METHOD", "arise_rl_config", "arise_rl_controllers", "arise_rl_pipeline"]
