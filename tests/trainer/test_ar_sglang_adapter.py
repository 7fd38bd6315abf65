"""The SGLang text adapter against a fake server that answers like SGLang's native routes
with the tiny Qwen3 behind them: the request it sends, the track it builds (the same tokens
as the trainside pipeline), contract errors, weight syncs with read-back, the pre-Ray
checks, and the whole text loop on the dedicated colocated layout through Ray."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_fakes import served_text_rollout

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.distributed.weight_sync.manifest import WeightSyncError
from unirl.rollout.engine.sglang_llm import EngineContractError, SGLangLLMEngine
from unirl.types import RolloutReq, TextRequest, Texts

BUNDLE = {"_target_": "unirl.models.qwen3.Qwen3Bundle", "path": "tiny", "dtype": "fp32"}
PROMPTS = ["What is 3 + 4?", "What is 2 * 5?"]


class FakeTextServer:
    """Answers /generate, /update_weights_from_tensor, /get_weights_by_name and the memory
    routes as SGLang does, sampling with its own copy of the tiny Qwen3 (each sample from a
    generator seeded by its ``sampling_seed``)."""

    def __init__(self, *, logprob_shift: float = 0.0) -> None:
        self.logprob_shift = logprob_shift
        self.bundle: Any = None
        self.requests: list[tuple[list[list[int]], list[dict[str, Any]]]] = []
        self.updates = 0
        self.corrupt_readback = False
        self.lora_paths: list[str | None] = []
        self.adapters: dict[str, str] = {}  # loaded name -> folder

    def load_lora_adapter(self, name: str, path: str) -> dict:
        self.adapters[name] = path
        return {"success": True}

    def unload_lora_adapter(self, name: str) -> dict:
        self.adapters.pop(name)
        return {"success": True}

    def _model(self) -> Any:
        if self.bundle is None:  # built where the engine lives (a Ray worker)
            from unirl.models.qwen3 import Qwen3Bundle

            self.bundle = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
        return self.bundle

    def generate(
        self,
        input_ids: list[list[int]],
        sampling_params: list[dict],
        *,
        lora_path: str | None = None,
        texts: list[str] | None = None,
        image_data: list[str] | None = None,
    ) -> list[dict]:
        from unirl.models.common_ar.generate import StopStrings, generate_completions

        bundle = self._model()
        self.requests.append((input_ids, sampling_params))
        self.lora_paths.append(lora_path)
        outs = []
        for ids, params in zip(input_ids, sampling_params, strict=True):
            gen = torch.Generator().manual_seed(int(params["sampling_seed"]))
            u = torch.rand(1, params["max_new_tokens"], generator=gen, dtype=torch.float64)
            stops = StopStrings(params["stop"] or (), bundle.prompts.decode_raw)
            with bundle.sampling_mode():
                (done,) = generate_completions(
                    bundle.model,
                    [ids],
                    u,
                    max_new_tokens=params["max_new_tokens"],
                    temperature=params["temperature"],
                    top_p=params["top_p"],
                    top_k=params["top_k"],
                    stop_token_ids=params["stop_token_ids"],
                    stop_strings=stops or None,
                    pad_token_id=bundle.pad_token_id,
                )
            pairs = [
                [float(lp) + self.logprob_shift, int(t), None]
                for lp, t in zip(done.log_probs.tolist(), done.tokens, strict=True)
            ]
            outs.append(
                {
                    "text": bundle.decode(done.tokens),
                    "output_ids": list(done.tokens),
                    "meta_info": {
                        "finish_reason": {"type": done.finish_reason},
                        "output_token_logprobs": pairs,
                    },
                }
            )
        return outs

    def update_weights_from_tensor(self, named: list[tuple[str, torch.Tensor]], *, tp_size: int):
        params = dict(self._model().model.named_parameters())
        unknown = [n for n, _ in named if n not in params]
        if unknown:
            return {"success": False, "message": f"unknown parameters {unknown[:3]}"}
        with torch.no_grad():
            for name, tensor in named:
                params[name].copy_(tensor)
        self.updates += 1
        return {"success": True, "message": "ok"}

    def get_weights_by_name(self, name: str, truncate_size: int) -> list[float]:
        values = dict(self._model().model.named_parameters())[name].detach().reshape(-1)
        out = values[:truncate_size].tolist()
        return [v + 1.0 for v in out] if self.corrupt_readback else out

    def release_memory(self) -> dict:
        return {"success": True}

    def resume_memory(self) -> dict:
        return {"success": True}


def request(ids: list[int], **knobs: Any) -> RolloutReq:
    texts = [PROMPTS[i % 2] for i in range(len(ids))]
    block = {"max_new_tokens": 8, "temperature": 1.0, "stop": ("}",), **knobs}
    return RolloutReq(
        sample_ids=torch.tensor(ids),
        group_ids=torch.tensor([i // 2 for i in range(len(ids))]),
        primitives={"text": Texts(texts=texts)},
        stage_params={"text": TextRequest(seed_ids=torch.tensor(ids), **block)},
        seed=5,
    )


def engine(server: FakeTextServer, **kw: Any) -> SGLangLLMEngine:
    return SGLangLLMEngine(
        model_path="tiny", bundle=BUNDLE, launch=False, dtype="fp32", client=server, **kw
    )


def test_request_and_track_match_the_trainside_contract() -> None:
    from unirl.models.qwen3 import Qwen3Bundle, Qwen3Pipeline

    server = FakeTextServer(logprob_shift=-0.01)
    eng = engine(server)
    track = eng.generate(request([10, 11, 12, 13])).tracks["text"]
    ids, params = server.requests[0]
    local = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
    assert ids == local.encode_prompts([PROMPTS[0], PROMPTS[1]] * 2)  # tokenized as trained
    seeds = [p["sampling_seed"] for p in params]
    assert len(set(seeds)) == 4 and all(0 <= s < 2**31 for s in seeds)
    assert params[0]["stop"] == ["}"] and params[0]["no_stop_trim"] is True
    assert params[0]["stop_token_ids"] == local.stop_token_ids
    again = engine(FakeTextServer()).generate(request([12])).tracks["text"]
    assert torch.equal(again.segment.tokens.row(0), track.segment.tokens.row(2))  # per sample id
    seg = track.segment
    for i in range(4):
        n = len(ids[i])
        assert seg.tokens.row(i)[:n].tolist() == ids[i] and not seg.loss_mask.row(i)[:n].any()
    # the server's log-probs are recorded as they came; the trainer's replay differs by the shift
    replay = Qwen3Pipeline(bundle=local).token_log_probs(track.conditions, seg).values.detach()
    m = seg.loss_mask.values
    torch.testing.assert_close(seg.log_probs.values[m], replay[m] - 0.01, atol=1e-5, rtol=0)
    assert {mt["finish_reason"] for mt in track.metadata} <= {"stop", "length"}


def test_contract_errors_name_the_sample() -> None:
    server = FakeTextServer()
    eng = engine(server)
    good = server.generate(
        *([[1, 2, 3]], [eng._sampling_params(request([0]).params_for("text", TextRequest), 0, 0)])
    )[0]
    bad_ids = {**good, "output_ids": [*good["output_ids"], 7]}
    with pytest.raises(EngineContractError, match="sample 0: output_ids"):
        eng._completion(bad_ids, 0)
    aborted = {**good, "meta_info": {**good["meta_info"], "finish_reason": {"type": "abort"}}}
    with pytest.raises(EngineContractError, match="finished with"):
        eng._completion(aborted, 0)
    no_logprobs = {**good, "meta_info": {"finish_reason": {"type": "stop"}}}
    with pytest.raises(EngineContractError, match="output_token_logprobs"):
        eng._completion(no_logprobs, 3)
    eng.asleep = True
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate(request([0]))


def test_weight_sync_forwards_full_tensors_and_reads_back() -> None:
    from unirl.distributed.weight_sync.manifest import SyncManifest, TensorMeta

    server = FakeTextServer()
    eng = engine(server)
    eng.generate(request([0]))  # the server holds its model
    embed = server.bundle.model.model.embed_tokens.weight
    new = {"model.embed_tokens.weight": torch.full_like(embed, 0.25)}
    meta = TensorMeta(
        name="model.embed_tokens.weight",
        source="model.embed_tokens.weight",
        shape=tuple(embed.shape),
        dtype="torch.float32",
        wire_dtype="torch.float32",
    )
    manifest = SyncManifest(kind="full", entries=(meta,))
    assert eng._sync_prepare(manifest) == {"model.embed_tokens.weight": "torch.float32"}
    out = eng._apply_synced(manifest, new)
    assert out["bytes"] == embed.numel() * 4 and server.updates == 1
    assert torch.all(embed == 0.25)
    server.corrupt_readback = True
    with pytest.raises(WeightSyncError, match="read-back"):
        eng._apply_synced(manifest, new)


def test_pre_ray_checks(tmp_path: Path) -> None:
    def recipe(sync: dict) -> object:
        return type("R", (), {"sync": sync})()

    block = {"_target_": "x", "bundle": BUNDLE, "_recursive_": False}
    full = recipe({"_target_": "unirl.distributed.weight_sync.FullSync"})
    SGLangLLMEngine.check_config(block, full)
    with pytest.raises(ConfigError, match="_recursive_ must be false"):
        SGLangLLMEngine.check_config({**block, "_recursive_": True}, full)
    with pytest.raises(ConfigError, match="bundle: \\$\\{bundle\\}"):
        SGLangLLMEngine.check_config({**block, "bundle": "tiny"}, full)
    lora = recipe({"_target_": "unirl.distributed.weight_sync.LoraSync"})
    with pytest.raises(ConfigError, match="--enable-lora"):
        SGLangLLMEngine.check_config(block, lora)
    SGLangLLMEngine.check_config({**block, "server_args": ["--enable-lora"]}, lora)
    merged = recipe({"_target_": "unirl.distributed.weight_sync.LoraSync", "merged_lora": True})
    with pytest.raises(ConfigError, match="merged_lora"):
        SGLangLLMEngine.check_config({**block, "server_args": ["--enable-lora"]}, merged)
    other = recipe({"_target_": "unirl.distributed.weight_sync.CudaIpcSync"})
    with pytest.raises(ConfigError, match="FullSync"):
        SGLangLLMEngine.check_config(block, other)


def test_lora_syncs_load_a_peft_folder_by_name_and_requests_use_it(tmp_path: Path) -> None:
    import json

    from safetensors.torch import load_file

    from unirl.distributed.weight_sync.manifest import SyncManifest, TensorMeta

    server = FakeTextServer()
    eng = engine(server, adapter_dir=str(tmp_path))
    name = "model.layers.0.self_attn.q_proj.lora_A.weight"
    tensor = torch.arange(8.0).reshape(2, 4)
    meta = TensorMeta(name=name, source=name, shape=(2, 4), dtype="torch.float32", wire_dtype="")
    config = {"r": 2, "lora_alpha": 4.0, "target_modules": ["q_proj"], "adapter_name": "default"}
    manifest = SyncManifest(kind="lora", entries=(meta,), lora_config=config)
    assert eng._sync_prepare(manifest) == {name: "torch.float32"}
    eng._apply_synced(manifest, {name: tensor})
    eng._apply_synced(manifest, {name: tensor + 1})
    assert list(server.adapters) == ["unirl_v2"]  # the first one was unloaded
    folder = Path(server.adapters["unirl_v2"])
    saved = load_file(str(folder / "adapter_model.safetensors"))
    assert torch.equal(saved[f"base_model.model.{name}"], tensor + 1)
    written = json.loads((folder / "adapter_config.json").read_text())
    assert (written["r"], written["lora_alpha"], written["target_modules"]) == (2, 4.0, ["q_proj"])
    assert not (folder.parent / "v000001").exists()
    eng.generate(request([0]))
    assert server.lora_paths[-1] == "unirl_v2"
    with pytest.raises(WeightSyncError, match="merge"):
        eng._sync_prepare(SyncManifest(kind="lora", entries=(meta,), merged_lora=True))


def test_text_loop_on_the_dedicated_colocated_layout(
    tmp_path: Path, ray_session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through Ray: the engine samples with its own copy, every rollout starts with a full
    sync, so the replay of the trainer's weights equals the server's log-probs."""
    import ray.cloudpickle

    from unirl.train_vlm import run
    from unirl.trainer.output import OutputDir

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake travels by value
    write_config = OutputDir.write_config

    def without_the_fake(self: OutputDir, data: dict) -> Any:  # config.yaml holds plain values
        plain = {**data, "rollout": {**data["rollout"], "client": "FakeTextServer()"}}
        return write_config(self, plain)

    monkeypatch.setattr(OutputDir, "write_config", without_the_fake)
    out = tmp_path / "sglang_fake"
    data = compose_recipe(
        "llm/qwen3_tiny_grpo",
        [f"output_dir={out}", "num_rollouts=3", "eval_interval=0", "logging.gallery_interval=0"],
    )
    data["rollout"] = served_text_rollout(data["bundle"], FakeTextServer())
    data["sync"] = {"_target_": "unirl.distributed.weight_sync.FullSync", "transport": "local"}
    assert run(data) == 0
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert row["rollout/logp_gap"] < 1e-5, row["rollout/logp_gap"]  # synced every rollout
        assert row["sync/count"] >= 1 and math.isfinite(row["reward/mean"])
    assert rows[0]["train/param_checksum"] != rows[2]["train/param_checksum"]
