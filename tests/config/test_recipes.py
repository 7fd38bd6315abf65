"""Every recipe composes and passes the validators; every broken recipe fails with its message."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe, examples_dir
from unirl.config.entrypoint import ENTRYPOINT_OF_FOLDER as ENTRY_BY_DOMAIN
from unirl.config.validate import validate

# recipes the generic validators refuse on purpose, each with the line naming what is missing
REFUSED: dict[str, str] = {}
RECIPES = sorted(
    str(p.relative_to(examples_dir()).with_suffix(""))
    for p in examples_dir().rglob("*.yaml")
    if p.parent != examples_dir()
)
BROKEN = sorted((Path(__file__).parent / "broken").glob("*.yaml"))


def test_there_are_recipes_and_broken_ones() -> None:
    assert "diffusion/sd3_tiny_trainside" in RECIPES
    assert len(BROKEN) >= 45


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_composes_and_validates(recipe: str, tmp_path: Path) -> None:
    # a fresh output_dir: the recipes' default folders may hold a user's earlier run
    data = compose_recipe(recipe, ["dry_run=true", f"output_dir={tmp_path / 'run'}"])
    if recipe in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[recipe]):
            validate(data)
        return
    entry = importlib.import_module(ENTRY_BY_DOMAIN[recipe.split("/")[0]])
    cfg, objs = entry.check(data)[:2]
    assert cfg.dry_run is True
    assert objs["sampling"].samples_per_prompt >= 1
    # the dry run's plan is the trainer's own placement on a plan-only pool: every block the
    # recipe names is a role (or built by one), every role sits inside the pool, nothing written
    rows = entry.trainer(data, dry=True).planned()
    placed = " ".join(target for _, target, _ in rows)
    for name in ("bundle", "pipeline", "backend", "algorithm", "stack", "rollout", "reward"):
        block = data.get(name) or {}
        if "_target_" in block:
            assert str(block["_target_"]) in placed, (name, block["_target_"], rows)
    for role, _, where in rows:
        ranks = re.fullmatch(r"pool ranks (\d+)(?:-(\d+))?(?: .*)?", where)
        assert ranks is not None, (role, where)
        assert int(ranks.group(2) or ranks.group(1)) < cfg.num_devices, (role, where)
    assert len({role for role, _, _ in rows}) == len(rows)
    assert not (tmp_path / "run").exists()  # a plan writes nothing


@pytest.mark.parametrize("case", BROKEN, ids=lambda p: p.stem)
def test_broken_recipe_fails_with_its_message(case: Path, tmp_path: Path) -> None:
    """Each case is refused by the pre-Ray checks of the entrypoint it is run under (its
    ``entrypoint`` key, else the one its base recipe declares): the same ``check`` the
    entrypoint's ``run`` calls before any Ray work, ``dry_run`` or not."""
    spec = yaml.safe_load(case.read_text())
    assert (
        {"base", "overrides", "expect"}
        <= set(spec)
        <= {
            "base",
            "overrides",
            "expect",
            "entrypoint",
        }
    ), f"{case.name}: keys must be base/overrides/expect (and optionally entrypoint)"
    # a fresh output_dir first (a case may set its own): a user's earlier run in the
    # recipe's default folder must not answer before the check under test
    data = compose_recipe(spec["base"], [f"output_dir={tmp_path / 'run'}", *spec["overrides"]])
    entry = spec.get("entrypoint") or ENTRY_BY_DOMAIN[spec["base"].split("/")[0]]
    with pytest.raises(ConfigError) as info:
        importlib.import_module(entry).check(data)
    assert re.search(spec["expect"], str(info.value)), f"{case.name}: got {info.value}"
    assert "\n" not in str(info.value), f"{case.name}: the message must be one line"


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_declares_its_entrypoint(recipe: str) -> None:
    text = (examples_dir() / f"{recipe}.yaml").read_text()
    declared = re.findall(r"^entrypoint: (\S+)", text, flags=re.M)
    assert declared == [ENTRY_BY_DOMAIN[recipe.split("/")[0]]], recipe


def test_every_entrypoint_refuses_every_other_domain_and_names_the_right_one() -> None:
    """One recipe per entrypoint, run under each other entrypoint (dry run): the line names
    the entrypoint that runs it."""
    one_each = {
        "unirl.train_diffusion": "diffusion/sd3_tiny_trainside",
        "unirl.train_vlm": "vlm/qwen_vl_tiny_grpo",
        "unirl.train_pe": "pe/pe_tiny_trainside",
        "unirl.train_unified_model": "unified_model/unified_tiny",
    }
    for owner, recipe in one_each.items():
        data = compose_recipe(recipe, ["dry_run=true"])
        for entry in one_each:
            if entry == owner:
                continue
            with pytest.raises(ConfigError) as info:
                importlib.import_module(entry).check(data)
            assert str(info.value) == (
                f"this recipe belongs to {owner} (declares entrypoint: {owner}), not {entry}; "
                f"run python -m {owner} with the same --config-name and overrides"
            )


def test_broken_messages_are_distinct() -> None:
    expects = [yaml.safe_load(p.read_text())["expect"] for p in BROKEN]
    assert len(set(expects)) == len(expects)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_ADDRESS": "", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "unirl.train_diffusion", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
    )


def test_cli_compose_check_and_dry_run_from_any_directory(tmp_path: Path) -> None:
    out = _cli("--config-name=diffusion/sd3_tiny_trainside", "--cfg", "job", "--resolve")
    assert out.returncode == 0, out.stderr
    assert "_target_: unirl.models.sd3.SD3Bundle" in out.stdout
    out = _cli(
        "--config-name=diffusion/sd3_tiny_trainside",
        "dry_run=true",
        f"output_dir={tmp_path / 'run'}",
    )
    assert out.returncode == 0, out.stderr
    assert "placement plan" in out.stdout and "samples_per_rollout" in out.stdout
    assert "no Ray started" in out.stdout


def test_cli_reports_config_errors_without_traceback_and_before_ray() -> None:
    out = _cli(
        "--config-name=diffusion/sd3_tiny_trainside", "batch_size=3", "stack.micro_batch_size=8"
    )
    assert out.returncode == 2
    assert "configuration error" in out.stderr and "Traceback" not in out.stderr
    assert "ray" not in out.stdout.lower()


def test_every_recipe_passes_the_cli_compose_check() -> None:
    """``--cfg job --resolve`` through the real entrypoint, from another directory, for every
    recipe (one interpreter per recipe, as a user runs it)."""
    failures = []
    for recipe in RECIPES:
        domain = recipe.split("/")[0]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                ENTRY_BY_DOMAIN[domain],
                f"--config-name={recipe}",
                "--cfg",
                "job",
                "--resolve",
            ],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=120,
            env={**os.environ, "HYDRA_FULL_ERROR": "0"},
        )
        if out.returncode != 0 or "_target_" not in out.stdout:
            failures.append(f"{recipe}: rc={out.returncode} {out.stderr[-500:]}")
    assert not failures, "\n".join(failures)
