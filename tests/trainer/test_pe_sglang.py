"""The prompt enhancer with its policy served by SGLang, against the fake SGLang text server of
``test_ar_sglang_adapter`` (the tiny Qwen3 behind SGLang's JSON) and the tiny SD3 drawer.

In process: the composed engine samples the rewrites through ``SGLangLLMEngine`` and draws
them (lineage, what the server was sent, determinism per id), and one turn of the loop on it
(the image reward reaches each rewrite by its mean, advantages per track in their own groups).
Through Ray: the tiny PE recipe with ``rollout: SGLangLLMEngine`` on the served layout,
colocated and separate, and with a trained drawer on its own dedicated engine (two tracks,
two syncs); LoRA syncs to the server and the dedicated drawer on the separate layout under
UNIRL_SLOW=1. The fake records what each update delivered, and its digest equals the
trainer's."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_ar_sglang_adapter import FakeTextServer
from trainer_fakes import IdleOps, QuietAlgorithm, RecordingStack, served_text_rollout

from unirl.config.entry import compose_recipe
from unirl.config.run import AdvantageConfig, RunConfig
from unirl.distributed.weight_sync.checksum import digest, tensor_checksum
from unirl.rollout.engine.composed import ComposedEngine, clean_rewrite
from unirl.rollout.engine.sglang_llm import SGLangLLMEngine
from unirl.trainer.pe import DrawerInfo, PETrainer
from unirl.trainer.pe_config import IMAGE_TRACK, TEXT_TRACK, DrawerConfig, PEConfig
from unirl.trainer.roles import RewardWorker
from unirl.trainer.stage import order_stages
from unirl.types import ARSamplingParams, DiffusionRequest, DiffusionSamplingParams

PREFIX = "<think>\n\n</think>\n\n"
POLICY = {
    "_target_": "unirl.models.qwen3.Qwen3Bundle",
    "path": "tiny",
    "dtype": "fp32",
    "chat_template": True,
    "response_prefix": PREFIX,
}
PROMPTS = ["a red cube on a table", "a quiet lake at dawn"]
EPS = 1e-4


def _drawer() -> Any:
    from unirl.models.sd3 import SD3Bundle, SD3Pipeline
    from unirl.sde import ODE

    bundle = SD3Bundle(
        path="tiny",
        dtype="fp32",
        text_encoder_dtype="fp32",
        vae_dtype="fp32",
        device="cpu",
        max_sequence_length=32,
    )
    return SD3Pipeline(bundle=bundle, strategy=ODE(), storage_dtype="fp32")


def _served(server: FakeTextServer, drawer: Any) -> ComposedEngine:
    text = SGLangLLMEngine(
        model_path="tiny", bundle=POLICY, launch=False, dtype="fp32", client=server
    )
    return ComposedEngine(
        text_sampler=text, image_sampler=drawer, max_rewrite_chars=40, resident=False
    )


def _trainer(drawer: Any, *, reduce: str = "mean") -> PETrainer:
    """The PE driver without Ray: 2 prompts x 2 rewrites x 2 images, 64x64, 4 ODE steps."""
    trainer = PETrainer.__new__(PETrainer)
    trainer.cfg = RunConfig(
        seed=3,
        batch_size=2,
        advantage=AdvantageConfig(scope="group", std="group", eps=EPS, clip=5.0),
    )
    trainer.cfg.logging.gallery_interval = 0
    trainer.composed = PEConfig(
        diffusion=DrawerConfig(bundle={}, pipeline={}, sampling={}),
        reduce=reduce,  # type: ignore[arg-type]
        train_both=True,
    )
    trainer.sampling = ARSamplingParams(samples_per_prompt=2, max_new_tokens=6, temperature=1.0)
    trainer.child_sampling = DiffusionSamplingParams(
        samples_per_prompt=2,
        num_inference_steps=4,
        eval_num_inference_steps=4,
        guidance_scale=4.5,
        height=64,
        width=64,
        eta=0.0,
        max_sequence_length=32,
    )
    facts = DrawerInfo(pipeline=drawer).describe(trainer.child_sampling)
    trainer.latent_shape = facts["latent_shape"]
    trainer.schedules = {mode: s.cpu() for mode, s in facts["sigmas"].items()}
    trainer.trains_sde_steps = False
    from unirl.sde.sde_steps import AllSteps

    trainer.sde_steps = AllSteps()
    return trainer


def _prompts() -> list[Any]:
    return [SimpleNamespace(prompt=p, metadata={"p": i}) for i, p in enumerate(PROMPTS)]


def test_the_composed_engine_samples_rewrites_on_the_server_and_draws_them() -> None:
    drawer = _drawer()
    trainer = _trainer(drawer)
    req = trainer.build_request(_prompts(), 1)
    server = FakeTextServer()
    engine = _served(server, drawer)
    resp = engine.generate(req)
    parent, child = resp.tracks[TEXT_TRACK], resp.tracks[IMAGE_TRACK]

    # the server was sent the prompts as the trained bundle formats them, one seed per sample
    (ids, params), *more = server.requests
    assert not more and ids == engine.text_sampler.formatter.encode_prompts(req.prompts)
    assert len({p["sampling_seed"] for p in params}) == 4
    assert engine.response_prefix == PREFIX
    # the parent: the policy's track (ids, groups, the server's log-probs), rewrites cleaned
    assert parent.sample_ids.tolist() == [4, 5, 6, 7]
    assert parent.group_ids.tolist() == [2, 2, 3, 3]
    assert parent.segment is not None and parent.segment.log_probs.values.numel() > 0
    for text, meta in zip(parent.decoded.texts, parent.metadata, strict=True):
        assert text.startswith(PREFIX)
        rewrite, capped = clean_rewrite(text[len(PREFIX) :], 40)
        assert (meta["rewrite"], meta["rewrite_capped"]) == (rewrite, capped)
    # the child: k = 2 images per rewrite, lineage to it, the user's prompt, the drawn rewrite
    draw = req.params_for(IMAGE_TRACK, DiffusionRequest)
    assert child.sample_ids.tolist() == draw.sample_ids.reshape(-1).tolist()
    assert child.parent_track == TEXT_TRACK
    assert child.parent_ids.tolist() == [4, 4, 5, 5, 6, 6, 7, 7]
    assert child.group_ids.tolist() == child.parent_ids.tolist()
    assert child.prompts == [PROMPTS[0]] * 4 + [PROMPTS[1]] * 4
    rewrites = [m["rewrite"] for m in parent.metadata]
    for i, meta in enumerate(child.metadata):
        assert meta["rewrite"] == (rewrites[i // 2] or child.prompts[i])
    assert child.decoded.pixels.shape == (8, 3, 64, 64)
    assert set(resp.timings) >= {"pe/generate", "pe/encode", "pe/compose", "diffusion/rollout"}

    # a fresh server and engine given the second data-parallel shard (the second prompt):
    # the same ids give the same rewrites (bit for bit) and images as in the whole request
    half = _served(FakeTextServer(), drawer).generate(req.chunk(2)[1])
    assert half.tracks[TEXT_TRACK].decoded.texts == parent.decoded.texts[2:]
    assert half.tracks[IMAGE_TRACK].parent_ids.tolist() == [6, 6, 7, 7]
    # (fp32 CPU kernels at another batch size: equal to 1e-5, not bit for bit; 7e-7 seen)
    torch.testing.assert_close(
        half.tracks[IMAGE_TRACK].decoded.pixels, child.decoded.pixels[4:], atol=1e-5, rtol=0
    )
    # the engine never samples on a sleeping server (the layout wakes it first)
    engine.text_sampler.asleep = True
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(req)


def _group_advantages(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` per group, clipped to 5, in float64, as float32."""
    values = values.double()
    out = torch.zeros_like(values)
    for g in groups.unique():
        rows = groups == g
        v = values[rows]
        out[rows] = ((v - v.mean()) / (v.std(unbiased=False) + EPS)).clamp(-5.0, 5.0)
    return out.float()


