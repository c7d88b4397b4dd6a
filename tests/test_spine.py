"""The spine's shape: ``trainer.py`` holds the loop only; its parts (step callbacks, non-finite
reporting, the step producer and its asynchronous schedule, weight serving, the run state,
policy loading for analyses) live in modules of their own."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, "rubric_rl", "trainer.py")
TRAINER_MAX_LINES = 350


def test_trainer_py_holds_the_loop_within_its_line_budget():
    with open(TRAINER) as f:
        n = len(f.read().splitlines())
    assert n <= TRAINER_MAX_LINES, (
        f"rubric_rl/trainer.py: {n} lines, over {TRAINER_MAX_LINES}; move what is not the loop "
        "into a module of its own"
    )


def test_the_loops_parts_are_defined_outside_trainer_py():
    with open(TRAINER) as f:
        tree = ast.parse(f.read())
    defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    assert defined == {"Trainer"}, f"trainer.py defines more than the loop: {sorted(defined)}"
    from rubric_rl import nonfinite, step_callbacks, trainer

    # The public names keep working from ``rubric_rl.trainer`` (re-exported, one definition).
    assert trainer.StepTimer is step_callbacks.StepTimer
    assert trainer.StepCallbackError is step_callbacks.StepCallbackError
    assert trainer.NonFiniteLossError is nonfinite.NonFiniteLossError


def test_module_names_are_unique_across_the_package():
    seen: dict[str, list[str]] = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "rubric_rl")):
        for name in files:
            if name.endswith(".py") and name not in ("__init__.py", "base.py"):
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
                seen.setdefault(name, []).append(rel)
    clashes = {k: v for k, v in seen.items() if len(v) > 1}
    assert not clashes, f"module names used twice: {clashes}"


def _config_section_gets():
    """Every ``<config section>.get("key", default)`` in the package: (file, line, section path,
    key). A receiver is a config section when its attribute chain starts at ``config``, ``cfg``
    or ``c`` (through ``self.`` / ``t.``), or at a local name assigned from such a chain."""
    found = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "rubric_rl")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            with open(path) as f:
                tree = ast.parse(f.read())

            def chain(node):
                parts = []
                while isinstance(node, ast.Attribute):
                    parts.append(node.attr)
                    node = node.value
                if isinstance(node, ast.Name):
                    parts.append(node.id)
                return [p for p in reversed(parts) if p not in ("self", "t")]

            alias = {}
            for n in ast.walk(tree):
                if (
                    isinstance(n, ast.Assign)
                    and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name)
                    and isinstance(n.value, ast.Attribute)
                    and chain(n.value)[:1] in (["config"], ["cfg"], ["c"])
                ):
                    alias[n.targets[0].id] = chain(n.value)
            for n in ast.walk(tree):
                if not (
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "get"
                    and len(n.args) == 2
                    and isinstance(n.args[0], ast.Constant)
                ):
                    continue
                rp = chain(n.func.value)
                if rp[:1] and rp[0] in alias:
                    rp = alias[rp[0]] + rp[1:]
                if rp[:1] in (["config"], ["cfg"], ["c"]):
                    rel = os.path.relpath(path, ROOT)
                    found.append((rel, n.lineno, tuple(rp[1:]), n.args[0].value))
    return found


def test_no_config_read_restates_a_default_of_the_base_config():
    """The base config (``rubric_rl/defaults.py``) has every key a run reads at its default, so
    a ``section.get(key, default)`` of one of its keys restates (or contradicts) that default:
    read the key."""
    from rubric_rl.defaults import get_base_config

    base = get_base_config().to_dict()
    restated = []
    for rel, line, section, key in _config_section_gets():
        d = base
        for s in section:
            d = d.get(s) if isinstance(d, dict) else None
        if isinstance(d, dict) and key in d:
            restated.append(f"{rel}:{line} config.{'.'.join((*section, key))}")
    assert not restated, "reads with a default the base config already gives:\n" + "\n".join(
        restated
    )
