"""Each component owns one typed config: the validators build it from the recipe block and
read its attributes (no block re-read by string with copied defaults), ``dry_run`` prints from
the same objects, and the device-pool fields are declared once."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from unirl.config import ConfigError
from unirl.config.component import component_config, config_class_of
from unirl.config.dry_run import batch_geometry
from unirl.config.entry import compose_recipe
from unirl.config.geometry import BatchGeometry
from unirl.config.pool import PoolConfig, StallConfig
from unirl.config.run import RunConfig
from unirl.config.validate import declared, validate
from unirl.distributed.group import DevicePool, DevicePoolConfig, DryRunPool, StallPolicy
from unirl.models.sd3 import SD3Bundle, SD3BundleConfig
from unirl.train import TrainStack, TrainStackConfig
from unirl.types import DiffusionSamplingParams

RECIPE = "diffusion/sd3_tiny_trainside"


def _validate(tmp_path: Path, *overrides: str) -> tuple[RunConfig, dict]:
    return validate(compose_recipe(RECIPE, [f"output_dir={tmp_path / 'run'}", *overrides]))


def test_components_name_their_config_class() -> None:
    assert config_class_of(TrainStack) is TrainStackConfig
    assert config_class_of(SD3Bundle) is SD3BundleConfig
    assert config_class_of(TrainStackConfig) is None  # a config is not a component
    assert config_class_of(DiffusionSamplingParams) is None


def test_validate_builds_each_typed_config_once_from_its_block(tmp_path: Path) -> None:
    cfg, objs = _validate(tmp_path, "stack.micro_batch_size=2", "stack.num_updates_per_batch=2")
    assert objs["stack"] == TrainStackConfig(
        micro_batch_size=2, num_updates_per_batch=2, max_grad_norm=1.0, seed=cfg.seed
    )
    assert isinstance(objs["bundle"], SD3BundleConfig) and objs["bundle"].path == "tiny"
    assert isinstance(objs["sampling"], DiffusionSamplingParams)


def test_knobs_left_out_take_the_config_defaults(tmp_path: Path) -> None:
    _, objs = _validate(
        tmp_path,
        "~stack.micro_batch_size",
        "~stack.num_updates_per_batch",
        "~stack.max_grad_norm",
        "~stack.seed",
    )
    assert objs["stack"] == TrainStackConfig()


def test_geometry_uses_the_sampling_default_not_a_copied_one(tmp_path: Path) -> None:
    """Without ``sampling.samples_per_prompt`` the run samples DiffusionSamplingParams'
    default (8) per prompt. The validators used to read the block with a copied default of
    1, so this recipe (1 prompt -> 8 samples -> one micro-batch of 8) was refused as "a
    mini-batch of 1 sample is not divisible by 8" and dry_run printed 1 sample per rollout."""
    cfg, objs = _validate(
        tmp_path, "~sampling.samples_per_prompt", "batch_size=1", "stack.micro_batch_size=8"
    )
    default = DiffusionSamplingParams().samples_per_prompt
    geometry = BatchGeometry.of(cfg, objs)
    assert geometry.samples_per_rollout == default == 8
    assert geometry.micro_batches_per_step == 1
    printed = batch_geometry(cfg, objs)  # what dry_run prints: the same objects
    assert printed["samples_per_rollout"] == 8 and printed["micro_batch_size"] == 8
    assert printed["optimizer_steps_per_rollout"] == objs["stack"].num_updates_per_batch


def test_stack_keys_and_values_are_checked_against_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"stack: unknown key\(s\) \['micro_batchsize'\]"):
        _validate(tmp_path, "+stack.micro_batchsize=2")
    with pytest.raises(
        ConfigError, match=r"stack\.max_grad_norm must be a finite number > 0 or null"
    ):
        _validate(tmp_path, "stack.max_grad_norm=0")


def test_component_config_needs_a_config_class() -> None:
    with pytest.raises(ConfigError, match="DiffusionSamplingParams declares no config_class"):
        component_config(DiffusionSamplingParams, {}, "sampling")
    assert component_config(TrainStack, {"_target_": "x", "micro_batch_size": 2}, "stack") == (
        TrainStackConfig(micro_batch_size=2)
    )


