"""Separate layout on CPU (gloo): 1 train worker + 1 rollout worker with the tiny preset,
several rollouts with LoRA sync (Ray object store), with full sync (bucketed broadcast
over the dedicated gloo group) and with full sync as checksummed tensor buckets. After every sync an independent read of the trainer's live
weights equals the engine's read-back; every rollout's first update has ratio exactly 1
(the engine's log-probs equal the trainer's replay, so the engine sampled with the synced
weights); and one more update without a sync makes them differ (the check can fail)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sync_fakes import RECIPE

from unirl.config.entry import compose_recipe
from unirl.config.validate import validate
from unirl.distributed.group import DevicePool, DevicePoolConfig
from unirl.trainer.diffusion import DiffusionTrainer

ROLLOUTS = 3


def _first(values: list[Any]) -> Any:
    return next(v for v in values if v is not None)


def _train_with_checks(tmp_path: Path, overrides: list[str]) -> dict[str, Any]:
    data = compose_recipe(
        RECIPE, [f"output_dir={tmp_path}", "logging.gallery_interval=0", *overrides]
    )
    cfg, _ = validate(data)
    trainer = DiffusionTrainer(cfg, data)
    pool = DevicePool(DevicePoolConfig.of(cfg, call_timeout_s=300, log_to_driver=False))
    seen: list[dict[str, int]] = []
    try:
        trainer.place(pool)  # the recipe's placement: dedicated engine on its own slab
        layout = trainer.dedicated
        roles = layout.roles
        assert roles.engine.pool_ranks != roles.backend.pool_ranks  # disjoint slabs
        driver, run = layout.driver, layout.driver.run

        def run_and_check(**kwargs: Any) -> dict[str, float]:
            metrics = run(**kwargs)
            live = _first(roles.source.trainer_checksums(driver.manifest))
            engine = roles.engine.checksums()
            assert engine == [live], (
                "engine copy differs from the trainer's live weights after a sync"
            )
            seen.append(live)
            return metrics

        driver.run = run_and_check
        rows = []
        for k in range(ROLLOUTS):
            rows.append(trainer.one_rollout(k))  # the loop's turn, sync/* metrics included
        stale = roles.engine.checksums()[0]
        live_now = _first(roles.source.trainer_checksums(driver.manifest))
        return {
            "rows": rows,
            "seen": seen,
            "stale": stale,
            "live_now": live_now,
            "manifest": driver.manifest,
            "transport": driver.transport,
        }
    finally:
        pool.shutdown()


@pytest.mark.parametrize(
    ("kind", "overrides", "transport"),
    [
        ("lora", [], "object_store"),
        (
            "full",
            [
                "backend.lora=null",
                "sync._target_=unirl.distributed.weight_sync.FullSync",
                "backend.optimizer.lr=1.0e-4",
            ],
            "collective",
        ),
        (
            "full",
            [
                "backend.lora=null",
                "sync._target_=unirl.distributed.weight_sync.FullSync",
                "sync.transport=tensor",
                "+sync.bucket_mb=0.01",
                "backend.optimizer.lr=1.0e-4",
            ],
            "tensor",
        ),
    ],
)
def test_separate_layout_trains_and_syncs(
    tmp_path: Path, ray_session, kind, overrides, transport
) -> None:
    out = _train_with_checks(tmp_path / kind, overrides)
    rows, seen, manifest = out["rows"], out["seen"], out["manifest"]
    assert manifest.kind == kind and out["transport"] == transport
    assert len(seen) == ROLLOUTS  # forced first sync + one per interval
    assert all(seen[i] != seen[i + 1] for i in range(len(seen) - 1)), (
        "the trainer's weights did not change"
    )
    assert (
        out["stale"] == seen[-1] and out["live_now"] != out["stale"]
    )  # one update later, no sync: differ
    for k, row in enumerate(rows):
        assert row["sync/num_tensors"] == len(manifest.entries) > 0
        assert row["sync/bytes"] == manifest.wire_bytes() > 0
        assert row["sync/time_s"] > 0
        assert row["sync/trainer_digest"] == row["sync/engine_digest"]
        assert row["sync/forced"] == (1.0 if k == 0 else 0.0)
        assert row["train/ratio/min"] == 1.0 == row["train/ratio/max"], row["train/ratio/mean"]
