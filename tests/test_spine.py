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
    # The public names keep working from ``rubric_rl.trainer`` (re-exported, one definition).
    from rubric_rl import trainer
    from rubric_rl.loop import nonfinite, step_callbacks

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
    """The base config (``rubric_rl/config/defaults.py``) has every key a run reads at its default,
    so a ``section.get(key, default)`` of one of its keys restates (or contradicts) that default:
    read the key."""
    from rubric_rl.config.defaults import get_base_config

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


# The loop, the builders and the config checks: they know a method only through its registry.
METHOD_BLIND = (
    "config/builders.py",
    "config/config_validation.py",
    "launch.py",
    "loop/run_state.py",
    "loop/step_callbacks.py",
    "loop/step_producer.py",
    "loop/trainer_batch.py",
    "services/__init__.py",
    "services/grader.py",
    "services/sampler.py",
    "step.py",
    "trainer.py",
)


def _names_of_methods(path, methods):
    """Each (line, text) of ``path`` that names a method: a string equal to a method's name, or
    an import of (or a string naming) a module in a method's room."""
    with open(path) as f:
        tree = ast.parse(f.read())
    rooms = tuple(f"rubric_rl.methods.{m}" for m in methods)
    found = []
    for n in ast.walk(tree):
        modules = []
        if isinstance(n, ast.Import):
            modules = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module:
            modules = [n.module, *(f"{n.module}.{a.name}" for a in n.names)]
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            if n.value in methods:
                found.append((n.lineno, n.value))
            modules = [n.value]
        found += [(n.lineno, m) for m in modules if m.startswith(rooms)]
    return found


def test_the_loop_builders_and_config_checks_name_no_method():
    from rubric_rl.methods.method import BUILTIN

    named = []
    for name in METHOD_BLIND:
        path = os.path.join(ROOT, "rubric_rl", name)
        named += [
            f"rubric_rl/{name}:{line}: {text!r}"
            for line, text in _names_of_methods(path, set(BUILTIN))
        ]
    assert not named, "a method named outside its room (ask the registry):\n" + "\n".join(named)


def test_the_method_check_sees_each_way_of_naming_one(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from rubric_rl.methods.arise import arise\n"
        "import rubric_rl.methods.rised.rised\n"
        "from rubric_rl.methods import method\n"
        "if config.get('method', 'grpo') == 'grpo':\n"
        "    pass\n"
        "x = 'rubric_rl.methods.harness_rl:f'\n"
    )
    found = _names_of_methods(str(path), {"grpo", "arise", "rised", "harness_rl"})
    assert sorted({line for line, _ in found}) == [1, 2, 4, 6]
    assert (4, "grpo") in found and (6, "rubric_rl.methods.harness_rl:f") in found