def test_one_turn_of_the_loop_propagates_the_image_reward_and_scores_each_track() -> None:
    drawer = _drawer()
    trainer = _trainer(drawer)
    trainer.rollout = _served(FakeTextServer(), drawer)
    trainer.data_source = SimpleNamespace(next_batch=_prompts, epoch=0)
    reward = RewardWorker(
        service={
            "_target_": "unirl.reward.RewardService",
            "backend": {"_target_": "unirl.reward.local.BrightnessTarget", "target": 0.8},
        }
    )
    stacks = {TEXT_TRACK: RecordingStack(), IMAGE_TRACK: RecordingStack()}
    roles = {
        t: {"stack": s, "algorithm": QuietAlgorithm(), "ops": IdleOps()} for t, s in stacks.items()
    }
    trainer.stages = order_stages(
        trainer.make_stages(roles[TEXT_TRACK], roles[IMAGE_TRACK], reward)
    )
    metrics = trainer.one_rollout(0)

    child, parent = stacks[IMAGE_TRACK].seen, stacks[TEXT_TRACK].seen
    assert child is not None and parent is not None
    assert child.rewards is not None and parent.rewards is not None
    assert bool((child.rewards < 0).all())  # brightness of random tiny-SD3 images below 0.8
    # a rewrite's reward: the mean of its two images' (the engine's lineage, exactly)
    assert parent.rewards.tolist() == child.rewards.view(4, 2).mean(dim=1).tolist()
    # advantages per track: rewrites within their prompt's group, images within their rewrite's
    torch.testing.assert_close(
        parent.advantages, _group_advantages(parent.rewards, parent.group_ids), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        child.advantages, _group_advantages(child.rewards, child.group_ids), atol=1e-6, rtol=0
    )
    assert child.group_ids.tolist() == child.parent_ids.tolist()
    assert metrics["pe/reward/mean"] == pytest.approx(metrics["reward/mean"], abs=1e-6)
    assert metrics["pe/response_length/mean"] > 0 and metrics["pe/empty_rewrites"] >= 0


