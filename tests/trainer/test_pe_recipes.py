"""``unirl.train_pe`` before any Ray work: every ``pe/`` recipe dry-runs or is refused in one
line naming what is missing; broken ``pe`` blocks fail with their own message."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.train_pe import run

TINY = "pe/pe_tiny_trainside"
SGLANG = "a policy served by SGLang needs a composed engine that samples through SGLangLLMEngine"


def _data(recipe: str, tmp_path: Path, *overrides: str) -> dict[str, Any]:
    return compose_recipe(recipe, ["dry_run=true", f"output_dir={tmp_path / 'run'}", *overrides])


@pytest.mark.parametrize(
    "recipe", ["pe/pe_tiny_trainside", "pe/pe_tiny_train_both", "pe/pe_trainside_pickscore"]
)
def test_runnable_recipes_dry_run(
    recipe: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(_data(recipe, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "no Ray started" in out and "drawer (pe.diffusion):" in out
    assert re.search(r"pe_pipeline\s+unirl\.models\.qwen3\.Qwen3Pipeline", out)
    assert re.search(r"diffusion_pipeline\s+unirl\.models\.sd3\.SD3Pipeline", out)
    assert re.search(r"rollout\s+unirl\.rollout\.engine\.composed\.ComposedEngine", out)
    trains = recipe.endswith("train_both")
    assert re.search(rf"train_both\s+{trains}", out)
    assert ("diffusion_stack" in out) is trains and ("trained_steps_first_rollout" in out) is trains


@pytest.mark.parametrize(
    "recipe",
    ["pe/pe_sglang_full_pickscore", "pe/pe_sglang_full_wise", "pe/pe_sglang_lora_pickscore"],
)
def test_sglang_recipes_are_refused_naming_what_is_missing(recipe: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        run(_data(recipe, tmp_path))
    message = str(info.value)
    assert SGLANG in message and "\n" not in message
    assert message.startswith(
        "rollout._target_=unirl.rollout.engine.sglang_llm.SGLangLLMEngine: unirl.train_pe"
    )
    assert message.endswith("and drop the `sync` block")


def _edit(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``data`` with ``path`` (dotted) set to ``value``; ``...`` deletes the key."""
    out = copy.deepcopy(data)
    *parents, leaf = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if value is ...:
        del node[leaf]
    else:
        node[leaf] = value
    return out


BROKEN = [
    ("pe", ..., r"unirl\.train_pe needs a `pe` block"),
    ("pe.reduce", "median", r"pe\.reduce must be one of"),
    ("pe.shared_noise", True, r"pe: unknown key\(s\) \['shared_noise'\]"),
    ("pe.diffusion", ..., r"pe\.diffusion is missing"),
    ("pe.diffusion.bundle", ..., r"pe\.diffusion\.bundle is missing"),
    ("pe.train_both", True, r"pe\.train_both=true trains the drawer: give pe\.diffusion\.backend"),
    (
        "pe.diffusion.algorithm",
        {"_target_": "unirl.algorithms.FlowGRPO"},
        r"pe\.diffusion\.algorithm is set but pe\.train_both=false",
    ),
    (
        "pe.diffusion.pipeline",
        {"_target_": "unirl.models.qwen3.Qwen3Pipeline"},
        r"pe\.diffusion\.pipeline\._target_=unirl\.models\.qwen3\.Qwen3Pipeline is not a "
        r"FlowMatchingPipeline",
    ),
    (
        "pipeline",
        {
            "_target_": "unirl.models.sd3.SD3Pipeline",
            "strategy": {"_target_": "unirl.sde.FlowSDE", "eta": 0.7},
        },
        r"pipeline\._target_=unirl\.models\.sd3\.SD3Pipeline is not a CausalLMPipeline",
    ),
    (
        "pe.diffusion.sampling",
        {"_target_": "unirl.types.ARSamplingParams", "samples_per_prompt": 2},
        r"pe\.diffusion\.sampling\._target_=unirl\.types\.ARSamplingParams: the drawer samples",
    ),
    (
        "rollout.keep_image_trajectory",
        True,
        r"rollout: \['keep_image_trajectory'\] are set by unirl\.train_pe",
    ),
    ("rollout.empty_rewrite", "skip", r"rollout\.empty_rewrite must be"),
    (
        "pe.diffusion.bundle.path",
        "/nonexistent/sd3",
        r"^pe\.diffusion: bundle\.path: .*/nonexistent/sd3",
    ),
]


@pytest.mark.parametrize(("path", "value", "expect"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_pe_recipe_fails_with_its_message(
    path: str, value: Any, expect: str, tmp_path: Path
) -> None:
    data = _edit(_data(TINY, tmp_path), path, value)
    with pytest.raises(ConfigError) as info:
        run(data)
    assert re.search(expect, str(info.value)), str(info.value)
    assert "\n" not in str(info.value)


def test_a_trained_drawer_runs_every_diffusion_check_on_its_own_geometry(tmp_path: Path) -> None:
    """The drawer's stack splits rewrites x images (32 x 2 = 64 per rank): a micro-batch that
    does not divide it, and a ratio loss over the ODE, are refused under ``pe.diffusion``."""
    data = _data("pe/pe_tiny_train_both", tmp_path)
    with pytest.raises(ConfigError, match=r"^pe\.diffusion: .*stack\.micro_batch_size=24"):
        run(_edit(data, "pe.diffusion.stack.micro_batch_size", 24))
    ode = _edit(data, "pe.diffusion.pipeline.strategy", {"_target_": "unirl.sde.ODE"})
    with pytest.raises(ConfigError, match=r"^pe\.diffusion: .*needs per-step log-probs"):
        run(ode)
