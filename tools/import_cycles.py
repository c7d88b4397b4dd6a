"""Import cycles inside our packages: every strongly-connected component of the import graph;
and the layer rules between parts of the package (``LAYER_RULES``).

Usage: ``python tools/import_cycles.py [PACKAGE ...]`` from the repository root (default
``rubric_rl``; e.g. ``rubric_rl configs`` also follows imports between the two). Prints each
component of more than one module with the import statements that close it, and exits 1 if there
is any.

Edges come from the source text (``ast``), never from importing it, and include EVERY ``import`` /
``from … import`` statement of a module: module level, ``if TYPE_CHECKING:`` blocks and imports
inside functions. A lazy import back into a module that imports you still ties the two together
(neither can be understood, tested or moved without the other), so it counts. Resolution:

- ``import a.b.c`` is an edge to the most specific module of ``a.b.c`` that exists, and so is
  ``importlib.import_module("a.b.c")`` / ``__import__("a.b.c")`` with a literal name (a name
  computed at run time cannot be resolved from the source and is not seen);
- ``from a.b import name`` is an edge to ``a.b.name`` when that is a module (a submodule imported
  by name), otherwise to ``a.b``; relative imports are resolved against the importing package;
- the parent packages' ``__init__`` modules that Python runs on the way are not counted (they
  would tie every package to everything its ``__init__`` re-exports).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# importer -> imported module -> line numbers of the statements
ImportGraph = dict[str, dict[str, list[int]]]

REPO_ROOT = Path(__file__).resolve().parent.parent


def _module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _longest_existing(name: str, modules: Mapping[str, Path]) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imported_modules(
    tree: ast.AST, module: str, is_package: bool, modules: Mapping[str, Path]
) -> Iterable[tuple[str, int]]:
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0] if node.args else None
            if (
                called in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                target = _longest_existing(first.value, modules)
                if target is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                target = _longest_existing(alias.name, modules)
                if target is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if alias.name != "*" and submodule in modules:
                    yield submodule, node.lineno
                else:
                    target = _longest_existing(base, modules)
                    if target is not None:
                        yield target, node.lineno


def import_graph(root: Path = REPO_ROOT, packages: Iterable[str] = ("rubric_rl",)) -> ImportGraph:
    """Every module of ``packages`` (under ``root``) -> the modules of ``packages`` it imports."""
    modules = _module_files(root, packages)
    graph: ImportGraph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: dict[str, list[int]] = {}
        for target, line in _imported_modules(tree, module, path.name == "__init__.py", modules):
            lines = edges.setdefault(target, []) if target != module else []
            if line not in lines:
                lines.append(line)
        graph[module] = edges
    return graph


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); every component, each sorted, in discovery order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, successors = work[-1]
            pushed = False
            for succ in successors:
                if succ not in graph:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    pushed = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if pushed:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def find_cycles(graph: ImportGraph, ignore: Iterable[str] = ()) -> list[list[str]]:
    """Components of more than one module, after removing the ``ignore`` modules (so a cycle that
    runs through an ignored module is not reported, one that avoids them is)."""
    skip = set(ignore)
    kept = {m: [t for t in edges if t not in skip] for m, edges in graph.items() if m not in skip}
    return [c for c in strongly_connected_components(kept) if len(c) > 1]


def describe(component: list[str], graph: ImportGraph) -> str:
    members = set(component)
    lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
    for module in component:
        for target, line_numbers in sorted(graph[module].items()):
            if target in members:
                where = ", ".join(str(n) for n in sorted(line_numbers))
                lines.append(f"  {module} -> {target}  (line {where})")
    return "\n".join(lines)


# (importer prefix, imported prefix, why): no module under the first imports one under the second.
# Domains know nothing of the methods that train on them; methods program against the Domain
# contract (``rubric_rl/envs/base.py``, the one module of envs/ they may import), not a domain's
# modules.
LAYER_RULES: tuple[tuple[str, str, str], ...] = (
    ("rubric_rl.envs", "rubric_rl.methods", "a domain imports no method"),
    ("rubric_rl.envs", "rubric_rl.controllers", "a domain imports no controller"),
    ("rubric_rl.methods", "rubric_rl.envs", "a method imports no domain, only envs.base"),
    ("rubric_rl.controllers", "rubric_rl.envs", "a controller imports no domain, only envs.base"),
)
# The one module of envs/ that method and controller code may import: the Domain contract.
CONTRACT_MODULES = frozenset({"rubric_rl.envs.base"})
# Method -> domain imports tolerated while they are moved behind the Domain contract (importer,
# imported). Empty: the rule holds for every pair. A listed pair that no longer exists fails, so
# the list only shrinks.
PENDING_CROSSINGS: frozenset[tuple[str, str]] = frozenset()


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(
    graph: ImportGraph,
    rules: Iterable[tuple[str, str, str]] = LAYER_RULES,
    allowed: Iterable[str] = CONTRACT_MODULES,
    pending: Iterable[tuple[str, str]] = PENDING_CROSSINGS,
) -> tuple[list[str], list[tuple[str, str]]]:
    """(each import that breaks a rule, as a line naming both modules, the statement's lines and
    the rule; each ``pending`` pair that no longer exists). ``allowed`` modules may be imported
    from anywhere; ``pending`` pairs are tolerated."""
    allowed, pending = set(allowed), set(pending)
    found: list[str] = []
    seen: set[tuple[str, str]] = set()
    for module, edges in sorted(graph.items()):
        for target, lines in sorted(edges.items()):
            for importer, imported, why in rules:
                if not (_under(module, importer) and _under(target, imported)):
                    continue
                if target in allowed:
                    continue
                seen.add((module, target))
                if (module, target) not in pending:
                    where = ", ".join(str(n) for n in sorted(lines))
                    found.append(f"{module} -> {target}  (line {where}): {why}")
    return found, sorted(pending - seen)


def main(argv: list[str]) -> int:
    packages = argv or ["rubric_rl"]
    graph = import_graph(REPO_ROOT, packages)
    cycles = find_cycles(graph)
    for component in cycles:
        print(describe(component, graph))
    print(f"{len(cycles)} import cycle(s) among {len(graph)} modules of {', '.join(packages)}")
    broken, gone = layer_violations(graph)
    for line in broken:
        print(f"layer rule broken: {line}")
    for pair in gone:
        print(f"pending crossing no longer exists (remove it from PENDING_CROSSINGS): {pair}")
    print(f"{len(broken)} layer rule violation(s), {len(PENDING_CROSSINGS)} pending crossing(s)")
    return 1 if cycles or broken or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
