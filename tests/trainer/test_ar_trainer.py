"""The text trainer's driver side without Ray: the request it authors, what it refuses
before any Ray work, response metrics, its text gallery, the dry run, and a full
fine-tuning checkpoint of a model with tied embeddings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.run import RunConfig
from unirl.config.validate import validate
from unirl.trainer.ar import ARTrainer, check_ar_recipe, response_metrics
from unirl.types import RolloutTrack, TextRequest, Texts

RECIPE = "llm/qwen3_tiny_grpo"
ROOT = Path(__file__).resolve().parents[2]


def trainer(tmp_path: Path, *overrides: str) -> ARTrainer:
    data = compose_recipe(RECIPE, [f"output_dir={tmp_path / 'run'}", *overrides])
    cfg, _ = validate(data)
    return ARTrainer(cfg, data)


def test_request_ids_groups_and_text_block(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    prompts = t.data_source.next_batch()
    req = t.build_request(prompts, 3)
    n = 8 * 8
    assert torch.equal(req.sample_ids, torch.arange(3 * n, 4 * n))
    assert torch.equal(req.group_ids, torch.arange(24, 32).repeat_interleave(8))
    assert req.prompts[:8] == [prompts[0].prompt] * 8
    assert req.metadata[0]["answer"] == prompts[0].metadata["answer"]
    block = req.params_for("text", TextRequest)
    assert torch.equal(block.seed_ids, req.sample_ids)
    assert (block.max_new_tokens, block.temperature, block.stop) == (6, 1.0, ("}",))
    shards = req.chunk(2)  # the DP scatter keeps each sample's block row and the knobs
    assert torch.equal(shards[1].params_for("text", TextRequest).seed_ids, req.sample_ids[n // 2 :])
    ev = t.build_request(prompts[:2], 3, mode="eval")
    assert ev.params_for("text", TextRequest).temperature == 0.0  # greedy eval
    assert int(ev.sample_ids[0]) >= 10**12 and len(ev) == 2


def test_refused_before_any_ray_work(tmp_path: Path) -> None:
    data = compose_recipe(RECIPE, [f"output_dir={tmp_path / 'run'}"])
    cfg = RunConfig.from_dict(data)
    cfg.sampling = {"_target_": "unirl.types.DiffusionSamplingParams"}
    with pytest.raises(ConfigError, match=r"unirl\.types\.ARSamplingParams"):
        check_ar_recipe(cfg)
    cfg = RunConfig.from_dict(data)
    cfg.rollout = {"_target_": "unirl.rollout.DedicatedEngine"}
    with pytest.raises(ConfigError, match="places the trainside engine"):
        check_ar_recipe(cfg)


def test_response_metrics_and_text_gallery(tmp_path: Path) -> None:
    track = RolloutTrack(
        sample_ids=torch.arange(3),
        group_ids=torch.zeros(3, dtype=torch.long),
        prompts=["a", "b", "c"],
        metadata=[
            {"response_tokens": 2, "finish_reason": "stop", "answer": "1"},
            {"response_tokens": 6, "finish_reason": "length"},
            {"response_tokens": 4, "finish_reason": "stop"},
        ],
        decoded=Texts(texts=["x}", "yyyyyy", "zz}"]),
        rewards=torch.tensor([1.0, 0.0, 0.5]),
    )
    m = response_metrics(track)
    assert m == {
        "response_length/mean": 4.0,
        "response_length/min": 2.0,
        "response_length/max": 6.0,
        "response/clip_ratio": pytest.approx(1 / 3),
    }
    path = trainer(tmp_path).gallery(tmp_path / "samples" / "rollout_000001.png", track, 2)
    assert path.name == "rollout_000001.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["completion"] for r in rows] == ["x}", "yyyyyy"]
    assert rows[0] | {"reward": None} == {
        "sample_id": 0,
        "prompt": "a",
        "completion": "x}",
        "reward": None,
        "answer": "1",
        "response_tokens": 2,
        "finish_reason": "stop",
    }


def test_cli_dry_run_prints_the_text_geometry(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "unirl.train_vlm",
            f"--config-name={RECIPE}",
            "dry_run=true",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "no Ray started" in out.stdout and "max_tokens_per_micro_batch   1024" in out.stdout
    assert "max_new_tokens               6" in out.stdout


def test_full_fine_tuning_checkpoint_round_trips_tied_embeddings(tmp_path: Path) -> None:
    from unirl.models.qwen3 import Qwen3Bundle
    from unirl.train import FSDPBackend

    def backend() -> FSDPBackend:
        bundle = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
        return FSDPBackend(bundle=bundle, lora=None, param_dtype="fp32", trainable_attr="model")

    first = backend()
    model = first.module
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)
    first.save_checkpoint(tmp_path / "ckpt")
    second = backend()
    second.load_checkpoint(tmp_path / "ckpt")
    loaded = second.module
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # still tied
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, atol=0, rtol=0)