def test_class_knobs_are_read_from_the_class_never_defaulted() -> None:
    """``requires_log_prob`` & co. are declared once, on StageAlgorithm; a validator reads
    them from the recipe's class and refuses a class that declares none (it used to assume
    False here while the trainer assumed True)."""
    from unirl.algorithms import DiffusionNFT, FlowGRPO

    assert declared(FlowGRPO, "requires_log_prob", "algorithm", "StageAlgorithm") is True
    assert declared(DiffusionNFT, "supports_multi_update", "algorithm", "StageAlgorithm") is False
    with pytest.raises(
        ConfigError,
        match=r"^algorithm: TrainStack declares no requires_log_prob; subclass "
        r"unirl\.algorithms\.StageAlgorithm, which declares it with its default$",
    ):
        declared(TrainStack, "requires_log_prob", "algorithm", "unirl.algorithms.StageAlgorithm")


def test_train_stack_knobs_are_its_config_fields() -> None:
    """``TrainStack.__init__`` lists only the sibling roles it is handed; every knob (and its
    default) is a field of TrainStackConfig."""
    params = inspect.signature(TrainStack.__init__).parameters
    assert [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY] == ["backend", "algorithm"]
    assert next(reversed(params.values())).kind is inspect.Parameter.VAR_KEYWORD


# -- the device pool: one field list ---------------------------------------------------------


def _declared(cls: type) -> set[str]:
    return set(inspect.get_annotations(cls))


def test_pool_fields_are_declared_once() -> None:
    pool = {f.name for f in dataclasses.fields(PoolConfig)}
    assert pool == {
        "num_devices",
        "devices_per_node",
        "device",
        "cpus_per_worker",
        "call_timeout_s",
        "heartbeat_timeout_s",
        "stall_factor",
        "stall_floor_s",
    }
    stall = {f.name for f in dataclasses.fields(StallConfig)}
    for cls in (RunConfig, DevicePoolConfig):
        assert issubclass(cls, PoolConfig) and not _declared(cls) & pool, cls
    assert issubclass(StallPolicy, StallConfig) and not _declared(StallPolicy) & stall
    # DevicePool and DryRunPool take the config whole
    for cls in (DevicePool, DryRunPool):
        assert list(inspect.signature(cls.__init__).parameters) == ["self", "config"]


def test_a_runs_pool_config_carries_every_recipe_pool_field() -> None:
    cfg = RunConfig(
        num_devices=4,
        devices_per_node=2,
        cpus_per_worker=2,
        call_timeout_s=60.0,
        heartbeat_timeout_s=None,
        stall_factor=2.0,
        stall_floor_s=10.0,
    )
    pool = DevicePoolConfig.of(cfg)
    for f in dataclasses.fields(PoolConfig):
        assert getattr(pool, f.name) == getattr(cfg, f.name), f.name
    assert (pool.name, pool.log_to_driver) == ("unirl", True)
    assert pool.stall_policy == StallPolicy(
        heartbeat_timeout_s=None, stall_factor=2.0, stall_floor_s=10.0
    )
    assert DevicePoolConfig.of(cfg, name="x", call_timeout_s=5.0).call_timeout_s == 5.0


def test_pool_rules_are_one_and_a_pool_refuses_loose_fields() -> None:
    for build in (RunConfig, DevicePoolConfig):
        with pytest.raises(ConfigError, match="devices_per_node=3 must divide num_devices=4"):
            build(num_devices=4, devices_per_node=3)
        with pytest.raises(ConfigError, match="cpus_per_worker=0 must be an integer >= 1 with"):
            build(cpus_per_worker=0)
        assert build(device="cuda", cpus_per_worker=0).cpus_per_worker == 0  # GPU-only slots
    with pytest.raises(ConfigError, match=r"DryRunPool takes its DevicePoolConfig whole"):
        DryRunPool(4)  # type: ignore[arg-type]
