"""unirl.tools.port_recipe: an upstream-shaped recipe becomes one of ours that composes and
validates, every field it could not carry is listed with its old path and why, and one of our
own recipes ports onto itself."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from unirl.config.entry import examples_dir, register_run_defaults
from unirl.config.validate import validate
from unirl.tools.port_recipe import Gap, port_recipe, render

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "upstream_sd3_trainside.yaml"
DATA = {
    "DATA_PATH": str(ROOT / "datasets" / "ocr" / "train.txt"),
    "EVAL_DATA_PATH": str(ROOT / "datasets" / "ocr" / "test.txt"),
}
FIXTURE_GAPS = [
    Gap(
        "defaults[0]",
        "{'transfer_queue': 'simple'}: this project has no TransferQueue: rollout outputs "
        "travel through the trainer's own tensor transport",
    ),
    Gap(
        "reward.backend.base_device",
        "OCRScorer has no device: RapidOCR runs on the CPU (engine=easyocr follows the reward "
        "worker's device)",
    ),
    Gap("reward.backend.batch_size", "OCRScorer reads one image at a time; it has no batch size"),
]


def _targets(node: object, path: str = "") -> dict[str, str]:
    """``{dotted path: _target_}`` of every block in a recipe."""
    out: dict[str, str] = {}
    if isinstance(node, dict):
        if "_target_" in node:
            out[path] = node["_target_"]
        for key, value in node.items():
            out.update(_targets(value, f"{path}.{key}" if path else key))
    return out


def _fixture() -> dict[str, object]:
    return yaml.safe_load(FIXTURE.read_text())


def test_fixture_ports_with_exactly_the_listed_gaps() -> None:
    ported = port_recipe(_fixture())
    assert ported.gaps == FIXTURE_GAPS
    assert ported.notes == [
        "pipeline: built as unirl.models.sd3.SD3Pipeline (the old recipe has none)"
    ]


def test_fixture_targets_map_onto_ours() -> None:
    """13 upstream ``_target_``s, 10 at renamed paths; each lands on the class named here."""
    old = _targets(_fixture())
    assert len(old) == 13
    new = _targets(port_recipe(_fixture()).recipe)
    assert new == {
        "bundle": "unirl.models.sd3.SD3Bundle",
        "pipeline": "unirl.models.sd3.SD3Pipeline",
        "pipeline.strategy": "unirl.sde.FlowSDE",
        "sampling": "unirl.types.DiffusionSamplingParams",
        "rollout": "unirl.rollout.TrainsideEngine",
        "backend": "unirl.train.FSDPBackend",
        "backend.fsdp": "unirl.train.FSDPConfig",
        "backend.optimizer": "unirl.train.OptimizerConfig",
        "backend.lora": "unirl.train.LoraConfig",
        "algorithm": "unirl.algorithms.FlowGRPO",
        "algorithm.kl": "unirl.algorithms.KLConfig",
        "stack": "unirl.train.TrainStack",
        "reward": "unirl.reward.RewardService",
        "reward.backend": "unirl.reward.local.OCRScorer",
        "data_source": "unirl.data.PromptFileSource",
    }
    resolvable_upstream = {"sampling", "stack", "reward"}  # same module path here
    from unirl.tools.port_recipe import _locate

    assert {p for p, t in old.items() if _locate(t) is not None} == resolvable_upstream


def test_fixture_fields_land_under_our_names() -> None:
    new = port_recipe(_fixture()).recipe
    assert new["defaults"] == ["/unirl_run", "_self_"]
    assert new["batch_size"] == 2 and new["seed"] == 42 and new["eval_interval"] == 0
    assert new["eval"] == {"prompts_path": "${oc.env:EVAL_DATA_PATH,dataset/ocr/test.txt}"}
    assert new["data_source"]["path"] == "${oc.env:DATA_PATH,dataset/ocr/train.txt}"
    backend = new["backend"]
    assert backend["trainable_attr"] == "transformer"
    assert backend["fsdp"] == {
        "_target_": "unirl.train.FSDPConfig",
        "data_parallel": "shard",
        "activation_checkpointing": False,
        "block_class_names": ["JointTransformerBlock"],
    }
    assert backend["optimizer"] == {"_target_": "unirl.train.OptimizerConfig", "lr": 3.0e-4}
    assert backend["lora"]["targets"] == ["to_q", "to_k", "to_v", "to_out.0"]
    assert new["algorithm"]["kl"]["beta"] == 0.04
    assert new["bundle"]["path"].startswith("${oc.env:PRETRAINED_MODEL,")
    # sampling.noise_level -> sampling.eta, and the strategy that interpolated it follows
    assert new["sampling"]["eta"] == 0.7 and "sde_strategy" not in new["sampling"]
    assert new["pipeline"]["strategy"] == {
        "_target_": "unirl.sde.FlowSDE",
        "eta": "${sampling.eta}",
    }


def test_ported_fixture_composes_and_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process equivalent of ``python -m unirl.train_diffusion --config-dir <tmp>
    --config-name=<ported> dry_run=true`` (tests/config/test_recipes.py composes the same way)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    for key, value in DATA.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "upstream_sd3_ported.yaml").write_text(render(port_recipe(_fixture()), "x"))
    register_run_defaults()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        cfg = compose(
            config_name="upstream_sd3_ported",
            overrides=["dry_run=true", f"output_dir={tmp_path / 'run'}"],
        )
    data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    run, objs = validate(data)  # type: ignore[arg-type]
    assert run.dry_run is True and run.batch_size == 2 and run.seed == 42
    assert objs["sampling"].samples_per_prompt == 24 and objs["sampling"].eta == 0.7
    assert objs["stack"].num_updates_per_batch == 2
    assert data["pipeline"]["strategy"]["eta"] == 0.7  # type: ignore[index, call-overload]


def test_cli_writes_the_recipe_and_lists_the_gaps_then_the_entrypoint_dry_runs_it(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        **DATA,
        "PYTHONPATH": str(ROOT),
        "RAY_ADDRESS": "",
        "HYDRA_FULL_ERROR": "0",
    }
    out_file = tmp_path / "recipes" / "upstream_sd3_ported.yaml"
    ported = subprocess.run(
        [sys.executable, "-m", "unirl.tools.port_recipe", str(FIXTURE), "-o", str(out_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert ported.returncode == 0, ported.stderr
    assert "could not map 3 field(s):" in ported.stderr
    for gap in FIXTURE_GAPS:
        assert f"  {gap.path}: {gap.why}" in ported.stderr
    text = out_file.read_text()
    assert text.startswith("# @package _global_\n")
    assert f"#   {FIXTURE_GAPS[1].path}: {FIXTURE_GAPS[1].why}" in text
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "unirl.train_diffusion",
            "--config-dir",
            str(out_file.parent),
            "--config-name=upstream_sd3_ported",
            "dry_run=true",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "recipe composed and validated" in run.stdout
    assert (
        "unirl.train.FSDPBackend" in run.stdout and "samples_per_rollout          48" in run.stdout
    )


def test_cli_prints_to_stdout_and_warns_when_the_name_is_one_of_ours(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "unirl.tools.port_recipe", str(FIXTURE)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.startswith("# @package _global_\n")
    assert yaml.safe_load(out.stdout) == port_recipe(_fixture()).recipe
    clash = tmp_path / "sd3_trainside.yaml"
    out = subprocess.run(
        [*cmd, "-o", str(clash)], capture_output=True, text=True, timeout=120, env=env
    )
    assert "note: diffusion/sd3_trainside.yaml is also one of this project's recipes" in out.stderr
    missing = subprocess.run(
        [*cmd[:-1], str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert missing.returncode == 2 and missing.stderr.startswith("[unirl] port_recipe:")


def test_nested_spec_is_flattened_and_base_device_becomes_device() -> None:
    """The reward shape upstream documents: a scorer with ``base_device`` and a nested
    ``config: {_target_: ...Spec}``; ours is one flat block."""
    old = {
        "reward": {
            "_target_": "unirl.reward.service.RewardService",
            "backend": {
                "_target_": "unirl.reward.local.pickscore.PickScoreRewardScorer",
                "base_device": "cuda",
                "config": {
                    "_target_": "unirl.reward.local.pickscore.PickScoreSpec",
                    "batch_size": 8,
                },
            },
        }
    }
    ported = port_recipe(old)
    assert ported.gaps == []
    assert ported.recipe["reward"] == {
        "_target_": "unirl.reward.RewardService",
        "backend": {"_target_": "unirl.reward.local.PickScore", "device": "cuda", "batch_size": 8},
    }


def test_every_unmappable_kind_is_listed_never_dropped_silently() -> None:
    old = {
        "num_devices": 2,
        "trainer": "diffusion",
        "zero_copy": {"enable": True},
        "run": {"seed": 1, "wandb_entity": "team"},
        "evaluation": {"eval_steps": 5, "num_eval_samples": 4},
        "backend": {
            "_target_": "unirl.train.backend.fsdp.FSDPBackend",
            "fsdp_cfg": {"_target_": "unirl.train.configs.FSDPConfig", "fsdp_mode": "hybrid"},
            "mystery_knob": 3,
        },
        "sync": {"_target_": "unirl.distributed.weight_sync.TQSync", "bucket_mb": 64},
        "stack": {
            "_target_": "unirl.train.stack.TrainStack",
            "micro_batch_size": "${sync.bucket_mb}",
            "max_grad_norm": "${backend.mystery_knob}",
            "seed": "${run.seed}",
        },
        "reward": {
            "_target_": "unirl.reward.remote.RemoteRewardBackend",
            "base_url": "http://h:1",
            "config": {"_target_": "x.RemoteRewardSpec", "input_kind": "image"},
        },
    }
    ported = port_recipe(old)
    assert [(g.path, g.why) for g in ported.gaps] == [
        ("trainer", "no top-level key 'trainer' here (RunConfig has no such field)"),
        ("zero_copy", "a TransferQueue setting; this project has no TransferQueue"),
        (
            "run.wandb_entity",
            "no counterpart of run.wandb_entity here (RunConfig has no such field)",
        ),
        (
            "evaluation.num_eval_samples",
            "no counterpart of evaluation.num_eval_samples here (RunConfig has no such field)",
        ),
        (
            "backend.fsdp_cfg.fsdp_mode",
            "fsdp_mode='hybrid' has no counterpart here (maps full -> shard, no_shard -> replicate)",
        ),
        ("backend.mystery_knob", "unirl.train.FSDPBackend takes no 'mystery_knob'"),
        (
            "sync._target_",
            "unirl.distributed.weight_sync.TQSync has no counterpart here (no rule, no such class)",
        ),
        (
            "reward.config.input_kind",
            "RemoteRewardBackend sends what the track holds (images or frames); there is no switch",
        ),
        ("stack.micro_batch_size", "interpolates sync.bucket_mb, which was not carried over"),
        ("stack.max_grad_norm", "interpolates backend.mystery_knob, which was not carried over"),
    ]
    recipe = ported.recipe
    assert "sync" not in recipe and "trainer" not in recipe
    assert recipe["stack"] == {"_target_": "unirl.train.TrainStack", "seed": "${seed}"}
    assert recipe["backend"] == {
        "_target_": "unirl.train.FSDPBackend",
        "fsdp": {"_target_": "unirl.train.FSDPConfig"},
    }
    assert recipe["reward"] == {"_target_": "unirl.reward.RemoteRewardBackend", "url": "http://h:1"}
    assert recipe["eval_interval"] == 5 and recipe["seed"] == 1 and recipe["num_devices"] == 2


@pytest.mark.parametrize(
    "recipe",
    ["diffusion/sd3_trainside", "diffusion/sd3_tiny_dedicated_separate", "pe/pe_tiny_trainside"],
)
def test_our_own_recipe_ports_onto_itself(recipe: str) -> None:
    old = yaml.safe_load((examples_dir() / f"{recipe}.yaml").read_text())
    ported = port_recipe(old)
    assert ported.gaps == [] and ported.notes == []
    assert ported.recipe == {**old, "defaults": ["/unirl_run", "_self_"]}


# -- upstream's real recipes ------------------------------------------------------------------

UPSTREAM_COMMIT = "1a7b501e8fe8517b432a130220d2ff462f9b5afa"
UPSTREAM = Path(__file__).parent / "fixtures" / "upstream" / UPSTREAM_COMMIT
UPSTREAM_RECIPES = sorted(p.relative_to(UPSTREAM).as_posix() for p in UPSTREAM.rglob("*.yaml"))
# the ported recipes that dry-run, with the entrypoint that runs them and the data they read
# (upstream's LLM / VLM recipes need DATA_PATH; ours of the same shape stand in)
DRY_RUNS = {
    "examples/diffusion/sd3_trainside.yaml": ("train_diffusion", None),
    "examples/diffusion/sd3_dancegrpo.yaml": ("train_diffusion", None),
    "examples/diffusion/qwen_image_trainside.yaml": ("train_diffusion", None),
    "examples/diffusion/wan21_t2v.yaml": ("train_diffusion", None),
    "examples/ar/qwen3_grpo_4b_base_dapo_sglang.yaml": ("train_vlm", "arithmetic/train.jsonl"),
    "examples/ar/qwen_vl_grpo_geo3k_mc_4x8_lora.yaml": ("train_vlm", "geometry/train.jsonl"),
    "examples/pe/pe_trainside_pickscore.yaml": ("train_pe", None),
    "examples/unified_model/hi3_vllmomni.yaml": ("train_unified_model", None),
}
DRY_RUNS_SD3_DANCE = "examples/diffusion/sd3_dancegrpo.yaml"


def _leaves(node: object, path: str = "") -> list[str]:
    """Dotted paths of every scalar (a list of scalars counts as one) in a recipe."""
    if isinstance(node, dict) and node:
        return [q for k, v in node.items() for q in _leaves(v, f"{path}.{k}" if path else k)]
    if isinstance(node, list) and any(isinstance(v, dict | list) for v in node):
        return [q for i, v in enumerate(node) for q in _leaves(v, f"{path}[{i}]")]
    return [path]


def test_upstream_fixtures_are_byte_identical_copies() -> None:
    """``SOURCE.md`` names the commit and each file's git blob id there."""
    listed = re.findall(r"^([0-9a-f]{40})  (\S+)$", (UPSTREAM / "SOURCE.md").read_text(), re.M)
    assert sorted(p for _, p in listed) == UPSTREAM_RECIPES
    for blob, path in listed:
        data = (UPSTREAM / path).read_bytes()
        header = f"blob {len(data)}\0".encode()
        assert hashlib.sha1(header + data).hexdigest() == blob, path
    folders = {p.split("/")[1] for p in UPSTREAM_RECIPES}
    assert folders == {"ar", "diffusion", "pe", "unified_model"}
    assert set(DRY_RUNS) == set(UPSTREAM_RECIPES)


