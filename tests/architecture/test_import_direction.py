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
