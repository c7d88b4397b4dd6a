"""What a method is to the rest of the package, and the registry that finds one by
``config.method``.

A method lives in a room, ``rubric_rl/methods/<name>/``, whose ``__init__`` registers one
:class:`Method`. The loop, the builders and the config checks know methods only through it:

- ``validate(config)``: the start-up checks of the method's own config section (run after the
  shared checks, before any model is built); typically ``Section.from_config(config)`` of the
  room's frozen section dataclass, which holds the one default of each field and checks itself;
- ``controllers(config, domain)``: the method's controllers for a run; the first one draws the
  step's tasks (the sampler);
- ``pipeline(config, controllers)``: the step pipeline (``rubric_rl.step``) over those same
  controller objects: a stage that needs its controller closes over it, never looks it up;
- ``analyses``: the method's analyses of a run directory, ``name -> "module:function"``
  (``Method.analysis(name)`` imports it; each function's first argument is the run directory).

Adding a method is one room plus one config file (``configs/<name>.py`` setting ``method``); the
room registers itself with :func:`register_method`. The built-in rooms are imported on first use
(``BUILTIN``), so naming a method never imports the others.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rubric_rl.controllers.base import Controller
    from rubric_rl.step import Pipeline

# config.method -> the room that registers it (imported when the name is first asked for).
BUILTIN: Mapping[str, str] = {
    "grpo": "rubric_rl.methods.grpo",
    "arise": "rubric_rl.methods.arise",
    "harness_rl": "rubric_rl.methods.harness_rl",
    "rised": "rubric_rl.methods.rised",
    "arise_rl": "rubric_rl.methods.arise_rl",
}


# The method of a config without ``config.method`` (the base config, a script's own config).
DEFAULT_METHOD = "grpo"


def method_of(config: Any) -> str:
    """The name of the method ``config`` runs: ``config.method``, else ``DEFAULT_METHOD``."""
    return str(config.get("method", DEFAULT_METHOD))


def default_pipeline(config: Any, controllers: Sequence[Controller]) -> Pipeline:
    """The default stages (``step.DEFAULT_STAGES``): the controllers act through their hooks."""
    from rubric_rl.step import default_pipeline as stages

    return stages()


def no_checks(config: Any) -> None:
    """A method without a config section of its own."""


@dataclasses.dataclass(frozen=True)
class Method:
    """One training method, as the loop, builders and config checks see it."""

    name: str
    controllers: Callable[[Any, Any], list[Controller]]
    pipeline: Callable[[Any, Sequence[Controller]], Pipeline] = default_pipeline
    validate: Callable[[Any], None] = no_checks
    analyses: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"Method.name must be an identifier, got {self.name!r}")
        for name, target in self.analyses.items():
            if target.count(":") != 1 or not all(target.split(":")):
                raise ValueError(
                    f"method {self.name!r}: analysis {name!r} must be 'module:function', "
                    f"got {target!r}"
                )

    def analysis(self, name: str) -> Callable[..., Any]:
        """The analysis ``name`` of this method (its function, imported)."""
        if name not in self.analyses:
            raise ValueError(
                f"method {self.name!r} has no analysis {name!r}; it has {sorted(self.analyses)}"
            )
        module, function = self.analyses[name].split(":")
        return getattr(importlib.import_module(module), function)


def from_section(cls: type, config: Any, name: str, **fixed: Any) -> Any:
    """``cls(**fixed, **config.<name>)``: a section built by its frozen dataclass, which holds the
    one default of each field and checks itself; an unknown or missing field, or a value its
    checks refuse, is an error naming the section."""
    try:
        return cls(**fixed, **dict(config.get(name, {})))
    except TypeError as e:
        raise ValueError(f"config.{name}: {e}") from e


def complete_section(
    cls: type,
    config: Any,
    name: str,
    *,
    fixed: Mapping[str, Any] | None = None,
    absent: Mapping[str, Any] | None = None,
) -> Any:
    """``cls(**config.<name>)`` for a section that holds every field of ``cls`` (a config file
    builds it from ``section_defaults(cls)``): a missing or unknown field, or a value not of its
    default's type (an int is a float too; a tuple may be a list, its items of the default's
    items' type), is an error naming ``config.<name>.<field>`` before ``cls``'s own checks run.
    A field whose default is a dataclass is a nested section, checked the same way. ``fixed``:
    fields set from other sections (not in this one); ``absent``: what a top-level key missing
    from an archived config means (the behaviour the code had before the key existed)."""
    section = config.get(name)
    if section is None:
        raise ValueError(f"config.{name}: the section is missing")
    return _complete(cls, section, f"config.{name}", fixed or {}, absent or {})


def _complete(
    cls: type,
    section: Any,
    where: str,
    fixed: Mapping[str, Any] | None = None,
    absent: Mapping[str, Any] | None = None,
) -> Any:
    if not hasattr(section, "keys"):
        raise ValueError(f"{where} must be a section (a dict), got {section!r}")
    fixed = fixed or {}
    given = {
        **(absent or {}),
        **dict(section.to_dict() if hasattr(section, "to_dict") else section),
    }
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in fixed}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known {sorted(fields)}")
    missing = sorted(set(fields) - set(given))
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    for key, f in fields.items():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            given[key] = _complete(type(default), given[key], f"{where}.{key}")
        else:
            given[key] = _typed(default, given[key], f"{where}.{key}")
    return cls(**fixed, **given)


def _typed(default: Any, value: Any, where: str) -> Any:
    """``value`` as of ``default``'s type (see ``complete_section``), else an error naming it."""
    if default is None:
        return value  # no type to hold it to
    if isinstance(default, tuple) and isinstance(value, (tuple, list)):
        if not default:
            return tuple(value)
        return tuple(_typed(default[0], x, f"{where}[{i}]") for i, x in enumerate(value))
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        number = (int,) if isinstance(default, int) else (int, float)
        ok = isinstance(value, number) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ValueError(
            f"{where} must be of type {type(default).__name__} (its default is {default!r}), "
            f"got {value!r} ({type(value).__name__})"
        )
    return float(value) if isinstance(default, float) else value