# -- through Ray: the served layout with its weight sync -----------------------------------------


class RecordingTextServer(FakeTextServer):
    """The fake server, writing one JSON line per update it receives to ``log``: full weights
    (names, per-tensor checksums' digest) or an adapter loaded from its peft folder."""

    def __init__(self, *, log: str) -> None:
        super().__init__()
        self.log = log

    def _record(self, row: dict[str, Any]) -> None:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def update_weights_from_tensor(self, named: list[tuple[str, torch.Tensor]], *, tp_size: int):
        sums = {n: tensor_checksum(t) for n, t in named}
        self._record({"kind": "full", "names": sorted(sums), "digest": digest(sums)})
        return super().update_weights_from_tensor(named, tp_size=tp_size)

    def load_lora_adapter(self, name: str, path: str) -> dict:
        from safetensors.torch import load_file

        tensors = load_file(str(Path(path) / "adapter_model.safetensors"))
        prefix = "base_model.model."
        sums = {n[len(prefix) :]: tensor_checksum(t) for n, t in tensors.items()}
        self._record({"kind": "lora", "name": name, "names": sorted(sums), "digest": digest(sums)})
        return super().load_lora_adapter(name, path)


def _served_recipe(
    out: Path, log: Path, *, lora: bool, rollouts: int, recipe: str = "pe/pe_tiny_trainside"
) -> dict[str, Any]:
    """A tiny PE recipe with its policy on the recording fake server (full or LoRA syncs)."""
    data = compose_recipe(
        recipe,
        [
            f"output_dir={out}",
            f"num_rollouts={rollouts}",
            "batch_size=2",
            "sampling.samples_per_prompt=4",
            "eval_interval=0",
            "logging.gallery_interval=0",
            "logging.progress=off",
        ],
    )
    data["rollout"] = served_text_rollout(data["bundle"], RecordingTextServer(log=str(log)))
    data["pe"]["compose"] = {"max_rewrite_chars": 200, "empty_rewrite": "original"}
    data["sync"] = {"_target_": "unirl.distributed.weight_sync.FullSync", "transport": "local"}
    if lora:
        data["backend"]["lora"] = {
            "_target_": "unirl.train.LoraConfig",
            "rank": 4,
            "alpha": 8,
            "targets": ["q_proj", "v_proj"],
        }
        data["sync"] = {
            "_target_": "unirl.distributed.weight_sync.LoraSync",
            "transport": "local",
            "merged_lora": False,
        }
    return data


