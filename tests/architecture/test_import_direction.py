"""ARCHITECTURE.md section 2: the import direction between layers, checked on the source."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import unirl

PACKAGE = Path(unirl.__file__).parent
DISPATCH_MARKER = (
    "distributed.group.dispatch"  # the @distributed marker: no Ray, allowed everywhere
)

# layer -> layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "types": {"config"},
    "sde": {"config"},
    "models": {"types", "sde", "config"},
    "algorithms": {"types", "sde", "models", "config"},
    "train": {"algorithms", "types", "config"},
    "rollout": {"models", "types", "sde", "config", "distributed"},
    "reward": {"types", "config"},
    "data": {"types", "config"},
    "distributed": {"types", "config"},
    "logging": {"types", "config"},
}
TOP = {"trainer", "tools"}  # know every layer, like the entrypoints


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in names if n == "unirl" or n.startswith("unirl.")]


def test_layers_import_only_downward() -> None:
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) == 1:
            continue  # entrypoints and unirl/__init__.py
        layer = rel.parts[0]
        if layer in TOP:
            continue
        assert layer in ALLOWED, (
            f"new top-level package unirl/{layer}: add it to ALLOWED with its rules"
        )
        for name in _imports(path):
            parts = name.split(".")
            if len(parts) < 2:
                violations.append(f"{rel}: imports bare 'unirl'")
                continue
            target = parts[1]
            if target == layer or ".".join(parts[1:4]) == DISPATCH_MARKER:
                continue
            if target not in ALLOWED[layer]:
                violations.append(f"{rel}: {layer} -> {name}")
    assert not violations, "import-direction violations:\n" + "\n".join(violations)


def test_rollout_never_imports_train_reward_or_trainer() -> None:
    bad = {"train", "reward", "trainer"}
    for path in (PACKAGE / "rollout").rglob("*.py"):
        for name in _imports(path):
            assert name.split(".")[1] not in bad, f"{path}: {name}"


def test_import_unirl_pulls_no_optional_stack() -> None:
    code = (
        "import sys, unirl, unirl.types, unirl.config, unirl.sde, unirl.train_diffusion\n"
        "heavy = [m for m in ('sglang', 'vllm', 'wandb', 'rapidocr_onnxruntime', 'easyocr', 'tensorboard', 'cv2')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"optional stacks imported eagerly: {out.stdout.strip()}"


def _sibling_imports(path: Path, package: str, modules: set[str]) -> set[str]:
    """Modules of ``package`` that ``path`` imports anywhere in the file: at the top, under
    ``if TYPE_CHECKING:`` or inside a function (a lazy import that dodges a cycle is still
    an edge). ``"__init__"`` stands for the package itself."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(package + "."):
                    found.add(alias.name.split(".")[len(package.split("."))])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: ``from .x import y`` / ``from . import x``
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{module}" if module else base
            if module == package:
                found |= {a.name if a.name in modules else "__init__" for a in node.names}
            elif module.startswith(package + "."):
                found.add(module.split(".")[len(package.split("."))])
    found.discard(path.stem)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``None`` when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_distributed_group_module_graph_is_acyclic() -> None:
    """No import circle inside ``distributed/group``, counting imports under
    ``TYPE_CHECKING`` and inside functions: a module that needs a pool or a worker it sits
    below takes a ``Protocol`` of what it uses (``watchdog.PingedPool``,
    ``handle.WorkerPool``, ``layout.PlacementPool``, ``role.HostWorker``)."""
    group = PACKAGE / "distributed" / "group"
    modules = {p.stem for p in group.glob("*.py")}
    graph = {
        p.stem: _sibling_imports(p, "unirl.distributed.group", modules)
        for p in sorted(group.glob("*.py"))
    }
    assert "handle" in graph["pool"] and "watchdog" in graph["handle"]  # the walk sees edges
    cycle = _cycle(graph)
    assert cycle is None, "import cycle in unirl/distributed/group: " + " -> ".join(cycle or [])


def test_cycle_finder_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from pkg.b import B\n")
    (tmp_path / "b.py").write_text("def f():\n    from pkg.a import A\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    modules = {"a", "b", "c"}
    graph = {p.stem: _sibling_imports(p, "pkg", modules) for p in tmp_path.glob("*.py")}
    assert graph == {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycle(graph) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None
