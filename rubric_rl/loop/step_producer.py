"""Everything of a step before its update: the method's pipeline run on the engine with the
step's random stream, synchronously or (``rollout.max_staleness`` = k > 0) up to k steps ahead
of the update on the schedule of ``async_rollouts``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from rubric_rl.loop import async_rollouts
from rubric_rl.loop.async_rollouts import Weights
from rubric_rl.loop.weight_serving import WeightServer, copy_weights
from rubric_rl.step import Pipeline, StepContext


@dataclasses.dataclass
class Produced:
    """One step's pipeline result with what it measured while it ran."""

    rollouts: Any
    ctx: StepContext
    controller_seconds: float
    service_seconds: dict[str, float]
    events: Mapping[str, Any]
    weight_version: int
    seconds: float


class StepProducer:
    """Runs step pipelines. ``rng`` is the run's JAX key (checkpointed): each pipeline splits
    off its step's key, from which the stages' numpy Generator is seeded, so a step's random
    stream depends on the saved key only. ``pipeline`` may be replaced before the first step."""

    def __init__(
        self, config: Any, pipeline: Pipeline, services: Any, controllers: Any, domain: Any,
        reward_fns: Mapping[str, Any], weights: WeightServer,
    ):  # fmt: skip
        self.config, self.pipeline, self.services = config, pipeline, services
        self.controllers, self.domain, self.reward_fns = controllers, domain, reward_fns
        self.weights = weights
        self.rng = jax.random.key(int(config.train.seed))
        self.max_staleness = int(config.rollout.max_staleness)
        self.prefetch = async_rollouts.Prefetcher(
            self.produce, overlap=bool(config.rollout.async_overlap)
        )

    def produce(self, step: int, weights: Weights | None = None) -> Produced:
        """Step ``step``'s pipeline on the engine; with ``weights`` (asynchronous rollouts) the
        engine serves that copy first. Runs on the prefetch thread when rollouts overlap the
        update: it touches the engine, the services, the controllers and the key, which nothing
        on the trainer's thread uses meanwhile."""
        t0 = time.perf_counter()
        if weights is not None:
            self.weights.serve(weights)
        self.rng, key = jax.random.split(self.rng)
        np_rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).tolist())
        self.controllers.pop_seconds()
        self.services.pop_seconds()
        self.services.begin_step(step)
        ctx = StepContext(
            step, self.config, np_rng, self.services, self.controllers, self.domain,
            reward_fns=self.reward_fns,
        )  # fmt: skip
        rollouts = self.pipeline(ctx)
        return Produced(
            rollouts=rollouts,
            ctx=ctx,
            controller_seconds=self.controllers.pop_seconds(),
            service_seconds=self.services.pop_seconds(),
            events=self.controllers.pop_events(),
            weight_version=int(self.weights.engine.weight_version),
            seconds=time.perf_counter() - t0,
        )

    def rollouts_for(self, step: int, state: Any) -> tuple[Produced, float]:
        """Step ``step``'s pipeline result and the seconds the trainer waited for it; with
        k > 0, first starts the pipelines up to k steps ahead, sampling with a copy of ``state``
        (the live train state, version ``step - 1``)."""
        k = self.max_staleness
        if k == 0:
            return self.produce(step), 0.0
        t0 = time.perf_counter()
        p = self.prefetch.take(step) if self.prefetch.has(step) else self.produce(step)
        waited = time.perf_counter() - t0
        ahead = async_rollouts.prefetch_steps(
            step, k, async_rollouts.next_sync_point(self.config, step), self.prefetch.submitted
        )
        if ahead:
            weights = copy_weights(state, step - 1)  # version step - 1 = w(s) for every s ahead
            for s in ahead:
                self.prefetch.submit(s, weights)
        return p, waited