def default_of(owner: Any, name: str) -> Any:
    """The default of ``owner``'s field or keyword parameter ``name`` (a dataclass field, or a
    parameter of a class's ``__init__`` / a function): a config section's field that feeds it
    takes its default from here, so each default has one source. An error when it has none."""
    if dataclasses.is_dataclass(owner):
        for f in dataclasses.fields(owner):
            if f.name == name:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
                break
        raise TypeError(f"default_of: {owner.__name__}.{name} has no default")
    target = owner.__init__ if isinstance(owner, type) else owner
    param = inspect.signature(target).parameters.get(name)
    if param is None or param.default is inspect.Parameter.empty:
        raise TypeError(f"default_of: {getattr(owner, '__name__', owner)}({name}=) has no default")
    return param.default


def section_defaults(cls: type, *fixed: str) -> dict[str, Any]:
    """The defaults of ``cls``'s fields less ``fixed`` (those set from other sections), as a
    config file starts the section from (a nested dataclass as a dict). Read from the fields,
    not from an instance: the checks may need the fixed fields (RISED's k)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in fixed:
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise ValueError(f"{cls.__name__}.{f.name} has no default")
        out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Make ``method`` the one ``config.method == method.name`` runs; a name is registered once."""
    old = _METHODS.get(method.name)
    if old is not None and old is not method:
        raise ValueError(f"method {method.name!r} is already registered")
    _METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The method registered as ``name`` (a built-in room is imported on first use)."""
    if name not in _METHODS and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in _METHODS:
        raise ValueError(f"config.method={name!r}: unknown method; known: {method_names()}")
    return _METHODS[name]


def method_names() -> list[str]:
    """Every method that can be named: the built-in rooms and those registered since."""
    return sorted({*BUILTIN, *_METHODS})


__all__ = [
    "BUILTIN",
    "DEFAULT_METHOD",
    "Method",
    "default_pipeline",
    "complete_section",
    "from_section",
    "get_method",
    "method_names",
    "method_of",
    "no_checks",
    "register_method",
    "section_defaults",
]
