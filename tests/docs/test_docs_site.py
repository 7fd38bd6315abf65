"""The documentation site: ``mkdocs build --strict`` with its generated pages (recipe table,
configuration reference, package pages, llms.txt, per-page Markdown), link checking that
fails the build, and the configuration forms the pages document, run for real."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from unirl.tools import docs as gen

REPO = Path(__file__).resolve().parents[2]
RECIPE = "--config-name=diffusion/sd3_tiny_trainside"


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = _mkdocs(REPO / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr[-4000:]
    assert "WARNING" not in built.stderr, built.stderr[-4000:]
    return out


def test_every_recipe_is_in_the_table_under_its_entrypoint(site: Path) -> None:
    recipes = (site / "recipes.md").read_text()
    sections = re.split(r"^### `python -m ", recipes, flags=re.M)[1:]
    by_entrypoint = {s.split("`", 1)[0]: s for s in sections}
    files = gen.recipe_files()
    assert len(files) >= 50
    for path in files:
        name = path.relative_to(REPO / "examples").with_suffix("").as_posix()
        folder = name.split("/", 1)[0]
        entry = {"llm": "unirl.train_vlm", "vlm": "unirl.train_vlm"}.get(
            folder, f"unirl.train_{folder}"
        )
        assert f"| `{name}` |" in by_entrypoint[entry], (name, entry)
    html = (site / "recipes" / "index.html").read_text()
    assert "diffusion/sd3_tiny_trainside" in html and "<table>" in html


def test_generated_pages_agents_files_and_per_page_markdown(site: Path) -> None:
    # every written page and every package README has its page and its Markdown twin
    written = sorted(p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").glob("*.md"))
    packages = sorted(gen.package_pages())
    for page in [*written, *packages]:
        assert (site / page).is_file(), page
        html = site / page.removesuffix(".md") / "index.html"
        index = site / page.replace("index.md", "index.html")
        assert html.is_file() or index.is_file(), page
    assert {"math.md", "performance.md", "configuration.md", "agents.md"} <= set(written)
    # the recipe and reference markers were replaced in the Markdown twins too
    assert "<!-- unirl:" not in (site / "recipes.md").read_text()
    reference = (site / "reference.md").read_text()
    assert "### `unirl.train.TrainStack`" in reference
    assert (
        "| `micro_batch_size` | an integer >= 1 | `1` | micro_batch_size samples per" in reference
    )
    # a package page is its README (the README's headings, under the generated note)
    sde = (site / "packages" / "sde.md").read_text()
    assert sde.startswith("<!-- generated from unirl/sde/README.md")
    assert sde.endswith((REPO / "unirl" / "sde" / "README.md").read_text())
    # llms.txt links every page's Markdown; llms-full.txt holds every page
    index = (site / "llms.txt").read_text()
    assert index.startswith("# UniRL\n\n> ")
    full = (site / "llms-full.txt").read_text()
    for page in [*written, *packages]:
        assert f"]({page})" in index, page
        assert f"<!-- page: {page} -->" in full, page
    assert "a hub id." in full  # the configuration reference's text is in it


def test_optional_pages_join_the_nav_when_present(site: Path) -> None:
    nav = (site / "index.html").read_text()
    spec = importlib.util.spec_from_file_location("unirl_docs", REPO / "docs/hooks/unirl_docs.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    for _, name, _ in hook.OPTIONAL_PAGES:
        present = (REPO / "docs" / name).is_file()
        assert (f'href="{name.removesuffix(".md")}/"' in nav) == present, name


def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    """The link checks of mkdocs.yml, on a two-page site: a missing page fails, so does a
    missing anchor; the same site with good links builds."""
    validation = yaml.safe_load((REPO / "mkdocs.yml").read_text())["validation"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Here\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump({"site_name": "t", "validation": validation}))
    for link, ok in (("b.md#here", True), ("nope.md", False), ("b.md#nowhere", False)):
        (tmp_path / "docs" / "index.md").write_text(f"# A\n\n[x]({link})\n")
        built = _mkdocs(config, tmp_path / "site")
        assert (built.returncode == 0) == ok, (link, built.stderr[-2000:])


def test_recipe_rows_read_family_algorithm_engine_and_hardware() -> None:
    examples = REPO / "examples"
    row = gen.recipe_row(examples / "diffusion" / "sd3_tiny_trainside.yaml")
    assert row == gen.RecipeRow(
        name="diffusion/sd3_tiny_trainside",
        entrypoint="unirl.train_diffusion",
        family="sd3",
        algorithm="FlowGRPO",
        engine="TrainsideEngine",
        hardware="1 CPU worker",
        summary=row.summary,
    )
    assert row.summary.startswith("Quick start: Flow-GRPO with LoRA on the built-in `tiny` SD3")
    pe = gen.recipe_row(examples / "pe" / "pe_tiny_trainside.yaml")
    assert (pe.entrypoint, pe.family, pe.engine) == (
        "unirl.train_pe",
        "qwen3 → sd3",
        "ComposedEngine",
    )
    vlm = gen.recipe_row(examples / "vlm" / "qwen_vl_argrpo_geo3k_mc_4x8.yaml")
    assert (vlm.entrypoint, vlm.family, vlm.hardware) == (
        "unirl.train_vlm",
        "qwen_vl",
        "32 GPUs (4 nodes × 8)",
    )


def test_a_new_recipe_folder_takes_train_folder_or_is_refused(tmp_path: Path) -> None:
    """Folders map to ``unirl.train_<folder>`` generically (a new domain such as
    ``unified_model`` needs no change here); a folder with no entrypoint fails the build."""
    repo = tmp_path
    (repo / "unirl").mkdir()
    (repo / "examples" / "unified_model").mkdir(parents=True)
    recipe = repo / "examples" / "unified_model" / "tiny.yaml"
    recipe.write_text(
        "# @package _global_\n# A tiny unified model. More words.\nnum_devices: 16\n"
        "devices_per_node: 8\ndevice: cuda\nbundle: {_target_: unirl.models.bagel.BagelBundle}\n"
    )
    with pytest.raises(
        gen.DocsError, match=r"unirl/train_unified_model\.py .*ENTRYPOINT_OF_FOLDER"
    ):
        gen.recipe_row(recipe, repo / "examples", repo)
    (repo / "unirl" / "train_unified_model.py").write_text("")
    row = gen.recipe_row(recipe, repo / "examples", repo)
    assert (row.entrypoint, row.family, row.algorithm, row.hardware, row.summary) == (
        "unirl.train_unified_model",
        "bagel",
        "—",
        "16 GPUs (2 nodes × 8)",
        "A tiny unified model.",
    )


def test_links_to_source_files_become_paths_and_readme_links_go_to_package_pages() -> None:
    page = "guide.md"
    source = REPO / "docs" / page
    text = (
        "[loss](../unirl/algorithms/flowgrpo.py), [sde](../unirl/sde/README.md#gotchas), "
        "[math](math.md), [web](https://example.org), [gone](../unirl/nope.py)\n"
        "```\n[kept](../unirl/sde/kernels.py)\n```\n"
    )
    assert gen.rewrite_links(text, source, page) == (
        "loss (`unirl/algorithms/flowgrpo.py`), [sde](packages/sde.md#gotchas), "
        "[math](math.md), [web](https://example.org), [gone](../unirl/nope.py)\n"
        "```\n[kept](../unirl/sde/kernels.py)\n```\n"
    )
    readme = REPO / "unirl" / "models" / "sd3" / "README.md"
    assert gen.package_page(readme) == "packages/models/sd3.md"
    assert gen.rewrite_links("[c](../common/README.md)", readme, "packages/models/sd3.md") == (
        "[c](common.md)"
    )


def _cli(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_ADDRESS": "", "HYDRA_FULL_ERROR": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(REPO)) if p)
    return subprocess.run(
        [sys.executable, "-m", "unirl.train_diffusion", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
    )


def test_the_documented_block_swap_and_custom_reward_forms_work(tmp_path: Path) -> None:
    """docs/configuration.md: a plain mapping is merged and refused, '~' then '+' replaces the
    block; the page's own custom reward module validates as the reward backend."""
    new = "{_target_: unirl.reward.local.BrightnessTarget, target: 0.5}"
    merged = _cli(RECIPE, f"reward.backend={new}", "--cfg", "job")
    assert merged.returncode == 2 and "merged into the recipe's 'reward.backend' block" in (
        merged.stderr
    )
    swapped = _cli(RECIPE, "~reward.backend", f"+reward.backend={new}", "--cfg", "job")
    assert swapped.returncode == 0, swapped.stderr[-2000:]
    block = yaml.safe_load(swapped.stdout)["reward"]["backend"]
    assert block == {"_target_": "unirl.reward.local.BrightnessTarget", "target": 0.5}
    page = (REPO / "docs" / "configuration.md").read_text()
    module = re.search(r"```python\n# my_rewards\.py.*?\n(.*?)```", page, flags=re.S)
    assert module is not None
    (tmp_path / "my_rewards.py").write_text(module.group(1))
    dry = _cli(
        RECIPE,
        "dry_run=true",
        f"output_dir={tmp_path / 'out'}",
        "~reward.backend",
        "+reward.backend={_target_: my_rewards.RedChannel}",
        pythonpath=str(tmp_path),
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "[unirl] dry run: recipe composed and validated" in dry.stdout


def test_mkdocs_is_pinned_where_ci_installs_it() -> None:
    pins = dict(
        line.split("==", 1)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    from importlib.metadata import version

    for name in ("mkdocs", "mkdocs-material"):
        assert pins.get(name) == version(name), name
    dev = (REPO / "pyproject.toml").read_text()
    assert '"mkdocs==' in dev and '"mkdocs-material==' in dev
