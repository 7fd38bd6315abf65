"""No module of ``unirl`` takes part in an import cycle.

The graph's nodes are the modules of ``unirl/`` (a package is its ``__init__``); an edge is
every import a module makes of another one: at the top, under ``if TYPE_CHECKING:`` or
inside a function (a lazy import that dodges a circle at import time is still a circle in
the design: the two modules cannot be understood, tested or moved apart). ``from unirl.a
import b`` is an edge to the module ``unirl.a.b`` when there is one, else to ``unirl.a``
(the name comes from its ``__init__``). The parent packages that Python runs first when it
imports ``unirl.a.b`` are not edges: a package that re-exports its submodules would
otherwise sit in a circle with each of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import unirl

PACKAGE = Path(unirl.__file__).parent


def module_name(path: Path, root: Path) -> str:
    """``unirl.a.b`` for ``<root>/unirl/a/b.py``; a package is its ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same top-level package it imports (see module doc)."""
    root = package.parent
    top = package.name
    files = {module_name(p, root): p for p in sorted(package.rglob("*.py"))}

    def known(name: str) -> str | None:
        while name and name not in files:  # ``unirl.a.b.attr`` -> ``unirl.a.b``
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names if a.name.split(".")[0] == top}
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # relative: ``from .x import y`` / ``from .. import x``
                    base = here
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    module = f"{base}.{module}" if module else base
                if module.split(".")[0] != top:
                    continue
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.add(sub if sub in files else known(module))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (sorted):
    every module that takes part in a cycle, grouped by cycle (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            nxt = next(successors, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_module_of_unirl_takes_part_in_an_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 250 and "unirl.trainer.pe_roles" in graph["unirl.trainer.pe_served"]
    found = cycles(graph)
    assert not found, "modules in import cycles (break each by moving the shared piece down):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )


def test_the_graph_sees_lazy_type_checking_relative_and_submodule_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import c\n")
    (pkg / "a.py").write_text("from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import A\n")  # lazy: still an edge
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n"
    )
    (pkg / "sub" / "d.py").write_text("import pkg.sub.c\nfrom pkg import thing\n")
    graph = import_graph(pkg)
    assert graph == {
        "pkg": {"pkg.sub.c"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a"},
        "pkg.sub.d": {"pkg.sub.c", "pkg"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    graph["pkg.a"] = set()
    assert cycles(graph) == []
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
