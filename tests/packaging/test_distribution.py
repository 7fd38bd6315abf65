"""What the distributions promise: an Apache-2.0 LICENSE at the root, as both pyprojects say,
and a reward service whose install pulls no package named ``unirl`` from the public index
(another project publishes one there; ours is installed from this repository)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "unirl-reward-service"


def _project(path: Path) -> dict[str, object]:
    with (path / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]


def test_license_file_is_the_apache_2_license_the_pyprojects_declare() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    for path in (ROOT, SERVICE):
        assert _project(path)["license"] == {"text": "Apache-2.0"}, path


def test_reward_service_depends_on_no_distribution_named_unirl() -> None:
    project = _project(SERVICE)
    requirements = list(project["dependencies"])  # type: ignore[call-overload]
    for extra in project.get("optional-dependencies", {}).values():  # type: ignore[attr-defined]
        requirements += extra
    names = {canonicalize_name(Requirement(r).name) for r in requirements}
    assert "unirl" not in names, sorted(names)
    assert {"fastapi", "uvicorn", "torch"} <= names  # the service's own stack is still listed
    assert _project(ROOT)["name"] == "unirl"


def test_reward_service_without_unirl_says_how_to_install_it() -> None:
    code = "import sys; sys.modules['unirl.reward'] = None; import unirl_reward_service"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "needs UniRL installed from its repository first: pip install -e <UniRL clone>" in (
        out.stderr
    )
