"""Registry of programmatic checkers for rule-verified criteria.

A checker is ``fn(response: str, *, task: Task | None, **args) -> bool``: True when the criterion
is met by the response (for a pitfall: the bad behaviour is present). A criterion names its
checker in ``Verifier.rule("name", **args)``; ``ProgrammaticJudge`` looks it up here. A checker
that raises is recorded by the judge as a failed verdict (``met=None``), never as "not met".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from rubric_rl.registry import Registry
from rubric_rl.rubrics.types import Task


class Checker(Protocol):
    def __call__(self, response: str, *, task: Task | None = None, **args: Any) -> bool: ...


CHECKERS: Registry[Callable[..., bool]] = Registry("checker")
register = CHECKERS.register
get = CHECKERS.get

# Modules whose import registers the built-in checkers (the embedded domain and the tool envs).
BUILTIN_CHECKER_MODULES = (
    "rubric_rl.envs.constraint_checkers",
    "rubric_rl.envs.instruct_checkers",
    "rubric_rl.envs.trajectory",
    "rubric_rl.envs.sql",
    "rubric_rl.envs.inventory",
)


def load_builtin_checkers() -> Registry[Callable[..., bool]]:
    """Import every module that registers built-in checkers, so that tasks reloaded from disk
    (whose criteria only name their checker) are judged without importing their env first."""
    for module in BUILTIN_CHECKER_MODULES:
        importlib.import_module(module)
    return CHECKERS
