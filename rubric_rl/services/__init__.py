"""``Services``: what stages and controllers may call during a step (DESIGN §3) — a
``sampler.Sampler`` (generation, agent episodes, seed streams, held policies) and a
``grader.Grader`` (judges and the verdict cache) behind one object that times each caller.

Every controller and stage gets one when it is built (``Services.for_caller(name)`` gives it a
view whose time is logged as ``time/services/<name>``), together with the run directory. The
calls are the sampler's and the grader's, documented there:

- ``generate`` / ``run_agent`` / ``rollouts``: samples on the policy the engine serves now (the
  current policy, before this step's update) or on a held policy, seeded per stream;
- ``hold_policy`` / ``held_step`` / ``release_policy``: second parameter sets, checkpointed;
- ``judge(tasks, responses, criteria=None, fresh=False)``: verdicts through the verdict cache;
  ``task_verifier``: the domain's pass/fail verifier;
- ``encode_prompt`` / ``decode`` / ``prompt_len`` / ``sampling_params`` / ``tokenizer``.

Engine and judge failures are retried (``rollout.retries``, ``judge.retries``) and then raised as
``ComponentError`` naming the component. The domain's oracle is not a service: no controller sees
it (``rubric_rl/analysis/pair_failures.py`` reads it for analysis only).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rubric_rl.rollout.batch import Messages, Trajectory
from rubric_rl.rollout.engine import SamplingParams
from rubric_rl.rubrics.types import Criterion, Rubric, Task, Verdict
from rubric_rl.services.grader import ComponentError, Grader, VerdictCache
from rubric_rl.services.sampler import TRAIN_STREAM, Sampler, stream_base, with_prompt

Samples = tuple[list[tuple[int, ...]], list[list[Trajectory]]]


class Services:
    """The step's services over one engine, tokenizer, judge and domain (module docstring).
    ``sampler`` and ``grader`` are shared by every caller's view."""

    def __init__(self, config, engine, tokenizer, judge, domain, workdir: str, prompt_buckets):
        self.config, self.domain, self.workdir = config, domain, workdir
        self.sampler = Sampler(config, engine, tokenizer, domain, prompt_buckets)
        self.grader = Grader(config, judge, domain)
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self._caller = "trainer"

    # --- callers and time ------------------------------------------------------------------

    def for_caller(self, name: str) -> Services:
        """A view of these services whose time is logged as ``time/services/<name>``."""
        view = object.__new__(Services)
        view.__dict__.update(self.__dict__)
        view._caller = name
        return view

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[self._caller] += time.perf_counter() - t0

    def pop_seconds(self) -> dict[str, float]:
        out = dict(self.seconds)
        self.seconds.clear()
        return out

    @property
    def step(self) -> int:
        """The step being produced (its rollouts are sampled with the weights of step - 1)."""
        return self.sampler.step

    def begin_step(self, step: int) -> None:
        self.sampler.begin_step(step)

    @property
    def engine(self) -> Any:
        return self.sampler.engine

    @property
    def tokenizer(self) -> Any:
        return self.sampler.tokenizer

    @property
    def judge_impl(self) -> Any:
        return self.grader.judge_impl

    @property
    def cache(self) -> VerdictCache:
        return self.grader.cache

    # --- sampling ----------------------------------------------------------------------------

    def rollout_mode(self) -> str:
        return self.sampler.rollout_mode()

    def is_episode(self, task: Task) -> bool:
        return self.sampler.is_episode(task)

    def rollouts(self, tasks: Sequence[Task], n: int, **kw: Any) -> Samples:
        with self._timed():
            return self.sampler.rollouts(tasks, n, **kw)

    def generate(self, prompts: Sequence[Messages], n: int, **kw: Any) -> Samples:
        with self._timed():
            return self.sampler.generate(prompts, n, **kw)

    def run_agent(self, tasks: Sequence[Task], n: int, **kw: Any) -> Samples:
        with self._timed():
            return self.sampler.run_agent(tasks, n, **kw)

    def encode_prompt(
        self, messages: Messages, what: str = "prompt", field: str = "max_prompt_len"
    ) -> tuple[int, ...]:
        return self.sampler.encode_prompt(messages, what, field)

    def decode(self, ids: Sequence[int]) -> str:
        return self.sampler.decode(ids)

    def prompt_len(self, lengths: Sequence[int], field: str = "max_prompt_len") -> int:
        return self.sampler.prompt_len(lengths, field)

    def sampling_params(self, n: int, **overrides: Any) -> SamplingParams:
        return self.sampler.sampling_params(n, **overrides)

    def hold_policy(self, name: str) -> None:
        self.sampler.hold_policy(name)

    def held_step(self, name: str) -> int | None:
        return self.sampler.held_step(name)

    def release_policy(self, name: str) -> None:
        self.sampler.release_policy(name)

    # --- grading -----------------------------------------------------------------------------

    def judge(
        self,
        tasks: Sequence[Task],
        responses: Sequence[Sequence[str]],
        criteria: Sequence[Sequence[Criterion] | Rubric | None] | None = None,
        *,
        fresh: bool = False,
        check_failure_rate: bool = True,
    ) -> list[list[list[Verdict]]]:
        with self._timed():
            return self.grader.judge(
                tasks, responses, criteria, fresh=fresh, check_failure_rate=check_failure_rate
            )

    def task_verifier(self, task: Task, response: str) -> float:
        return self.grader.task_verifier(task, response)


__all__ = [
    "TRAIN_STREAM",
    "ComponentError",
    "Services",
    "VerdictCache",
    "stream_base",
    "with_prompt",
]
