"""The generator-domain interface of ARISE-RL's controller (``config.arise_rl.generator_domain``).

A generator domain is what the controller needs to run the generator role somewhere: generator-role
tasks (the role prompt with in-context negatives), the tool environment the generator's episodes
run in, the parse of an episode into a checkable solver task with its gates (R_fmt's reason,
R_tool's event), the task signature for deduplication, the evaluation tasks' forbidden signatures,
pool records for checkpoints, the generator coach's hints, and whether solver attempts are agent
episodes (``solver_agent``). Two implementations:

- ``"constraint"`` (:class:`ConstraintGeneratorDomain`, the default): the embedded constraint
  domain (``envs/generator_domain.py``; the solver answers in one turn);
- ``"sql"`` (``envs/sql_generator.SqlGeneratorDomain``): the SQL env's databases and read-only
  tools (``envs/sql_generator.py``; the solver's attempts are agent episodes in the SQL env).

The constraint implementation is exactly the calls the controller made before the interface
existed (tests/controllers/test_arise_rl.py, unchanged, checks it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from rubric_rl.methods.arise_rl.arise_rl_rewards import GeneratorOutcome
from rubric_rl.rubrics.types import Task

# ``Task.env_name`` of each domain's generator-role tasks (kept equal to the modules' constants;
# tested), so ``assign_roles`` needs no import of the domains.
GENERATOR_ENVS: dict[str, str] = {"constraint": "generator", "sql": "sql_generator"}
GENERATOR_DOMAINS: tuple[str, ...] = tuple(GENERATOR_ENVS)
# What a parsed constraint task's rubric holds (``generator_domain.parse_generated``):
# "library" — the listed criteria and every other library criterion the question implies (the
# task verifier's full requirement set), "as_written" — the listed ones only.
RUBRIC_COMPLETIONS: tuple[str, ...] = ("library", "as_written")

# The constraint domain's generator-coach hints (``arise_rl.generator_memory``). Every word is in
# the generator's vocabulary (the role prompt's and the domain's); tested.
GENERATOR_HINTS: dict[str, str] = {
    "format": (
        "write the question in <question> </question> and each rule in <criterion> </criterion> "
        ", all in <rubric> </rubric>"
    ),
    "tool": "first use the tool lookup to see the words of each category you use",
    "too_easy": "write a question with many requirements",
    "too_hard": "write a question with only one rule",
    # no failure in the group: its best episode's question, restated (``{question}``)
    "keep": "first use the tool lookup and write a question like <question> {question} </question>",
}


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


class ConstraintGeneratorDomain:
    """The embedded constraint domain's generator role (``envs/generator_domain.py``)."""

    name = "constraint"
    env_name = GENERATOR_ENVS["constraint"]
    solver_agent = False

    hints: Mapping[str, str] = GENERATOR_HINTS

    def __init__(self, rubric_completion: str = "library"):
        if rubric_completion not in RUBRIC_COMPLETIONS:
            raise ValueError(
                f"config.arise_rl.rubric_completion must be one of {RUBRIC_COMPLETIONS}, got "
                f"{rubric_completion!r}"
            )
        self.complete = rubric_completion == "library"

    def generator_tasks(
        self,
        rng: np.random.Generator,
        n: int,
        recent: Sequence[str],
        *,
        first_index: int,
        n_negatives: int,
    ) -> list[Task]:
        from rubric_rl.methods.arise_rl.generator_domain import GENERATOR_TASK_TYPES, generator_task

        types = rng.choice(len(GENERATOR_TASK_TYPES), size=n)
        return [
            generator_task(
                GENERATOR_TASK_TYPES[int(t)], recent, index=first_index + g,
                n_negatives=n_negatives,
            )
            for g, t in enumerate(types)
        ]  # fmt: skip

    def make_env(self, task: Task) -> Any:
        from rubric_rl.methods.arise_rl.generator_domain import GeneratorEnv

        return GeneratorEnv()

    def episode_outcome(self, response: str, *, forbidden: frozenset[str]):
        from rubric_rl.methods.arise_rl.generator_domain import episode_outcome

        return episode_outcome(response, forbidden=forbidden, complete=self.complete)

    def signature(self, task: Task) -> str:
        from rubric_rl.methods.arise_rl.generator_domain import task_signature

        params = (task.raw or {}).get("params")
        return task_signature(params) if params is not None else task.id

    def forbidden_signatures(self, tasks: Iterable[Task]) -> frozenset[str]:
        from rubric_rl.methods.arise_rl.generator_domain import forbidden_signatures

        return forbidden_signatures(tasks)

    def task_record(self, task: Task) -> dict[str, Any]:
        """A generated task by its answer text (re-parsed on load), a domain task by id."""
        if (task.raw or {}).get("split") == "generated":
            question = [m.content for m in task.prompt if m.role == "user"][-1]
            # the criteria the generator listed (those parsing added come back on re-parsing)
            listed = [c.text for c in task.rubric.criteria if c.origin != "implied"]
            return {"question": question, "criteria": listed}
        return {"id": task.id}

    def task_from_record(self, rec: Mapping[str, Any], forbidden: frozenset[str]) -> Task | None:
        from rubric_rl.methods.arise_rl.generator_domain import format_generated, parse_generated

        if "id" in rec:
            return None
        parsed = parse_generated(
            format_generated(rec["question"], rec["criteria"]), forbidden=forbidden,
            complete=self.complete,
        )  # fmt: skip
        if parsed.task is None:
            raise ValueError(
                f"arise_rl state: pool task {rec['question']!r} no longer parses ({parsed.reason})"
            )
        return parsed.task


def build_generator_domain(
    name: str, train_tasks: Sequence[Task] = (), *, rubric_completion: str = "library"
) -> GeneratorDomain:
    """The generator domain ``name`` (``config.arise_rl.generator_domain``); ``"sql"`` writes
    tasks about the databases of ``train_tasks`` (the solver domain's training split; ours).
    ``rubric_completion`` applies to the constraint domain (an SQL task's rubric items are
    checks the generator grounded itself; it has no library to complete from)."""
    if name == "constraint":
        return ConstraintGeneratorDomain(rubric_completion)
    if name == "sql":
        from rubric_rl.methods.arise_rl.sql_generator import SqlGeneratorDomain

        if not any("db_seed" in (t.raw or {}) for t in train_tasks):
            raise ValueError(
                "config.arise_rl.generator_domain='sql' needs the SQL domain's training tasks "
                "(their databases), got none with a db seed; set config.domain.name='sql'"
            )
        return SqlGeneratorDomain.from_tasks(train_tasks)
    raise ValueError(
        f"config.arise_rl.generator_domain must be one of {GENERATOR_DOMAINS}, got {name!r}"
    )


__all__ = [
    "GENERATOR_DOMAINS",
    "GENERATOR_HINTS",
    "GENERATOR_ENVS",
    "RUBRIC_COMPLETIONS",
    "ConstraintGeneratorDomain",
    "GeneratorDomain",
    "build_generator_domain",
]
