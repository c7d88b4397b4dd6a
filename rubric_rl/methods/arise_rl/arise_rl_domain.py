"""The generator-domain interface of ARISE-RL's controller (``config.arise_rl.generator_domain``).

A generator domain is what the controller needs to run the generator role somewhere: generator-role
tasks (the role prompt with in-context negatives), the tool environment the generator's episodes
run in, the parse of an episode into a checkable solver task with its gates (R_fmt's reason,
R_tool's event), the task signature for deduplication, the evaluation tasks' forbidden signatures,
pool records for checkpoints, the generator coach's hints, and whether solver attempts are agent
episodes (``solver_agent``).

The domain's part is its task writer (``Domain.task_writer``, a ``TaskWriter`` of
``rubric_rl/envs/base.py``: the embedded constraint domain's ``envs/constraint_writer.py``, the
SQL env's ``envs/sql_writer.py``); the method's part is R_tool's event (``tool_observed``), given
to the writer, and the gates' input (``GeneratorOutcome``), made here from the writer's parse
(:class:`GeneratorRole`). A new domain provides a task writer; nothing here names a domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from rubric_rl.envs.base import TaskWriter
from rubric_rl.methods.arise_rl.arise_rl_rewards import GeneratorOutcome, tool_observed
from rubric_rl.rubrics.types import Task

# What a parsed task's rubric holds (the constraint writer's ``parse_generated``): "library" —
# the listed criteria and every other library criterion the question implies (the task
# verifier's full requirement set), "as_written" — the listed ones only.
RUBRIC_COMPLETIONS: tuple[str, ...] = ("library", "as_written")


class ParsedTask(Protocol):
    """What a domain's parse returns: the task (None when R_fmt = 0), the question, the listed
    criteria dropped for naming no check (``num_unknown``)."""

    task: Task | None
    question: str
    num_unknown: int


class GeneratorDomain(Protocol):
    """See the module docstring."""

    name: str
    env_name: str  # Task.env_name of its generator-role tasks
    solver_agent: bool  # solver attempts / probes / memory rollouts are agent episodes
    hints: Mapping[str, str]  # the generator coach's hints: format, tool, too_easy, too_hard

    def generator_tasks(
        self,
        rng: np.random.Generator,
        n: int,
        recent: Sequence[str],
        *,
        first_index: int,
        n_negatives: int,
    ) -> list[Task]: ...

    def make_env(self, task: Task) -> Any: ...

    def episode_outcome(
        self, response: str, *, forbidden: frozenset[str]
    ) -> tuple[ParsedTask, GeneratorOutcome]: ...

    def signature(self, task: Task) -> str: ...

    def forbidden_signatures(self, tasks: Iterable[Task]) -> frozenset[str]: ...

    def task_record(self, task: Task) -> dict[str, Any]: ...

    def task_from_record(
        self, rec: Mapping[str, Any], forbidden: frozenset[str]
    ) -> Task | None: ...  # None: a domain task's record ({"id": …}), resolved by the controller


def gate_outcome(parsed: Any, tool_seen: bool) -> GeneratorOutcome:
    """The R_fmt / R_tool gates' input of a writer's parse (``TaskWriter.episode_outcome``)."""
    num_criteria = 0 if parsed.task is None else len(parsed.task.rubric.criteria)
    return GeneratorOutcome(parsed.question, num_criteria, tool_seen, parsed.reason)


class GeneratorRole:
    """A domain's task writer as the controller's generator domain: the writer's parts as they
    are, and each episode's parse with the gates' input (``GeneratorOutcome``: the question, the
    parsed criteria, R_tool's event as the writer judged it with ``tool_observed``, R_fmt's
    reason)."""

    def __init__(self, writer: TaskWriter):
        self.writer = writer
        self.name = writer.name
        self.env_name = writer.env_name
        self.solver_agent = bool(writer.solver_agent)
        self.hints = writer.hints

    def generator_tasks(self, rng, n, recent, *, first_index, n_negatives) -> list[Task]:
        return self.writer.generator_tasks(
            rng, n, recent, first_index=first_index, n_negatives=n_negatives
        )

    def make_env(self, task: Task) -> Any:
        return self.writer.make_env(task)

    def episode_outcome(self, response: str, *, forbidden: frozenset[str] = frozenset()):
        parsed, seen = self.writer.episode_outcome(response, forbidden=forbidden)
        return parsed, gate_outcome(parsed, seen)

    def signature(self, task: Task) -> str:
        return self.writer.signature(task)

    def forbidden_signatures(self, tasks: Iterable[Task]) -> frozenset[str]:
        return self.writer.forbidden_signatures(tasks)

    def task_record(self, task: Task) -> dict[str, Any]:
        return self.writer.task_record(task)

    def task_from_record(self, rec: Mapping[str, Any], forbidden: frozenset[str]) -> Task | None:
        return self.writer.task_from_record(rec, forbidden)


def build_generator_domain(
    name: str, domain: Any, *, rubric_completion: str = "library"
) -> GeneratorDomain:
    """The generator domain ``name`` (``config.arise_rl.generator_domain``): ``domain``'s task
    writer (``Domain.task_writer``), given R_tool's event, which must be the writer ``name``
    names (the embedded domain's "constraint", the SQL env's "sql", a new domain's own);
    ``rubric_completion`` as ``RUBRIC_COMPLETIONS`` says (a writer without a library to complete
    from ignores it)."""
    if rubric_completion not in RUBRIC_COMPLETIONS:
        raise ValueError(
            f"config.arise_rl.rubric_completion must be one of {RUBRIC_COMPLETIONS}, got "
            f"{rubric_completion!r}"
        )
    make = getattr(domain, "task_writer", None)
    if make is None:
        raise ValueError(
            f"config.arise_rl.generator_domain={name!r}: the {getattr(domain, 'name', '?')!r} "
            "domain has no task writer (Domain.task_writer)"
        )
    writer = make(observed=tool_observed, complete=rubric_completion == "library")
    if writer.name != name:
        raise ValueError(
            f"config.arise_rl.generator_domain={name!r} writes tasks of another domain: the "
            f"{domain.name!r} domain's task writer is {writer.name!r}"
        )
    return GeneratorRole(writer)


__all__ = [
    "RUBRIC_COMPLETIONS",
    "GeneratorDomain",
    "GeneratorRole",
    "build_generator_domain",
    "gate_outcome",
]
