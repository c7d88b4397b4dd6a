"""RISED (seed 003): rubric profiles for online group selection across environments,
positive-rubric self-distillation and negative-rubric anti-patterns.

Modules: ``rised`` (the controller and ``RisedConfig``, the ``config.rised`` section),
``rised_tags`` (tags and profiles), ``rised_tagger`` / ``rised_llm_tagger`` (the taggers: by
code over the domain's ``Behaviours``, or by an LLM; the warm-up vocabulary),
``rised_selection`` (k-of-2k selection, pure numpy), ``rised_selectors`` (the per-environment
quota sampler and the reward-variance selector baselines), and the analyses of a run:
``rised_analysis`` (behaviour frequencies and half-lives) and ``rised_transfer`` /
``rised_transfer_stats`` (cross-environment transfer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rubric_rl.envs.base import DomainContract
from rubric_rl.methods.method import Method, register_method


def rised_controllers(config: Any, domain: DomainContract) -> list[Any]:
    """The per-environment quota sampler (over ``_rised_train``'s tasks) and the RISED
    controller (tagger, selection, anti-patterns, per-rollout teacher contexts)."""
    from rubric_rl.methods.grpo import task_sampler
    from rubric_rl.methods.rised.rised import RisedConfig, RisedController
    from rubric_rl.methods.rised.rised_tagger import (
        LLMTagger,
        ProgrammaticTagger,
        warmup_vocabulary,
    )
    from rubric_rl.rubrics.vocabulary import Vocabulary

    rc = RisedConfig.from_config(config)
    behaviours = domain.behaviours
    if rc.vocabulary:
        vocab = Vocabulary.load(rc.vocabulary)
    elif behaviours is not None and behaviours.warmup is not None:
        vocab = warmup_vocabulary(behaviours, int(config.domain.seed))
    else:
        raise ValueError(
            f"config.rised.vocabulary: the {domain.name!r} domain has no behaviours to warm a "
            "RISED vocabulary up on; give a vocabulary file (rubric_rl/rubrics/vocabulary.py "
            "format)"
        )
    if rc.tagger == "programmatic":
        if behaviours is None:
            raise ValueError(
                f"config.rised.tagger='programmatic' tags a domain by its behaviours "
                f"(Domain.behaviours), which {domain.name!r} lacks: use tagger='llm'"
            )
        conditioned = rc.tagging == "outcome"
        tagger = ProgrammaticTagger(behaviours, vocab, outcome_conditioned=conditioned)
    else:
        from rubric_rl.rubrics.llm import client_from_settings, role_max_failure_rate

        client = client_from_settings(config.rised.llm, config.judge.llm, where="judge.llm")
        tagger = LLMTagger(
            client, vocab, retry_candidates=rc.llm.retry_candidates,
            refresh_every=rc.llm.refresh_every,
            outcome_threshold=0.5 if rc.tagging == "outcome" else None,
            max_failure_rate=role_max_failure_rate(config),
        )  # fmt: skip
    # anti-patterns, teacher contexts and rubric descriptions in the domain's own style
    ctl = RisedController(rc, vocab, tagger, style=domain.style)
    return [*task_sampler(config, domain, _rised_train(rc, domain)), ctl]


def _rised_train(rc: Any, domain: DomainContract) -> list[Any]:
    """The training tasks RISED samples: all, or one environment's (``rised.train_environment``,
    the transfer analysis's single-environment runs; evaluation still covers every
    environment)."""
    from rubric_rl.loop.evaluation import env_of

    env = rc.train_environment.strip()
    if not env:
        return list(domain.train)
    kept = [t for t in domain.train if env_of(t) == env]
    if not kept:
        envs = sorted({env_of(t) for t in domain.train})
        raise ValueError(
            f"config.rised.train_environment={env!r}: no training task of that environment; "
            f"the training tasks' environments are {envs}"
        )
    return kept


def rised_pipeline(config: Any, controllers: Sequence[Any]) -> Any:
    """The default stages with a per-rollout teacher stage over the RISED controller (the last
    of ``rised_controllers``'): the rollout's top positive rubrics ∪ its group's."""
    from rubric_rl.methods.rised.rised import RisedController, teacher_stage
    from rubric_rl.step import default_pipeline

    controller = controllers[-1]
    if not isinstance(controller, RisedController):
        raise TypeError(
            f"the rised pipeline is built over rised_controllers' own list, whose last is the "
            f"RisedController; got {[type(c).__name__ for c in controllers]}"
        )
    return default_pipeline().replace("teacher", teacher_stage(controller))


def validate_rised(config: Any) -> None:
    """``config.rised`` builds a ``RisedConfig`` (unknown fields and refused values name it)."""
    from rubric_rl.methods.rised.rised import RisedConfig

    RisedConfig.from_config(config)


METHOD = register_method(
    Method(
        "rised",
        rised_controllers,
        pipeline=rised_pipeline,
        validate=validate_rised,
        analyses={
            "behaviours": "rubric_rl.methods.rised.rised_analysis:behaviour_frequencies",
            "transfer": "rubric_rl.methods.rised.rised_transfer:transfer_analysis",
        },
    )
)

__all__ = ["METHOD", "rised_controllers", "rised_pipeline", "validate_rised"]
