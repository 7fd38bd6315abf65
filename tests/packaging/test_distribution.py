"""What the distributions promise: an Apache-2.0 LICENSE at the root, as both pyprojects say;
names that cannot collide with the public index (its ``unirl`` 0.2.0 is another project, so
ours is ``unirl-mm``, import package ``unirl``); a reward service whose install resolves our
framework and never a package named ``unirl``; every extra installable on Python 3.11-3.13 or
skipped there by a marker that the missing-dependency message explains; a ``[vllm]`` extra
that brings vLLM; a test toolchain held below the pytest that breaks schemathesis."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "unirl-reward-service"
FRAMEWORK = "unirl-mm"
FOREIGN = "unirl"  # on the public index since 2025 (0.1.0, 0.2.0): a different project


def _project(path: Path) -> dict[str, object]:
    with (path / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]


def _requirements(path: Path) -> dict[str, list[Requirement]]:
    """``{"": core dependencies, extra: its requirements}`` of one pyproject."""
    project = _project(path)
    out = {"": [Requirement(r) for r in project["dependencies"]]}  # type: ignore[attr-defined]
    for extra, reqs in project.get("optional-dependencies", {}).items():  # type: ignore[attr-defined]
        out[extra] = [Requirement(r) for r in reqs]
    return out


def _applies(req: Requirement, python: str) -> bool:
    if req.marker is None:
        return True
    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}
    return req.marker.evaluate(env)


def test_license_file_is_the_apache_2_license_the_pyprojects_declare() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    for path in (ROOT, SERVICE):
        assert _project(path)["license"] == {"text": "Apache-2.0"}, path


def test_distribution_names_are_ours_and_the_import_packages_keep_theirs() -> None:
    assert _project(ROOT)["name"] == FRAMEWORK
    assert _project(SERVICE)["name"] == "unirl-reward-service"
    assert (ROOT / "unirl" / "__init__.py").is_file()
    assert (SERVICE / "unirl_reward_service" / "__init__.py").is_file()


def test_reward_service_depends_on_the_framework_by_its_own_name_never_unirl() -> None:
    reqs = _requirements(SERVICE)
    names = {canonicalize_name(r.name) for group in reqs.values() for r in group}
    assert FOREIGN not in names, sorted(names)
    framework = [r for r in reqs[""] if canonicalize_name(r.name) == FRAMEWORK]
    assert len(framework) == 1
    assert framework[0].specifier.contains(str(_project(ROOT)["version"]))
    assert {"fastapi", "uvicorn", "torch"} <= names  # the service's own stack is still listed


def test_no_install_hint_names_the_foreign_distribution() -> None:
    """README, .ci/run and the launchers tell users what to type: never ``unirl[...]`` (pip
    would fetch the other project) and never ``pip install unirl``."""
    files = [ROOT / "README.md", ROOT / ".ci" / "run", SERVICE / "README.md"]
    files += sorted((ROOT / "examples").glob("*.sh"))
    files += sorted((ROOT / "docs").glob("*.md"))
    for path in files:
        text = path.read_text()
        assert "'unirl[" not in text and '"unirl[' not in text, path
        assert "pip install unirl " not in text and "pip install unirl\n" not in text, path


def _service_install_report(tmp_path: Path) -> dict[str, object]:
    """``pip install --dry-run --report`` of the service from a copy of its folder, offline:
    the framework comes from a wheel built here, everything else is what is installed."""
    wheels, src = tmp_path / "wheels", tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(ROOT / "unirl", src / "unirl", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(SERVICE, src / "unirl-reward-service", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    offline = ["--no-index", "--no-build-isolation"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", *offline, "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert [p.name for p in wheels.iterdir()] == ["unirl_mm-0.1.0-py3-none-any.whl"]
    report = tmp_path / "report.json"
    out = subprocess.run(
        [
            *pip,
            "install",
            "--dry-run",
            "--quiet",
            *offline,
            "--find-links",
            str(wheels),
            "--report",
            str(report),
            str(src / "unirl-reward-service"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(report.read_text())


def test_reward_service_resolves_offline_with_our_framework_and_nothing_named_unirl(
    tmp_path: Path,
) -> None:
    report = _service_install_report(tmp_path)
    chosen = {
        canonicalize_name(item["metadata"]["name"]): item  # type: ignore[index]
        for item in report["install"]  # type: ignore[attr-defined]
    }
    assert FOREIGN not in chosen, sorted(chosen)
    service = chosen["unirl-reward-service"]["metadata"]  # type: ignore[index]
    requires = [Requirement(r) for r in service["requires_dist"]]
    assert FOREIGN not in {canonicalize_name(r.name) for r in requires}
    assert FRAMEWORK in {canonicalize_name(r.name) for r in requires}
    # where the framework is not installed yet (it is installed as unirl-mm in CI), pip takes
    # it from the local wheel, not from an index
    if FRAMEWORK in chosen:
        assert chosen[FRAMEWORK]["download_info"]["url"].endswith(  # type: ignore[index]
            "unirl_mm-0.1.0-py3-none-any.whl"
        )


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_rapidocr_is_required_exactly_where_it_has_a_release(python: str) -> None:
    """rapidocr-onnxruntime 1.4.4 (the last release) requires Python < 3.13: every extra that
    lists it carries the marker, so ``[ocr]`` / ``[dev]`` resolve on 3.13 (without it)."""
    seen = 0
    for path in (ROOT, SERVICE):
        for extra, reqs in _requirements(path).items():
            for req in reqs:
                if canonicalize_name(req.name) == "rapidocr-onnxruntime":
                    seen += 1
                    assert _applies(req, python) is (python != "3.13"), (path, extra)
    assert seen == 4  # [ocr] and [dev] of both distributions


def test_every_python_version_marker_is_the_rapidocr_one() -> None:
    """No extra drops a package on some Python silently: the only marker is rapidocr's, which
    OCRScorer explains (next test)."""
    for path in (ROOT, SERVICE):
        for extra, reqs in _requirements(path).items():
            for req in reqs:
                if req.marker is not None:
                    assert canonicalize_name(req.name) == "rapidocr-onnxruntime", (path, extra)
                    assert str(req.marker) == 'python_version < "3.13"'


def test_ocr_without_rapidocr_names_the_extra_and_the_python_version() -> None:
    from unirl.reward.local.ocr import rapidocr_missing_message

    on_313 = rapidocr_missing_message((3, 13))
    assert "no release for Python 3.13" in on_313 and "[ocr] extra of unirl-mm" in on_313
    assert "engine=easyocr" in on_313 and "\n" not in on_313
    on_311 = rapidocr_missing_message((3, 11))
    assert "pip install 'unirl-mm[ocr]'" in on_311 and "\n" not in on_311
    assert rapidocr_missing_message() == rapidocr_missing_message(sys.version_info[:2])


def test_ocr_scorer_raises_the_message_when_rapidocr_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from unirl.reward.local import ocr

    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    monkeypatch.setattr(ocr.sys, "version_info", (3, 13, 0, "final", 0))
    with pytest.raises(ImportError, match=r"no release for Python 3\.13"):
        ocr.OCRScorer().score(torch.ones(1, 3, 8, 8), ['"x"'], [{}])


def test_vllm_extra_brings_the_vllm_of_vllm_omnis_release_line() -> None:
    """vllm-omni lists no vLLM and warns unless vLLM's major.minor equals its own."""
    reqs = {canonicalize_name(r.name): r for r in _requirements(ROOT)["vllm"]}
    assert set(reqs) == {"vllm", "vllm-omni"}
    for version in ("0.30.0", "0.30.1"):
        assert reqs["vllm"].specifier.contains(version)
        assert reqs["vllm-omni"].specifier.contains(version)
    for version in ("0.29.0", "0.31.0"):
        assert not reqs["vllm"].specifier.contains(version)
        assert not reqs["vllm-omni"].specifier.contains(version)


def test_test_toolchain_is_constrained_consistently() -> None:
    """constraints.txt pins what the dev extras list, holds pytest below 9.1 like them, and
    names no distribution of ours (they are installed from the checkout)."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req
    assert FOREIGN not in pins and FRAMEWORK not in pins and "unirl-reward-service" not in pins
    for path in (ROOT, SERVICE):
        for req in _requirements(path)["dev"]:
            name = canonicalize_name(req.name)
            assert name in pins, f"{path.name} [dev] {name} is not pinned in constraints.txt"
            pinned = next(iter(pins[name].specifier)).version
            assert req.specifier.contains(pinned), (name, str(req.specifier), pinned)
            if name == "pytest":
                assert not req.specifier.contains("9.2.0")


def test_reward_service_without_unirl_says_how_to_install_it() -> None:
    code = "import sys; sys.modules['unirl.reward'] = None; import unirl_reward_service"
    # both packages from this checkout, whatever is installed (or not) in the environment
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SERVICE), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 1
    assert "needs UniRL installed from its repository first: pip install -e <UniRL clone>" in (
        out.stderr
    )
    assert "(the distribution unirl-mm;" in out.stderr
