"""The benchmark CLI on the tiny presets (CPU): it runs, counts FLOPs and writes its JSON,
for a diffusion recipe (DiffusionTrainer) and a text recipe (ARTrainer, token figures).

The JSONs are kept as artifacts of the test run in ``outputs/ci-artifacts/bench_cpu*.json``;
timings are recorded, never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from unirl.tools.bench import (
    GENERATED_TOKENS,
    PROMPT_TOKENS,
    TRAINED_TOKENS,
    is_text_recipe,
    summarize,
    text_throughput,
    token_counts,
)

ARTIFACT = Path(__file__).resolve().parents[2] / "outputs" / "ci-artifacts" / "bench_cpu.json"
TEXT_ARTIFACT = ARTIFACT.with_name("bench_cpu_text.json")


def test_bench_cli_on_tiny_cpu(tmp_path: Path) -> None:
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "unirl.tools.bench",
        "--config-name=diffusion/sd3_tiny_trainside",
        "--warmup",
        "1",
        "--iters",
        "2",
        "--json",
        str(ARTIFACT),
        "--profile",
        str(tmp_path / "profile"),
        f"output_dir={tmp_path / 'bench'}",
    ]
    env = {**os.environ, "RAY_ADDRESS": ""}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads(ARTIFACT.read_text())
    assert data["timed_rollouts"] == 2 and data["samples_per_rollout"] == 8
    assert data["samples_per_s"] > 0
    assert set(data["seconds_per_phase"]) >= {
        "text_encode",
        "rollout",
        "decode",
        "reward",
        "old_logp",
        "train",
        "sync",
    }
    flops = data["flops"]
    # counted, and consistent: the transformer is part of the rollout; training is all transformer
    assert 0 < flops["rollout_transformer"] < flops["rollout_total"]
    assert flops["train_total"] > 0 and flops["samples"] == 8
    assert data["peak_memory_gib"] == [0.0]  # CPU
    # --profile: one more rollout under torch.profiler; the worker's trace and its summary
    (worker,) = data["profile"]["workers"]
    assert (tmp_path / "profile" / "trace_rank0.json.gz").stat().st_size > 0
    assert json.loads((tmp_path / "profile" / "summary.json").read_text()) == data["profile"]
    ranges = worker["ranges"]
    for phase in ("text_encode", "denoise", "decode", "reward", "train/prepare"):
        assert ranges[f"unirl/{phase}"]["calls"] == 1, phase
    slots = ranges["unirl/train/backward"]["calls"]  # one per trained step of each micro-batch
    assert slots > 0 and ranges["unirl/train/policy_forward"]["calls"] == slots
    assert "unirl/train/reference" not in ranges  # the recipe's KL is off (beta 0)
    assert ranges["unirl/train/optimizer_step"]["calls"] == 1
    assert worker["device_events"] == 0 and worker["gpu_busy_ms"] == 0.0  # CPU
    print(f"bench JSON kept at {ARTIFACT}: {data['samples_per_s']:.2f} samples/s")


def test_bench_cli_on_tiny_text_recipe(tmp_path: Path) -> None:
    """llm/qwen3_tiny_grpo through ARTrainer: the token counts equal what the run logged and
    what the bundle's own tokenizer makes of the prompts; the rates are counts over phases."""
    TEXT_ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    out_dir = tmp_path / "bench"
    cmd = [
        sys.executable,
        "-m",
        "unirl.tools.bench",
        "--config-name=llm/qwen3_tiny_grpo",
        "--warmup",
        "1",
        "--iters",
        "1",
        "--json",
        str(TEXT_ARTIFACT),
        f"output_dir={out_dir}",
    ]
    env = {**os.environ, "RAY_ADDRESS": ""}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads(TEXT_ARTIFACT.read_text())
    assert data["timed_rollouts"] == 1 and data["samples_per_rollout"] == 64
    assert set(data["seconds_per_phase"]) == {
        "encode",
        "generate",
        "rollout",
        "reward",
        "old_logp",
        "train",
        "sync",
        "total",
    }
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x]
    timed = rows[1]  # the one timed rollout (index 1)
    tokens = data["tokens_per_rollout"]
    assert tokens["generated"] == timed["response_length/mean"] * 64 == timed[GENERATED_TOKENS]
    assert data["response_clip_ratio"] == timed["response/clip_ratio"]
    # prompt tokens: rollout 1 serves the file's prompts 8..15 (no shuffle), 8 samples each
    from unirl.data import read_prompt_file
    from unirl.models.qwen3 import Qwen3Bundle

    root = Path(__file__).resolve().parents[2]
    prompts = [p.prompt for p in read_prompt_file(root / "datasets/arithmetic/easy.jsonl")][8:16]
    bundle = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu", response_prefix="\\boxed{")
    expected_prompt = 8 * sum(len(ids) for ids in bundle.encode_prompts(prompts))
    assert tokens["prompt"] == expected_prompt
    assert tokens["trained"] == expected_prompt + tokens["generated"]
    phases = data["seconds_per_phase"]
    assert data["generated_tokens_per_s"] == pytest.approx(
        tokens["generated"] / phases["rollout"], rel=1e-12
    )
    assert data["trained_tokens_per_s"] == pytest.approx(
        tokens["trained"] / phases["train"], rel=1e-12
    )
    assert 0 < phases["old_logp"] < phases["train"]
    assert data["flops"]["train_total"] > 0 and data["flops"]["samples"] == 64
    assert data["peak_memory_gib"] == [0.0]  # CPU
    print(f"text bench JSON kept at {TEXT_ARTIFACT}: {data['trained_tokens_per_s']:.0f} tok/s")


def test_text_recipes_are_told_apart_by_their_sampling_block() -> None:
    assert is_text_recipe({"sampling": {"_target_": "unirl.types.ARSamplingParams"}})
    assert not is_text_recipe({"sampling": {"_target_": "unirl.types.SamplingParams"}})
    assert not is_text_recipe({})


def test_token_counts_of_a_track() -> None:
    meta = [{"response_tokens": 3}, {"response_tokens": 5}]
    lengths = torch.tensor([10, 12])  # 7 + 3 and 7 + 5: prompts of 7 tokens
    track = SimpleNamespace(
        metadata=meta, segment=SimpleNamespace(tokens=SimpleNamespace(lengths=lengths))
    )
    assert token_counts(track) == {GENERATED_TOKENS: 8.0, TRAINED_TOKENS: 22.0, PROMPT_TOKENS: 14.0}
    parked = SimpleNamespace(metadata=meta, segment=None)  # the segment stayed on its worker
    assert token_counts(parked) == {GENERATED_TOKENS: 8.0}


def _row(total: float, **extra: float) -> dict[str, float]:
    return {"time/total": total, "reward/mean": 0.5, "samples": 4, **extra}


def test_text_throughput_divides_counts_by_phases() -> None:
    rows = [
        _row(
            9.0,
            **{
                "time/rollout_call": 2.0,
                "time/generate": 1.6,
                "time/train": 4.0,
                "train/time/old_logp": 1.0,
                "response/clip_ratio": 0.25,
                GENERATED_TOKENS: 40.0,
                TRAINED_TOKENS: 120.0,
                PROMPT_TOKENS: 80.0,
            },
        ),
        _row(
            7.0,
            **{
                "time/rollout_call": 4.0,
                "time/generate": 3.2,
                "time/train": 2.0,
                "train/time/old_logp": 0.0,
                "response/clip_ratio": 0.75,
                GENERATED_TOKENS: 80.0,
                TRAINED_TOKENS: 200.0,
                PROMPT_TOKENS: 120.0,
            },
        ),
    ]
    out = summarize(
        rows, warmup=0, num_devices=1, flops=None, memory=None, peak_tflops=None,
        device_name="cpu", text=True,
    )  # fmt: skip
    # means over the timed rows: 60 generated, 160 trained, 100 prompt tokens per rollout;
    # rollout 3 s, generate 2.4 s, train 3 s, old_logp 0.5 s
    assert out["tokens_per_rollout"] == {"prompt": 100.0, "generated": 60.0, "trained": 160.0}
    assert out["generated_tokens_per_s"] == 20.0
    assert out["generated_tokens_per_s_in_generate"] == pytest.approx(25.0, rel=1e-12)
    assert out["trained_tokens_per_s"] == pytest.approx(160.0 / 3.0, rel=1e-12)
    assert out["trained_tokens_per_s_without_old_logp"] == 64.0
    assert out["prompt_tokens_per_sample"] == 25.0 and out["generated_tokens_per_sample"] == 15.0
    assert out["response_clip_ratio"] == 0.5
    assert out["seconds_per_phase"]["rollout"] == 3.0
    # rows without trained counts (segments parked on the workers): no made-up figure
    parked = [
        {k: v for k, v in r.items() if k not in (TRAINED_TOKENS, PROMPT_TOKENS)} for r in rows
    ]
    figures = text_throughput(parked, out["seconds_per_phase"])
    assert figures["trained_tokens_per_s"] is None and figures["generated_tokens_per_s"] == 20.0


def test_diffusion_summary_keeps_its_keys() -> None:
    rows = [_row(2.0, **{"time/rollout": 1.0, "time/train": 0.5}) for _ in range(2)]
    out = summarize(
        rows, warmup=1, num_devices=1, flops=None, memory=[{"peak_allocated_gib": 1.5}],
        peak_tflops=None, device_name="cpu",
    )  # fmt: skip
    assert set(out) == {
        "device",
        "num_devices",
        "timed_rollouts",
        "samples_per_rollout",
        "samples_per_s",
        "samples_per_s_per_device",
        "seconds_per_phase",
        "compile_and_warmup_s",
        "reward_mean_last",
        "peak_memory_gib",
    }
    assert set(out["seconds_per_phase"]) == {
        "text_encode", "rollout", "decode", "reward", "old_logp", "train", "sync", "total",
    }  # fmt: skip
    assert out["samples_per_s"] == 2.0 and out["compile_and_warmup_s"] == 2.0


def test_reward_overlap_metrics_are_averaged_over_the_timed_rollouts() -> None:
    """A run with ``rollout.reward_overlap`` logs its scorer's latency and wait under the
    stage's prefix; the JSON holds their means over the timed rollouts (the warm-up left out)."""
    rows = [
        _row(
            2.0, **{"diffusion/reward_overlap/latency_s": lat, "diffusion/reward_overlap/wait_s": w}
        )
        for lat, w in ((9.0, 9.0), (3.0, 1.0), (5.0, 0.0))
    ]
    out = summarize(
        rows, warmup=1, num_devices=1, flops=None, memory=None, peak_tflops=None,
        device_name="cpu",
    )  # fmt: skip
    assert out["reward_overlap"] == {"latency_s": 4.0, "wait_s": 0.5}


def test_graphs_compiled_in_the_timed_rollouts_are_counted() -> None:
    """The stacks' ``compile/new_graphs`` of the timed rollouts is summed into the JSON (call 27
    of docs/performance.md compiled 15 graphs inside its timed step, which the JSON did not
    say); the warm-up's compile is left out, and an eager run has no such key."""
    rows = [_row(2.0, **{"train/compile/new_graphs": n}) for n in (30.0, 0.0, 15.0)]
    summary = dict(
        warmup=1, num_devices=1, flops=None, memory=None, peak_tflops=None, device_name="cpu"
    )
    assert summarize(rows, **summary)["graphs_compiled_in_timed_rollouts"] == 15.0  # type: ignore[arg-type]
    eager = summarize([_row(2.0) for _ in range(3)], **summary)  # type: ignore[arg-type]
    assert "graphs_compiled_in_timed_rollouts" not in eager


def test_a_failed_flop_pass_is_reported_not_raised() -> None:
    """The FLOP pass runs after the timed rollouts: its failure comes back as one line (the
    JSON keeps the timings, the CLI exits 1), a working pass gives its counts."""
    from unirl.tools.bench import count_flops_or_error

    class Trainer:
        data_source = SimpleNamespace(next_batch=lambda: ["a prompt"])

        def build_request(self, prompts: list[str], rollout_index: int) -> tuple:
            return (tuple(prompts), rollout_index)

    class Ops:
        def __init__(self, error: Exception | None) -> None:
            self.error, self.seen = error, []

        def count_flops(self, req: tuple, rollout_index: int) -> list[dict[str, float]]:
            self.seen.append((req, rollout_index))
            if self.error is not None:
                raise self.error
            return [{"rollout_total": 2.0}]

    good = Ops(None)
    assert count_flops_or_error(Trainer(), good, 7) == ([{"rollout_total": 2.0}], None)
    assert good.seen == [((("a prompt",), 7), 7)]
    bad = Ops(AssertionError("sdpa_flop_count: query/key/value shapes are incompatible\nmore"))
    assert count_flops_or_error(Trainer(), bad, 7) == (
        None,
        "AssertionError: sdpa_flop_count: query/key/value shapes are incompatible",
    )
