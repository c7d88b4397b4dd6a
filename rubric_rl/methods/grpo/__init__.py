"""GRPO on the seed rubrics (``configs/grpo.py``), and the baselines that are GRPO plus one
controller: a sampler from ``SAMPLERS`` (``controllers.sampler``; SEC's bandit is ``"sec"``),
RuscaRL's scaffold (``config.ruscarl``), SkillRL's skill bank (``config.skillrl``) and RISED's
reward-variance selectors (``config.variance_select``), each when the config has its section.
Those controllers live in the room of the method they are a baseline of (HarnessRL, RISED)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rubric_rl.envs.base import DomainContract
from rubric_rl.methods.method import Method, from_section, register_method


def task_sampler(
    config: Any, domain: DomainContract, train: Sequence[Any] | None = None
) -> list[Any]:
    """The step's sampler over ``train`` (default: the domain's training tasks), chosen by
    ``controllers.sampler``."""
    from rubric_rl.controllers.sampling import SAMPLERS
    from rubric_rl.methods.rised import rised_selectors  # noqa: F401  (registers "env_quota")

    train = list(domain.train if train is None else train)
    if config.controllers.sampler == "sec":
        from rubric_rl.methods.harness_rl.sec import SECConfig, SECSampler

        sec = from_section(SECConfig, config, "sec")
        batch, seed = int(config.rollout.tasks_per_step), int(config.train.seed)
        return [SECSampler(train, batch, seed=seed, config=sec)]
    sampler_cls = SAMPLERS.get(config.controllers.sampler)
    return [sampler_cls(train, int(config.rollout.tasks_per_step), seed=int(config.train.seed))]


def grpo_controllers(config: Any, domain: DomainContract) -> list[Any]:
    """Static seed rubrics, a sampler from SAMPLERS (``config.controllers.sampler``), and
    RuscaRL's scaffold / SkillRL's skills / a variance selector when the config has a
    ``ruscarl`` / ``skillrl`` / ``variance_select`` section."""
    from rubric_rl.methods.harness_rl.ruscarl import ruscarl_controllers
    from rubric_rl.methods.harness_rl.skillrl import skillrl_controllers
    from rubric_rl.methods.rised.rised_selectors import variance_select_controllers

    extra = [*ruscarl_controllers(config, domain), *skillrl_controllers(config, domain)]
    return [*task_sampler(config, domain), *extra, *variance_select_controllers(config)]


def validate_grpo(config: Any) -> None:
    """``controllers.sampler`` is a ``SAMPLERS`` name; a plain-text dataset (no rubrics) is
    trained on a reward function, not on the rubric it does not have."""
    from rubric_rl.controllers.sampling import SAMPLERS
    from rubric_rl.methods.arise import capability_sampler  # noqa: F401  (registers theirs)
    from rubric_rl.methods.harness_rl import sec  # noqa: F401
    from rubric_rl.methods.rised import rised_selectors  # noqa: F401

    controllers = config.get("controllers")
    if controllers is not None and controllers.get("sampler") not in SAMPLERS.names():
        raise ValueError(
            f"config.controllers.sampler: must be one of {list(SAMPLERS.names())}, got "
            f"{controllers.get('sampler')!r}"
        )
    _check_plain_dataset(config)


def _check_plain_dataset(config: Any) -> None:
    """GRPO trains the tasks' own (seed) rubrics: the dataset domain's ``plain`` format has none,
    so such a run must train a reward function (another method may bring rubrics of its own)."""
    from rubric_rl.rubrics.rewards import REWARDS

    ds = config.domain.get("dataset")
    if config.domain.name != "dataset" or ds is None or ds.format != "plain":
        return
    lo = config.loss
    mix = dict(lo.get("reward_weights") or {})
    if not ("rubric" in mix if mix else lo.reward in REWARDS.names()):
        return
    fns = list(config.get("reward_fns") or {})
    field = "loss.reward_weights.rubric" if mix else "loss.reward"
    raise ValueError(
        f"config.{field}: trains the rubric, but domain.dataset.format='plain' tasks have none; "
        f"train a reward function (config.reward_fns: {fns}) through loss.reward or "
        "loss.reward_weights"
    )


METHOD = register_method(Method("grpo", grpo_controllers, validate=validate_grpo))

__all__ = ["METHOD", "grpo_controllers", "task_sampler", "validate_grpo"]
