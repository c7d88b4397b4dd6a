"""``config.harness`` -> the HarnessRL controller (the harness_rl ``Method``'s controllers)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from rubric_rl.envs.base import DomainContract
from rubric_rl.methods.harness_rl.controller import HarnessConfig, HarnessController
from rubric_rl.methods.harness_rl.section import HarnessSection
from rubric_rl.methods.harness_rl.style import style_for


def harness_config(config: Any) -> HarnessConfig:
    """``config.harness`` (read by ``HarnessSection.from_config``, the one default of each field)
    with the run's steps, batch, group size and seed, as the controller's ``HarnessConfig``."""
    if str(config.loss.reward) != "weighted":
        # The harness's critic and attributor read the trained rubric reward under c_t.
        raise ValueError(
            f"config.loss.reward={config.loss.reward!r}: HarnessRL trains its weighted rubric "
            "reward (r = Σλs / Σmax(λ, 0) under the harness rubric); set it to 'weighted'"
        )
    h = HarnessSection.from_config(config)
    cs = h.cold_start
    try:
        return HarnessConfig(
            total_steps=int(config.train.steps),
            batch_size=int(config.rollout.tasks_per_step),
            samples_per_task=int(config.rollout.samples_per_task),
            seed=int(config.train.seed),
            levels=h.levels,
            rollout_band=h.rollout_band,
            rubric_band=h.rubric_band,
            total_weight=h.total_weight,
            interfaces=h.interfaces,
            critic=h.critic,
            memory=h.memory,
            anchors=h.anchors,
            retry_after=h.retry_after,
            max_rollout_measurements=h.max_rollout_measurements,
            cold_start_tasks=cs.tasks,
            cold_start_groups=cs.groups,
            cold_start_regradings=cs.regradings,
            deterministic_floor=cs.deterministic_floor,
            band_floor=cs.band_floor,
            recalibrate=h.recalibrate,
            measurement=h.measurement,
            paired_samples=h.paired_samples,
            in_step_rounds=h.in_step_rounds,
            attributor=h.attributor,
            sampling_rule=h.sampling_rule,
            rollout_rule=h.rollout_rule,
            rubric_rule=h.rubric_rule,
            sec=h.sec,
            evolver=h.evolver,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.harness: {e}") from e


def cold_start_key(config: Any) -> str:
    """What the cold start depends on: the warm start (its cache key), the judge, the sampling
    and the cold start's own settings."""
    from rubric_rl.pre_rl.warmstart import cache_key

    blob = json.dumps(
        {
            "warmstart": cache_key(config),
            "judge": config.judge.to_dict(),
            "rollout": {k: v for k, v in config.rollout.to_dict().items() if k != "sglang"},
            "domain": config.domain.to_dict(),
            "cold_start": {k: v for k, v in config.harness.cold_start.to_dict().items()
                           if k != "cache_dir"},
            "seed": int(config.train.seed),
            "task_bank": int(config.harness.task_bank),
            "measurement": str(config.harness.measurement),
            "paired_samples": int(config.harness.paired_samples),
        },
        sort_keys=True,
        default=str,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def evolver_client(config: Any):
    """The LLM client of ``harness.evolver="llm"`` (``harness.llm``; empty fields fall back to
    ``judge.llm``), else None."""
    h = config.harness
    if str(h.evolver) != "llm":
        return None
    from rubric_rl.rubrics.llm import client_from_settings

    llm, judge = h.llm, config.judge.llm
    if not (llm.backend or judge.backend) or not (llm.model or judge.model):
        raise ValueError(
            "harness.evolver='llm': set harness.llm.backend and harness.llm.model (or "
            "judge.llm.backend / judge.llm.model)"
        )
    return client_from_settings(llm, judge)


def task_bank(tasks, size: int, seed: int) -> tuple:
    """The training tasks the harness draws from: all of them (``size`` 0), else a seeded
    sample of ``size``, in the split's order. A smaller bank makes tasks recur (each is drawn
    about steps × tasks per step / size times), which the memory, saturation, persistence and
    reversal logic need; the protocol's choice is the whole split."""
    size = int(size)
    if size < 0:
        raise ValueError(f"harness.task_bank={size}: must be >= 0 (0 = the whole split)")
    if size == 0 or size >= len(tasks):
        return tuple(tasks)
    rng = np.random.default_rng([int(seed), 11])
    return tuple(tasks[i] for i in sorted(rng.choice(len(tasks), size, replace=False)))


def make_harness_controller(
    config: Any, domain: DomainContract, llm_client=None
) -> HarnessController:
    h = config.harness
    floor = float(h.floor)
    client = llm_client if llm_client is not None else evolver_client(config)
    limit = {}
    if client is not None:
        from rubric_rl.rubrics.llm import role_max_failure_rate

        limit["llm_max_failure_rate"] = role_max_failure_rate(config)
    return HarnessController(
        task_bank(domain.train, int(h.task_bank), int(config.train.seed)),
        harness_config(config),
        style_for(domain),
        embedder_spec=str(h.embedder),
        memory_floor=None if floor < -1.0 + 1e-12 else floor,
        memory_top_k=int(h.top_k),
        cache_key=cold_start_key(config),
        cache_dir=str(h.cold_start.cache_dir) or None,
        llm_client=client,
        **limit,
    )


__all__ = [
    "cold_start_key",
    "evolver_client",
    "harness_config",
    "make_harness_controller",
    "task_bank",
]