@pytest.fixture
def plain_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fakes travel to the workers by value; config.yaml gets a plain value for them."""
    import ray.cloudpickle

    from unirl.trainer.output import OutputDir

    for name in (__name__, FakeTextServer.__module__):
        ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    write_config = OutputDir.write_config

    def without_the_fake(self: OutputDir, data: dict) -> Any:
        plain = {**data, "rollout": {**data["rollout"], "client": "RecordingTextServer()"}}
        return write_config(self, plain)

    monkeypatch.setattr(OutputDir, "write_config", without_the_fake)


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _updates(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines()]


def test_a_served_policy_trains_and_every_update_reaches_the_server(
    tmp_path: Path, ray_session, plain_config: None
) -> None:
    """Full weights, eval at 0 and 3: the baseline eval pushes the trainer's weights, rollout
    0 re-syncs (the engine held eval weights), then one sync after every update (interval 1),
    and the last eval pushes again: 5 updates. The server samples with exactly the trainer's
    weights (log-prob gap 0) and what it received digests to what the trainer sent."""
    from unirl.train_pe import run

    out, log = tmp_path / "full", tmp_path / "updates.jsonl"
    data = _served_recipe(out, log, lora=False, rollouts=3)
    data["eval_interval"] = 3
    assert run(data) == 0
    rows, updates = _rows(out), _updates(log)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert len(updates) == 5 and all(u["kind"] == "full" for u in updates)
    from unirl.models.qwen3 import Qwen3Bundle

    names = sorted(n for n, _ in Qwen3Bundle(path="tiny", dtype="fp32").model.named_parameters())
    assert updates[0]["names"] == names  # every parameter of the policy, by its own name
    assert updates[0]["digest"] == updates[1]["digest"]  # eval and rollout 0: same weights
    assert [r["pe/sync/syncs_since_last_log"] for r in rows] == [2.0, 1.0, 1.0]
    for row, update in zip(rows, updates[1:4], strict=True):  # each row: its last sync
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert row["pe/sync/count"] == row["step"] + 2
        assert row["pe/sync/trainer_digest"] == row["pe/sync/engine_digest"] == update["digest"]
        assert row["pe/rollout/logp_gap"] < 1e-5  # sampled with the trainer's weights
        assert row["pe/reward/mean"] == pytest.approx(row["reward/mean"], abs=1e-6)
        assert "pe/advantage/std" in row and "advantage/std" not in row  # the drawer is frozen
    assert len({u["digest"] for u in updates[1:]}) == 4  # the policy moved at every update
    assert rows[0]["pe/train/param_checksum"] != rows[2]["pe/train/param_checksum"]
    evals = [json.loads(x) for x in (out / "eval_metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 3]
    assert all(math.isfinite(e["eval/reward/mean"]) for e in evals)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("UNIRL_SLOW") != "1",
    reason="slow (UNIRL_SLOW=1): one more Ray run (~20 s); the engine's LoRA path is checked "
    "in process by test_ar_sglang_adapter, and the PE layout does not depend on the sync kind",
)
def test_a_served_lora_policy_sends_its_adapter_by_name(
    tmp_path: Path, ray_session, plain_config: None
) -> None:
    """LoraSync: each sync loads the trainer's adapter (q_proj, v_proj) under a new name."""
    from unirl.train_pe import run

    out, log = tmp_path / "lora", tmp_path / "adapters.jsonl"
    assert run(_served_recipe(out, log, lora=True, rollouts=2)) == 0
    rows, updates = _rows(out), _updates(log)
    assert [u["name"] for u in updates] == ["unirl_v1", "unirl_v2"]
    assert {n.split(".")[-2] for n in updates[0]["names"]} == {"lora_A", "lora_B"}
    assert {n.split(".")[-3] for n in updates[0]["names"]} == {"q_proj", "v_proj"}
    for row, update in zip(rows, updates, strict=True):
        assert row["pe/sync/trainer_digest"] == row["pe/sync/engine_digest"] == update["digest"]
    assert updates[0]["digest"] != updates[1]["digest"]