@pytest.mark.parametrize("recipe", UPSTREAM_RECIPES)
def test_every_field_of_an_upstream_recipe_is_mapped_or_listed(recipe: str) -> None:
    """Each scalar of the old file went somewhere (``moved``) or is in the gap list (a gap
    on ``X._target_`` drops and lists the whole block ``X``); the ``logging:`` block is
    mapped key by key onto ``LoggingConfig``, never copied."""
    old = yaml.safe_load((UPSTREAM / recipe).read_text())
    ported = port_recipe(old)
    gaps = [g.path for g in ported.gaps]

    def listed(path: str) -> bool:
        return any(
            path == g or path.startswith((g.removesuffix("._target_") + ".", g + "[")) for g in gaps
        )

    unaccounted = [p for p in _leaves(old) if p not in ported.moved and not listed(p)]
    assert unaccounted == []
    assert all(g.why for g in ported.gaps)
    from unirl.config.run import LoggingConfig

    logging_keys = {f.name for f in dataclasses.fields(LoggingConfig)}
    assert set(ported.recipe.get("logging", {})) <= logging_keys
    assert "logging.report_to_wandb" in ported.moved or "logging.report_to_wandb" in gaps


def test_sd3_dancegrpo_maps_the_fields_the_issue_named() -> None:
    """The model path, the data path and the SDE schedule (26 fields unmapped before)."""
    ported = port_recipe(yaml.safe_load((UPSTREAM / DRY_RUNS_SD3_DANCE).read_text()))
    new = ported.recipe
    assert new["bundle"] == {
        "_target_": "unirl.models.sd3.SD3Bundle",
        "path": "${oc.env:PRETRAINED_MODEL,stabilityai/stable-diffusion-3.5-medium}",
        "dtype": "bf16",
    }
    assert new["data_source"] == {
        "_target_": "unirl.data.PromptFileSource",
        "path": "datasets/pickscore/train.txt",
        "seed": 42,
    }
    assert new["eval"] == {"prompts_path": "datasets/pickscore/test.txt"}
    assert new["pipeline"]["strategy"] == {"_target_": "unirl.sde.DanceSDE"}
    assert new["sampling"]["sde_steps"] == {
        "_target_": "unirl.sde.RandomSubsetSchedule",
        "fraction": [0.0, 0.5],
        "num_steps": 3,
    }
    assert new["advantage"] == {"std": "batch"}
    assert new["backend"]["lr_schedule"] == {
        "_target_": "unirl.train.LRScheduleConfig",
        "kind": "constant",
        "warmup_steps": 0,
        "total_steps": 10000,
    }
    assert new["rollout"] == {"_target_": "unirl.rollout.TrainsideEngine", "forward_batch_size": 8}
    assert new["backend"]["optimizer"] == {
        "_target_": "unirl.train.OptimizerConfig",
        "lr": 3.0e-4,
        "betas": [0.9, 0.999],
        "eps": 1.0e-8,
        "weight_decay": 0.0,
    }
    assert new["reward"]["backend"] == {
        "_target_": "unirl.reward.local.PickScore",
        "device": "cuda",
        "batch_size": 8,
        "processor": "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        "model": "yuvalkirstain/PickScore_v1",
    }
    assert new["logging"] == {
        "wandb_project": "${oc.env:WANDB_PROJECT,unirl-dancegrpo}",
        "wandb_run_name": "${oc.env:WANDB_RUN_NAME,sd3_dancegrpo}",
        "gallery_max_images": 8,
        "gallery_interval": 1,
    }
    gaps = {g.path for g in ported.gaps}
    assert {"logging.report_to_wandb", "logging.entity", "logging.tags"} <= gaps
    assert not any(g.startswith(("bundle.config.pretrained", "data_source.")) for g in gaps)


