"""Registry of programmatic checkers for rule-verified criteria.

A checker is ``fn(response: str, *, task: Task | None, **args) -> bool``: True when the criterion
is met by the response (for a pitfall: the bad behaviour is present). A criterion names its
checker in ``Verifier.rule("name", **args)``; ``ProgrammaticJudge`` looks it up here. A checker
that raises is recorded by the judge as a failed verdict (``met=None``), never as "not met".
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rubric_rl.rubrics.types import Task
from rubric_rl.util.registry import Registry


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


_SIMPLE = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def argument_problem(fn: Callable[..., bool], args: Mapping[str, Any]) -> str | None:
    """What is wrong with calling checker ``fn`` with a criterion's ``args`` (None: nothing),
    found from its signature (a registration wrapper's ``__wrapped__`` function's): a missing
    or unexpected argument, or a value whose type is not its ``bool`` / ``int`` / ``float`` /
    ``str`` annotation (a bool is no number here). Other annotations are not checked."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]  # the response
    sig = sig.replace(parameters=[p for p in params if p.name != "task"])
    try:
        sig.bind(**args)
    except TypeError as e:
        return str(e)
    try:
        hints = typing.get_type_hints(inspect.unwrap(fn))
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is not checked
        return None
    for name, value in args.items():
        want = _SIMPLE.get(hints.get(name))
        if want is None:
            continue
        if (isinstance(value, bool) and bool not in want) or not isinstance(value, want):
            return (
                f"argument {name!r} is {type(value).__name__} {value!r}, expected "
                f"{hints[name].__name__}"
            )
    return None


def load_builtin_checkers() -> Registry[Callable[..., bool]]:
    """Import every module that registers built-in checkers, so that tasks reloaded from disk
    (whose criteria only name their checker) are judged without importing their env first."""
    for module in BUILTIN_CHECKER_MODULES:
        importlib.import_module(module)
    return CHECKERS