def test_a_separate_served_policy_trains_on_its_own_slab(
    tmp_path: Path, ray_session, plain_config: None
) -> None:
    """``layout=separate``: the policy trains on one worker; the server, the frozen drawer,
    the composed engine (tracks travel whole) and the reward on the other; weights cross
    through the object store."""
    from unirl.train_pe import run

    out, log = tmp_path / "separate", tmp_path / "updates.jsonl"
    data = _served_recipe(out, log, lora=False, rollouts=2)
    data.update(num_devices=2, layout="separate", train_fraction=0.5)
    data["sync"]["transport"] = "object_store"
    assert run(data) == 0
    rows, updates = _rows(out), _updates(log)
    assert len(updates) == 2
    for row, update in zip(rows, updates, strict=True):
        assert row["pe/sync/trainer_digest"] == row["pe/sync/engine_digest"] == update["digest"]
        assert row["pe/rollout/logp_gap"] < 1e-5
        assert row["pe/reward/mean"] == pytest.approx(row["reward/mean"], abs=1e-6)


def test_a_dedicated_drawer_syncs_its_own_track(
    tmp_path: Path, ray_session, plain_config: None
) -> None:
    """``pe.train_both`` with the drawer on a ``DedicatedEngine``: two tracks, two syncs. The
    policy's full weights go to the server (``pe/sync/*``), the drawer's LoRA to its engine
    (``sync/*``), each before every rollout and verified by read-back (the engine's digest is
    the trainer's)."""
    from unirl.train_pe import run

    out, log = tmp_path / "dedicated", tmp_path / "updates.jsonl"
    data = _served_recipe(out, log, lora=False, rollouts=2, recipe="pe/pe_tiny_train_both")
    drawer = data["pe"]["diffusion"]
    drawer["rollout"] = {
        "_target_": "unirl.rollout.engine.dedicated.DedicatedEngine",
        "_recursive_": False,
        "bundle": dict(drawer["bundle"]),
        "pipeline": dict(drawer["pipeline"]),
    }
    drawer["sync"] = {"_target_": "unirl.distributed.weight_sync.LoraSync", "transport": "local"}
    assert run(data) == 0
    rows, updates = _rows(out), _updates(log)
    assert len(updates) == 2  # the policy's: before rollout 0, after update 0
    for row, update in zip(rows, updates, strict=True):
        assert row["pe/sync/trainer_digest"] == row["pe/sync/engine_digest"] == update["digest"]
        assert row["sync/count"] == row["pe/sync/count"] == row["step"] + 1
        assert row["sync/trainer_digest"] == row["sync/engine_digest"]
        assert row["sync/num_tensors"] > 0 and "train/loss" in row and "pe/train/loss" in row
    assert rows[0]["sync/trainer_digest"] != rows[1]["sync/trainer_digest"]  # the drawer moved


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("UNIRL_SLOW") != "1",
    reason="slow (UNIRL_SLOW=1): one more Ray run (~20 s) on two workers; the colocated "
    "dedicated drawer and the separate served policy each run above",
)
def test_a_dedicated_drawer_on_the_separate_layout(
    tmp_path: Path, ray_session, plain_config: None
) -> None:
    """``layout=separate`` with a dedicated drawer: both stages train on the train slab, the
    server and the drawer's engine sample on the rollout slab; each track's weights cross
    through the object store, verified by read-back."""
    from unirl.train_pe import run

    out, log = tmp_path / "separate_dedicated", tmp_path / "updates.jsonl"
    data = _served_recipe(out, log, lora=False, rollouts=2, recipe="pe/pe_tiny_train_both")
    data.update(num_devices=2, layout="separate", train_fraction=0.5)
    data["sync"]["transport"] = "object_store"
    drawer = data["pe"]["diffusion"]
    drawer["rollout"] = {
        "_target_": "unirl.rollout.engine.dedicated.DedicatedEngine",
        "_recursive_": False,
        "bundle": dict(drawer["bundle"]),
        "pipeline": dict(drawer["pipeline"]),
    }
    drawer["sync"] = {
        "_target_": "unirl.distributed.weight_sync.LoraSync",
        "transport": "object_store",
    }
    assert run(data) == 0
    rows, updates = _rows(out), _updates(log)
    assert len(updates) == 2
    for row, update in zip(rows, updates, strict=True):
        assert row["pe/sync/trainer_digest"] == row["pe/sync/engine_digest"] == update["digest"]
        assert row["sync/count"] == row["pe/sync/count"] == row["step"] + 1
        assert row["sync/trainer_digest"] == row["sync/engine_digest"]
        assert "train/loss" in row and "pe/train/loss" in row
