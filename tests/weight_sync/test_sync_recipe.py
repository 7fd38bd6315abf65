"""The recipe end to end through ``python -m unirl.train_diffusion``'s code path: the separate
tiny run syncs before every rollout (eval pushes the EMA weights, the next train rollout
re-syncs), logs ``sync/*``; a wrong ``name_remap`` fails the first sync naming the tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sync_fakes import RECIPE

from unirl.config.entry import compose_recipe


def _run(overrides: list[str]) -> int:
    from unirl.train_diffusion import run

    return run(compose_recipe(RECIPE, overrides))


def test_tiny_dedicated_separate_recipe_runs_and_logs_syncs(tmp_path: Path, ray_session) -> None:
    out = tmp_path / "run"
    code = _run(
        [
            f"output_dir={out}",
            "num_rollouts=3",
            "eval_interval=2",
            "save_interval=0",
            "logging.gallery_interval=0",
        ]
    )
    assert code == 0
    rows = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["sync/num_tensors"] == 24  # 12 adapted layers (block 0 has attn + attn2) x (A, B)
        assert r["sync/trainer_digest"] == r["sync/engine_digest"]
        assert r["train/ratio/min"] == 1.0 == r["train/ratio/max"]
    # rollouts 0 and 2 follow an eval (the baseline at step 0, then after rollout 2): the eval
    # sync (EMA weights) + the re-sync of the trained weights
    assert [r["sync/syncs_since_last_log"] for r in rows] == [2.0, 1.0, 2.0]
    assert [r["sync/forced"] for r in rows] == [1.0, 0.0, 1.0]
    assert len({r["sync/trainer_digest"] for r in rows}) == 3
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file()


def test_wrong_name_remap_fails_the_first_sync(tmp_path: Path, ray_session) -> None:
    from unirl.distributed.group import RemoteCallError

    overrides = [
        f"output_dir={tmp_path / 'bad'}",
        "num_rollouts=2",
        "eval_interval=0",
        "save_interval=0",
        "sync.name_remap=[{prefix: transformer_blocks., to: blocks.}]",
    ]
    with pytest.raises(RemoteCallError) as info:
        _run(overrides)
    message = str(info.value)
    assert "method 'prepare_sync'" in message
    assert "zero parameters would be updated" in message
    assert (
        "Unmatched parameters: blocks.0.attn.to_q.lora_A.weight (trainer: transformer_blocks.0.attn.to_q.lora_A.weight)"
        in message
    )
    assert (
        not (tmp_path / "bad" / "metrics.jsonl").exists()
        or not (tmp_path / "bad" / "metrics.jsonl").read_text().strip()
    )
