"""``dry_run`` plans by placing: the rows it prints are the trainer's own ``place_roles`` on a
plan-only pool, so they equal what the real run places, role for role, target for target and
rank for rank. Here a real Ray pool places each domain's tiny recipe (the roles are built: tiny
models, no rollout) and its plan is compared with the dry run's."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from unirl.config.entry import compose_recipe
from unirl.config.entrypoint import ENTRYPOINT_OF_FOLDER
from unirl.distributed.group import DevicePool, DevicePoolConfig, DryRunPool

SLOW = pytest.mark.skipif(
    not os.environ.get("UNIRL_SLOW"), reason="15-35 s each; UNIRL_SLOW=1 runs them"
)
# diffusion, text and unified in CI; the other layouts and families with UNIRL_SLOW=1 (each passed
# when this test was written: 7 recipes, 150 s on 2 cores)
RECIPES = [
    pytest.param("diffusion/sd3_tiny_trainside", [], id="sd3_tiny_trainside"),
    pytest.param("diffusion/sd3_tiny_dedicated_separate", [], id="dedicated", marks=SLOW),
    pytest.param("diffusion/sd3_tiny_nft", [], id="nft", marks=SLOW),
    pytest.param("llm/qwen3_tiny_grpo", [], id="qwen3_tiny_grpo"),
    pytest.param("vlm/qwen_vl_tiny_grpo", [], id="qwen_vl_tiny_grpo", marks=SLOW),
    pytest.param("pe/pe_tiny_train_both", [], id="pe_tiny_train_both", marks=SLOW),
    pytest.param("unified_model/unified_tiny", [], id="unified_tiny"),
    pytest.param("unified_model/janus_tiny_t2i_r1", [], id="janus_tiny", marks=SLOW),
]


def _trainer(recipe: str, tmp_path: Path, *, dry: bool, extra: list[str]):
    entry = importlib.import_module(ENTRYPOINT_OF_FOLDER[recipe.split("/")[0]])
    data = compose_recipe(recipe, [f"output_dir={tmp_path / 'run'}", *extra])
    return entry.trainer(data, dry=dry)


@pytest.mark.parametrize(("recipe", "extra"), RECIPES)
def test_the_real_placement_is_the_dry_runs_plan(
    recipe: str, extra: list[str], tmp_path: Path, ray_session: None
) -> None:
    planned = _trainer(recipe, tmp_path, dry=True, extra=extra).planned()
    assert not (tmp_path / "run").exists()
    trainer = _trainer(recipe, tmp_path, dry=False, extra=extra)
    pool = DevicePool(DevicePoolConfig.of(trainer.cfg))
    try:
        trainer.place(pool)  # the real roles, then what the driver reads from them
        placed = pool.plan_rows()
    finally:
        pool.shutdown()
    assert placed == planned
    # which rollouts need the weights switched: NFT samples train rollouts with its old
    # adapter; nothing else here switches (no begin/end_sampling calls around its rollouts)
    switches = {s.sampling_switches for s in trainer.trained}
    assert switches == ({("train",)} if recipe.endswith("_nft") else {()})
    assert {role for role, _, _ in placed} >= {"reward", "rollout"}


def test_a_plan_only_pool_records_groups_and_refuses_calls() -> None:
    from unirl.distributed.group import placement, remote
    from unirl.trainer.roles import RewardWorker

    pool = DryRunPool(DevicePoolConfig(num_devices=2, device="cpu"))
    pool.init_process_group((0, 1), group_name="world")
    with placement(pool, fraction=1.0):
        handle = remote(RewardWorker, name="reward", service={"_target_": "x.Y"})
    assert pool.plan_rows() == [
        ("group:world", "torch.distributed", "pool ranks 0-1"),
        ("reward", "unirl.trainer.roles.RewardWorker (service=x.Y)", "pool ranks 0-1 dp=2"),
    ]
    with pytest.raises(AttributeError, match="has no @distributed method 'score'"):
        handle.score(None)  # a planned role has no worker behind it