@pytest.mark.parametrize("recipe", sorted(DRY_RUNS))
def test_ported_upstream_recipe_dry_runs_through_its_entrypoint(
    recipe: str, tmp_path: Path
) -> None:
    entrypoint, data = DRY_RUNS[recipe]
    # upstream's diffusion recipes read datasets/pickscore/*.txt relative to the working dir
    prompts = tmp_path / "datasets" / "pickscore"
    prompts.mkdir(parents=True)
    # enough prompts for the largest upstream batch: the dry run builds the data source as the
    # real run does (a file with fewer prompts than one rollout takes is refused)
    lines = "".join(f"a red apple on table {i}\n" for i in range(256))
    for split in ("train", "test"):
        (prompts / f"{split}.txt").write_text(lines)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "", "HYDRA_FULL_ERROR": "0"}
    if data is not None:
        env["DATA_PATH"] = str(ROOT / "datasets" / data)
    name = Path(recipe).stem + "_ported"
    out_file = tmp_path / "recipes" / f"{name}.yaml"
    port = subprocess.run(
        [
            sys.executable,
            "-m",
            "unirl.tools.port_recipe",
            str(UPSTREAM / recipe),
            "-o",
            str(out_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert port.returncode == 0, port.stderr
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            f"unirl.{entrypoint}",
            "--config-dir",
            str(out_file.parent),
            f"--config-name={name}",
            "dry_run=true",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "recipe composed and validated" in run.stdout


def test_pe_recipe_ports_to_a_policy_and_a_trained_drawer() -> None:
    """Upstream's PE: ``ar:`` (the rewriter) goes to the top level, ``diffusion:`` (the drawer,
    trained too) to ``pe.diffusion``, ``ComposedSamplingParams`` splits into the two, and the
    composed trainside engine is ours."""
    ported = port_recipe(
        yaml.safe_load((UPSTREAM / "examples/pe/pe_trainside_pickscore.yaml").read_text())
    )
    new = ported.recipe
    assert new["entrypoint"] == "unirl.train_pe"
    assert new["rollout"] == {"_target_": "unirl.rollout.engine.composed.ComposedEngine"}
    assert new["bundle"]["_target_"] == "unirl.models.qwen3.Qwen3Bundle"
    assert new["algorithm"]["_target_"] == "unirl.algorithms.GRPO"
    assert new["sampling"] == {
        "_target_": "unirl.types.ARSamplingParams",
        "samples_per_prompt": 4,
        "temperature": 0.7,
        "max_new_tokens": 512,
        "top_p": 0.9,
    }
    pe = new["pe"]
    # upstream's drawer draws independent noise (init_same_noise: false); ours shares it unless
    assert pe == {"diffusion": pe["diffusion"], "train_both": True, "share_noise": False}
    drawer = pe["diffusion"]
    assert _targets(drawer) == {
        "bundle": "unirl.models.sd3.SD3Bundle",
        "pipeline": "unirl.models.sd3.SD3Pipeline",
        "pipeline.strategy": "unirl.sde.FlowSDE",
        "backend": "unirl.train.FSDPBackend",
        "backend.fsdp": "unirl.train.FSDPConfig",
        "backend.optimizer": "unirl.train.OptimizerConfig",
        "backend.lr_schedule": "unirl.train.LRScheduleConfig",
        "backend.lora": "unirl.train.LoraConfig",
        "algorithm": "unirl.algorithms.FlowGRPO",
        "stack": "unirl.train.TrainStack",
        "sampling": "unirl.types.DiffusionSamplingParams",
        "sampling.sde_steps": "unirl.sde.AllSteps",
    }
    assert drawer["sampling"]["samples_per_prompt"] == 8 and drawer["sampling"]["eta"] == 0.7
    # sde_indices [0..9] with 10 steps: every step stochastic, the last one too
    assert drawer["sampling"]["sde_steps"] == {
        "_target_": "unirl.sde.AllSteps",
        "exclude_last": False,
    }
    assert drawer["backend"]["optimizer"]["lr"] == 3.0e-4  # the rewriter's is 5e-6
    assert new["backend"]["optimizer"]["lr"] == 5.0e-6
    assert drawer["stack"]["num_updates_per_batch"] == 2
    gaps = {g.path for g in ported.gaps}
    assert not gaps & {"diffusion", "ar", "sampling._target_"}
    assert {"rollout.stage_attrs", "diffusion.algorithm.params"} <= gaps
    assert ported.moved["sampling.diffusion.init_same_noise"] == "pe.share_noise"
    assert ported.moved["sampling.diffusion.sde_indices"] == "pe.diffusion.sampling.sde_steps"


def test_unified_recipe_ports_to_one_served_engine_and_an_image_stage() -> None:
    """Upstream's HunyuanImage-3.0: two vLLM-Omni engines become one ``Hi3OmniEngine`` (mode
    from the text engine's modality), ``algorithm.{ar,image}`` the text loss and
    ``unified.image.algorithm``, the pipeline's SDE strategy the image pipeline's, N x M flat
    pairs the text's samples_per_prompt, and the LoRA sync ours."""
    ported = port_recipe(
        yaml.safe_load((UPSTREAM / "examples/unified_model/hi3_vllmomni.yaml").read_text())
    )
    new = ported.recipe
    assert new["entrypoint"] == "unirl.train_unified_model"
    assert new["rollout"] == {
        "_target_": "unirl.rollout.engine.vllm_omni.hi3.Hi3OmniEngine",
        "base_url": "${oc.env:VLLM_OMNI_URL,http://127.0.0.1:8000}",
        "mode": "recaption",
    }
    assert new["bundle"] == {
        "_target_": "unirl.models.unified.HunyuanImage3Bundle",
        "path": "${oc.env:PRETRAINED_MODEL,tencent/HunyuanImage-3.0-Instruct}",
        "dtype": "bf16",
        "mode": "${rollout.mode}",
    }
    assert new["pipeline"] == {"_target_": "unirl.models.unified.TransfusionTextPipeline"}
    assert new["sync"] == {"_target_": "unirl.distributed.weight_sync.LoraSync"}
    assert new["sync_interval"] == 1
    assert new["algorithm"] == {
        "_target_": "unirl.algorithms.GRPO",
        "clip_low": 1.0e-2,
        "clip_high": 1.0e-2,
    }
    assert new["stack"] == {
        "_target_": "unirl.train.unified_stack.UnifiedTrainStack",
        "image": {"micro_batch_size": 1},
        "max_grad_norm": 1.0,
    }
    assert new["sampling"]["samples_per_prompt"] == 4  # 2 texts x 2 images upstream
    image = new["unified"]["image"]
    assert image["algorithm"] == {"_target_": "unirl.algorithms.FlowGRPO", "clip_range": 1.0e-4}
    assert image["pipeline"] == {
        "_target_": "unirl.models.unified.TransfusionImagePipeline",
        "strategy": {"_target_": "unirl.sde.FlowSDE", "eta": "${unified.image.sampling.eta}"},
    }
    assert image["sampling"]["samples_per_prompt"] == 1
    assert (
        new["reward"]["backend"]["model"] == "${oc.env:PICKSCORE_MODEL,yuvalkirstain/PickScore_v1}"
    )
    assert image["sampling"]["sde_steps"] == {
        "_target_": "unirl.sde.RandomSubsetSchedule",
        "num_steps": 3,
        "fraction": [0, 0.5],
    }
    gaps = {g.path for g in ported.gaps}
    assert not gaps & {"ar_rollout", "dit_rollout", "algorithm", "sampling._target_"}
    assert {
        "ar_rollout.config.model_path",
        "dit_rollout.config.modality",
        "sync.param_prefix",
        "pipeline.config",
    } <= gaps


def test_migration_doc_gives_the_dry_run_count() -> None:
    text = (ROOT / "docs" / "migration.md").read_text()
    assert f"{len(DRY_RUNS)} of {len(UPSTREAM_RECIPES)}" in text


def test_hunyuan_video_targets_map_to_the_right_version() -> None:
    """Upstream's ``hunyuan_video`` package is HunyuanVideo 1.0 and its ``hunyuan_video15`` is
    1.5; ours are ``hunyuan_video_v1`` and ``hunyuan_video``, whose own targets map onto
    themselves."""
    from unirl.tools.port_recipe import _family_class

    v1 = _family_class("unirl.models.hunyuan_video.HunyuanVideoBundle", "Bundle")
    assert v1 == "unirl.models.hunyuan_video_v1.HunyuanVideoBundle"
    assert (
        _family_class("unirl.models.hunyuan_video.HunyuanVideoPipeline", "Pipeline")
        == "unirl.models.hunyuan_video_v1.HunyuanVideoPipeline"
    )
    v15 = _family_class("unirl.models.hunyuan_video15.HunyuanVideo15Bundle", "Bundle")
    assert v15 == "unirl.models.hunyuan_video.HunyuanVideo15Bundle"
    ours = _family_class("unirl.models.hunyuan_video.HunyuanVideo15Bundle", "Bundle")
    assert ours == "unirl.models.hunyuan_video.HunyuanVideo15Bundle"


def test_sde_indices_become_all_steps_only_when_they_are_every_step() -> None:
    """``sde_indices`` of every step -> ``AllSteps(exclude_last=False)``; of all but the last
    -> ``AllSteps()``; any other subset stays listed (no schedule here takes explicit steps)."""
    from unirl.tools.port_recipe import _all_steps

    assert _all_steps([0, 1, 2, 3], 4) == {"_target_": "unirl.sde.AllSteps", "exclude_last": False}
    assert _all_steps([0, 1, 2], 4) == {"_target_": "unirl.sde.AllSteps"}
    assert _all_steps([0, 2], 4) is None and _all_steps([0, 1], "${x}") is None
    old = {
        "sampling": {
            "_target_": "unirl.types.sampling.DiffusionSamplingParams",
            "num_inference_steps": 4,
            "sde_indices": [1, 2],
        }
    }
    ported = port_recipe(old)
    assert [g.path for g in ported.gaps] == ["sampling.sde_indices"]
    assert "sde_steps" not in ported.recipe["sampling"]
