"""No import cycles in the package and its layer rules hold (tools/import_cycles.py): envs/
imports no method or controller, methods and controllers import of envs/ only the Domain contract
(envs/base.py), with no pending crossing left; the checker sees every import form."""

import textwrap

from tools.import_cycles import (
    PENDING_CROSSINGS,
    describe,
    find_cycles,
    import_graph,
    layer_violations,
    strongly_connected_components,
)


def test_no_import_cycles_in_the_package():
    graph = import_graph()
    assert "rubric_rl.core.train_step" in graph and len(graph) > 50  # it read the package
    cycles = find_cycles(graph)
    assert not cycles, "\n".join(describe(c, graph) for c in cycles)


def test_layer_rules_hold_in_the_package():
    graph = import_graph()
    broken, gone = layer_violations(graph)
    assert not broken, "\n".join(broken)
    assert not gone, f"remove from PENDING_CROSSINGS (they no longer exist): {gone}"
    # every method -> domain import is behind the Domain contract: nothing is tolerated
    assert PENDING_CROSSINGS == frozenset()


def test_layer_rules_name_each_new_crossing(tmp_path):
    _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/envs/__init__.py": "",
            "pkg/envs/base.py": "",
            "pkg/envs/dom.py": "def f():\n    from pkg.methods import m  # lazy: still counted\n",
            "pkg/methods/__init__.py": "",
            "pkg/methods/m.py": "from pkg.envs import base\nfrom pkg.envs.dom import f\n",
            "pkg/methods/old.py": "import pkg.envs.dom\n",
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    rules = [
        ("pkg.envs", "pkg.methods", "a domain imports no method"),
        ("pkg.methods", "pkg.envs", "a method imports no domain"),
    ]
    pending = [("pkg.methods.old", "pkg.envs.dom"), ("pkg.methods.gone", "pkg.envs.dom")]
    broken, gone = layer_violations(graph, rules, allowed=["pkg.envs.base"], pending=pending)
    assert broken == [
        "pkg.envs.dom -> pkg.methods.m  (line 2): a domain imports no method",
        "pkg.methods.m -> pkg.envs.dom  (line 2): a method imports no domain",
    ]
    assert gone == [("pkg.methods.gone", "pkg.envs.dom")]
    # without the contract exemption the import of envs.base breaks the rule too
    broken, _ = layer_violations(graph, rules, allowed=[], pending=pending)
    assert "pkg.methods.m -> pkg.envs.base  (line 1): a method imports no domain" in broken


def _package(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_checker_sees_every_form_of_import(tmp_path):
    _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": """
                from typing import TYPE_CHECKING
                import os
                if TYPE_CHECKING:
                    from pkg.b import Thing
            """,
            "pkg/b.py": """
                def f():
                    from . import c  # a lazy, relative import of a submodule by name
            """,
            "pkg/c.py": "import pkg.a.missing_attr\n",  # resolves to the module pkg.a
            "pkg/sub/__init__.py": "from .. import d\n",
            "pkg/d.py": """
                import importlib
                def g():
                    importlib.import_module("pkg.sub")
            """,
            "pkg/e.py": "from pkg import a, b\nfrom pkg.e import x  # a self-import is no cycle\n",
            "pkg/f.py": "from pkg.a import *\n",
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    assert {m: sorted(edges) for m, edges in graph.items()} == {
        "pkg": [],
        "pkg.a": ["pkg.b"],
        "pkg.b": ["pkg.c"],
        "pkg.c": ["pkg.a"],
        "pkg.sub": ["pkg.d"],
        "pkg.d": ["pkg.sub"],
        "pkg.e": ["pkg.a", "pkg.b"],
        "pkg.f": ["pkg.a"],
    }
    assert graph["pkg.b"]["pkg.c"] == [3]  # the line of the statement
    assert sorted(find_cycles(graph)) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.sub"]]
    # ignoring a module drops the cycles through it, not the others
    assert find_cycles(graph, ignore=["pkg.b"]) == [["pkg.d", "pkg.sub"]]
    text = describe(["pkg.a", "pkg.b", "pkg.c"], graph)
    assert "pkg.a -> pkg.b  (line 5)" in text and "pkg.c -> pkg.a  (line 1)" in text


def test_tarjan_components():
    graph = {
        "a": ["b"],
        "b": ["c", "d"],
        "c": ["a"],
        "d": ["e"],
        "e": ["d", "f"],
        "f": [],
        "g": ["g", "a"],  # a self-loop alone is no cycle of modules
    }
    components = strongly_connected_components(graph)
    assert sorted(components) == [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]
    # a long chain: iterative, so no recursion limit
    chain = {str(i): [str(i + 1)] for i in range(5000)} | {"5000": ["0"]}
    assert [len(c) for c in strongly_connected_components(chain)] == [5001]
