"""``unirl.train_pe`` before any Ray work: every ``pe/`` recipe dry-runs (trainside, and the
policy served by SGLang with its sync); broken ``pe`` blocks fail with their own message."""

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
    ("recipe", "sync"),
    [
        ("pe/pe_sglang_full_pickscore", "FullSync"),
        ("pe/pe_sglang_full_wise", "FullSync"),
        ("pe/pe_sglang_lora_pickscore", "LoraSync"),
    ],
)
def test_sglang_recipes_dry_run_with_the_served_policy(
    recipe: str, sync: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The policy served by SGLang: its engine and its sync in the plan, the composed engine
    (built by the trainer from pe.compose) as the rollout, every role colocated."""
    assert run(_data(recipe, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "no Ray started" in out and "layout=colocate" in out
    plan = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^  (\S+)\s+(unirl\.\S+(?: \(\S+\))?)\s+(pool ranks .+)$", out, re.M)
    }
    assert plan["pe_engine"] == ("unirl.rollout.engine.sglang_llm.SGLangLLMEngine", COLOCATE)
    assert plan["pe_sync_source"] == (
        f"unirl.distributed.weight_sync.source.SyncSource (sync=unirl.distributed.weight_sync.{sync})",
        COLOCATE,
    )
    assert plan["rollout"] == ("unirl.rollout.engine.composed.ComposedEngine", COLOCATE)
    assert plan["diffusion_pipeline"] == ("unirl.models.sd3.SD3Pipeline", COLOCATE)
    assert re.search(r"train_both\s+False", out)


COLOCATE = "pool ranks 0-7 dp=8"  # every role on every worker of the 8-device recipe


def test_a_separate_served_policy_puts_engine_drawer_and_reward_on_the_rollout_slab(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(
        "pe/pe_sglang_full_pickscore",
        tmp_path,
        "layout=separate",
        "train_fraction=0.5",
        "sync.transport=object_store",
    )
    assert run(data) == 0
    out = capsys.readouterr().out
    for role in ("train_world", "pe_backend", "pe_sync_source"):
        assert re.search(rf"^  {role}\s+.+\s+pool ranks 0-3 dp=4$", out, re.M), role
    for role in ("pe_engine", "diffusion_bundle", "rollout", "reward"):
        assert re.search(rf"^  {role}\s+.+\s+pool ranks 4-7 dp=4$", out, re.M), role


def test_a_served_policy_refuses_what_it_cannot_place(tmp_path: Path) -> None:
    sglang = _data("pe/pe_sglang_full_pickscore", tmp_path)
    trainside = _data(TINY, tmp_path)
    cases = [
        (
            _edit(trainside, "pe.compose", {"max_rewrite_chars": 10}),
            r"^pe\.compose is for a served policy \(rollout: SGLangLLMEngine\)",
        ),
        (
            _edit(sglang, "pe.compose.text_sampler", "x"),
            r"^pe\.compose: \['text_sampler'\] are set by unirl\.train_pe",
        ),
        (
            _edit(sglang, "pe.compose.max_chars", 3),
            r"^pe\.compose: unknown key\(s\) \['max_chars'\]",
        ),
        (
            _edit(sglang, "rollout._target_", "unirl.rollout.engine.dedicated.DedicatedEngine"),
            r"unirl\.train_pe samples the rewrites with the policy itself",
        ),
        (
            _edit(sglang, "sync", ...),
            r"rollout engine 'sglang' holds its own weights: add exactly one `sync` block",
        ),
    ]
    for data, expect in cases:
        with pytest.raises(ConfigError) as info:
            run(data)
        assert re.search(expect, str(info.value)), str(info.value)
        assert "\n" not in str(info.value)
    both = _edit(_edit(sglang, "layout", "separate"), "sync.transport", "object_store")
    both = _edit(both, "train_fraction", 0.5)
    both = _edit(both, "pe.train_both", True)
    tiny_both = _data("pe/pe_tiny_train_both", tmp_path)
    for name in ("backend", "algorithm", "stack"):
        both = _edit(both, f"pe.diffusion.{name}", tiny_both["pe"]["diffusion"][name])
    with pytest.raises(ConfigError, match=r"^pe\.train_both=true with layout=separate"):
        run(both)
    with pytest.raises(ConfigError, match=r"^pe\.compose\.resident=true needs the policy"):
        run(_edit(_edit(both, "pe.train_both", False), "pe.compose.resident", True))


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


def _served_train_both(tmp_path: Path) -> dict[str, Any]:
    """pe_sglang_full_pickscore (FullSync of the policy) with the drawer trained (LoRA, as in
    pe_tiny_train_both, on CUDA)."""
    data = _edit(_data("pe/pe_sglang_full_pickscore", tmp_path), "pe.train_both", True)
    tiny = _data("pe/pe_tiny_train_both", tmp_path)["pe"]["diffusion"]
    for name in ("backend", "algorithm", "stack"):
        data = _edit(data, f"pe.diffusion.{name}", {**tiny[name]})
    data = _edit(data, "pe.diffusion.backend.device", "cuda")
    data = _edit(data, "pe.diffusion.stack.micro_batch_size", 4)
    return _edit(data, "pe.diffusion.pipeline.strategy", tiny["pipeline"]["strategy"])


DEDICATED_DRAWER = {
    "_target_": "unirl.rollout.engine.dedicated.DedicatedEngine",
    "_recursive_": False,
    "bundle": "${pe.diffusion.bundle}",
    "pipeline": "${pe.diffusion.pipeline}",
}
LORA_SYNC = {"_target_": "unirl.distributed.weight_sync.LoraSync", "transport": "local"}


def test_a_trained_drawer_beside_a_served_policy_is_checked_as_its_own_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The drawer's view has its own engine and sync, never the policy's: a LoRA drawer next
    to a FullSync policy dry-runs; given a dedicated engine, its sync and engine join the
    plan."""
    data = _served_train_both(tmp_path)
    assert run(data) == 0
    out = capsys.readouterr().out
    assert re.search(r"sampled_by\s+itself", out) and "diffusion_engine" not in out
    dedicated = _edit(
        _edit(data, "pe.diffusion.rollout", DEDICATED_DRAWER), "pe.diffusion.sync", LORA_SYNC
    )
    from omegaconf import OmegaConf

    dedicated = OmegaConf.to_container(OmegaConf.create(dedicated), resolve=True)
    assert run(dedicated) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert re.search(r"sampled_by\s+its dedicated engine \(synced\)", out)
    assert re.search(
        r"^  diffusion_sync_source\s+\S+SyncSource \(sync=\S+LoraSync\)\s+" + COLOCATE + "$",
        out,
        re.M,
    )
    assert re.search(r"^  diffusion_engine\s+\S+DedicatedEngine\s+" + COLOCATE, out, re.M)


def test_a_dedicated_drawer_is_refused_where_it_cannot_be_synced(tmp_path: Path) -> None:
    data = _served_train_both(tmp_path)
    engine = _edit(data, "pe.diffusion.rollout", DEDICATED_DRAWER)
    cases = [
        (engine, r"^pe\.diffusion: a dedicated drawer needs both pe\.diffusion\.rollout"),
        (
            _edit(
                _edit(engine, "pe.diffusion.sync", LORA_SYNC),
                "pe.diffusion.rollout._target_",
                COMPOSED_ENGINE,
            ),
            r"^pe\.diffusion\.rollout\._target_=\S+ComposedEngine is a 'trainside' engine",
        ),
        (
            _edit(
                _edit(
                    _data("pe/pe_tiny_train_both", tmp_path),
                    "pe.diffusion.rollout",
                    DEDICATED_DRAWER,
                ),
                "pe.diffusion.sync",
                LORA_SYNC,
            ),
            r"^pe\.diffusion\.rollout: a dedicated drawer is placed beside a served policy",
        ),
    ]
    for case, expect in cases:
        with pytest.raises(ConfigError) as info:
            run(case)
        assert re.search(expect, str(info.value)), str(info.value)
    frozen = _data("pe/pe_sglang_full_pickscore", tmp_path)
    frozen = _edit(
        _edit(frozen, "pe.diffusion.rollout", DEDICATED_DRAWER), "pe.diffusion.sync", LORA_SYNC
    )
    with pytest.raises(ConfigError, match=r"^pe\.diffusion\.rollout: a dedicated drawer exists to"):
        run(frozen)


COMPOSED_ENGINE = "unirl.rollout.engine.composed.ComposedEngine"
