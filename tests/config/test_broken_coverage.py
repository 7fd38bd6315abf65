"""The coverage table of ``tests/config/broken/README.md`` holds: every mistake class of issue
#30 has, in every domain, broken cases whose base recipe is in that domain, a tested warning,
a rollout-time refusal, a run-path test here, or a reason it cannot occur. Plus the two rows
that are not ``check`` refusals: greedy sampling warns in every token-sampling domain, and a
resume from a checkpoint of another model family is refused on each entrypoint's run path
before Ray."""

from __future__ import annotations

import copy
import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.run import RunConfig

BROKEN = Path(__file__).parent / "broken"
DOMAINS = ("image", "video", "edit", "llm", "vlm", "pe", "unified", "janus")
VIDEO_FAMILIES = ("wan", "hunyuan_video")


def domain_of(base: str) -> str:
    """The table column of a base recipe (``diffusion/wan21_tiny_t2v`` -> ``video``)."""
    folder, name = base.split("/")
    if folder == "diffusion":
        if name.startswith(VIDEO_FAMILIES):
            return "video"
        return "edit" if "edit" in name else "image"
    if folder == "unified_model":
        return "janus" if name.startswith("janus") else "unified"
    return folder


def table() -> dict[str, dict[str, str]]:
    """``{class: {domain: cell}}`` from the README's coverage table."""
    lines = (BROKEN / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| class |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    assert tuple(header[1:]) == DOMAINS, header
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(header), line
        rows[cells[0]] = dict(zip(DOMAINS, cells[1:]))
    return rows


def test_the_table_has_every_class_and_a_filled_cell_for_every_domain() -> None:
    rows = table()
    assert len(rows) == 13, list(rows)
    for name, cells in rows.items():
        for domain, cell in cells.items():
            cases = re.findall(r"`([a-z0-9_]+)`", cell)
            marked = cell.startswith(("n/a: ", "warn: ", "rollout: ", "run: "))
            assert cases or marked, f"{name} / {domain}: {cell!r}"
            if marked:
                continue
            for case in cases:
                path = BROKEN / f"{case}.yaml"
                assert path.is_file(), f"{name} / {domain}: no case {case}"
                base = yaml.safe_load(path.read_text())["base"]
                assert domain_of(base) == domain, f"{case}: base {base} is not {domain}"


def test_the_table_names_each_case_once() -> None:
    """A case belongs to one class and one domain (its refusal is checked by the broken-recipe
    test in test_recipes.py, which runs every file of the folder)."""
    named = [
        case
        for cells in table().values()
        for cell in cells.values()
        if not cell.startswith(("n/a: ", "warn: ", "rollout: ", "run: "))
        for case in re.findall(r"`([a-z0-9_]+)`", cell)
    ]
    assert len(named) == len(set(named)), sorted(c for c in named if named.count(c) > 1)


# one recipe per domain (the base recipes of the table's cases)
RECIPE = {
    "image": "diffusion/sd3_tiny_trainside",
    "video": "diffusion/wan21_tiny_t2v",
    "edit": "diffusion/flux2_klein_tiny_edit",
    "llm": "llm/qwen3_tiny_grpo",
    "vlm": "vlm/qwen_vl_tiny_grpo",
    "pe": "pe/pe_tiny_trainside",
    "unified": "unified_model/unified_tiny",
    "janus": "unified_model/janus_tiny_t2i_r1",
}


@pytest.mark.parametrize("domain", ["llm", "vlm", "pe", "unified", "janus"])
def test_greedy_sampling_warns_in_every_token_sampling_domain(domain: str) -> None:
    from unirl.trainer.base import degenerate_sampling_warnings

    def warnings(*overrides: str) -> list[str]:
        return degenerate_sampling_warnings(
            RunConfig.from_dict(compose_recipe(RECIPE[domain], list(overrides)))
        )

    assert warnings() == []
    group = compose_recipe(RECIPE[domain], [])["sampling"]["samples_per_prompt"]
    [line] = warnings("sampling.temperature=0")
    assert line.startswith(
        f"[unirl] warning: sampling.temperature=0 samples greedily: the {group} completions of "
        "each prompt are identical"
    )


# another family of the same domain, as a checkpoint's recorded recipe would name it
OTHER_FAMILY = {
    "image": "unirl.models.qwen_image.QwenImageBundle",
    "video": "unirl.models.hunyuan_video.HunyuanVideo15Bundle",
    "edit": "unirl.models.sd3.SD3Bundle",
    "llm": "unirl.models.qwen_vl.QwenVLBundle",
    "vlm": "unirl.models.qwen3.Qwen3Bundle",
    "pe": "unirl.models.qwen_vl.QwenVLBundle",
    "unified": "unirl.models.janus.JanusBundle",
    "janus": "unirl.models.unified.TransfusionBundle",
}


@pytest.mark.parametrize("domain", DOMAINS)
def test_resume_with_another_model_family_is_refused_before_ray(
    domain: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entrypoint's ``run`` (what the CLI calls after composing): a checkpoint whose
    recorded recipe names another family is refused with one line naming the change, before
    the DevicePool (Ray) or any model exists."""
    from unirl.config.entrypoint import ENTRYPOINT_OF_FOLDER
    from unirl.trainer import base as trainer_base
    from unirl.trainer.output import DRIVER_STATE

    step = tmp_path / "run" / "checkpoints" / "step_000004"
    step.mkdir(parents=True)
    now = compose_recipe(RECIPE[domain], [f"output_dir={tmp_path / 'run'}", f"resume={step}"])
    recorded: dict[str, Any] = copy.deepcopy(now)
    family = now["bundle"]["_target_"]
    recorded["bundle"]["_target_"] = OTHER_FAMILY[domain]
    (step / DRIVER_STATE).write_text(json.dumps({"next_rollout": 4, "config": recorded}))

    def no_ray(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the DevicePool (Ray) was started")

    monkeypatch.setattr(trainer_base, "resolve_resume", lambda cfg, out: step)
    monkeypatch.setattr(trainer_base, "DevicePool", no_ray)
    entry = importlib.import_module(ENTRYPOINT_OF_FOLDER[RECIPE[domain].split("/")[0]])
    # the run, then its dry run (which reads the checkpoint's recorded recipe, no hashing)
    for data in (now, {**now, "dry_run": True}):
        with pytest.raises(ConfigError) as info:
            entry.run(data)
        assert str(info.value).startswith(
            "resume: checkpoint step_000004 cannot be loaded by this recipe (bundle._target_: "
            f"{OTHER_FAMILY[domain]} -> {family})"
        ), str(info.value)
        assert "\n" not in str(info.value)
