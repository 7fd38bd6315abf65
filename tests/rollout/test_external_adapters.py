"""Contract tests of the SGLang and vLLM-Omni adapters against fakes that mimic those engines'
output shapes (no GPU run of either engine was possible here): outputs map into the rollout
contract, σ / x_T / log-prob problems raise, weight syncs go through the engine's update and
read-back paths (including a server that silently skips unknown names), and neither stack is
imported by ``import unirl.rollout`` or a recipe's dry run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rollout_fakes import BUNDLE_BLOCK, make_request, stage

from unirl.distributed.weight_sync import SyncManifest, TensorMeta, WeightSyncError, tensor_checksum
from unirl.rollout import SGLangEngine, VllmOmniEngine
from unirl.rollout.engine.dedicated.trajectory import EngineContractError
from unirl.rollout.engine.sglang.client import sha256_like_sglang
from unirl.types import Images, LatentSegment

SD3 = BUNDLE_BLOCK["_target_"]  # the family the fake servers run
SCHED = {"shift": 3.0, "use_dynamic_shifting": False, "num_train_timesteps": 1000}
LATENT = (16, 8, 8)


def _req(spp: int = 2):
    return make_request(SCHED, LATENT, spp=spp)


# -- SGLang ----------------------------------------------------------------------------------------


class FakeSGLangServer:
    """Answers like ``POST /rollout/generate`` (per-sample dicts, tensors decoded) and the weight
    routes; like SGLang's loader it silently skips names it does not know."""

    def __init__(
        self, *, sigmas: torch.Tensor, params: dict[str, torch.Tensor] | None = None
    ) -> None:
        self.sigmas = sigmas
        self.calls: list[dict[str, Any]] = []
        self.params = params if params is not None else {}
        self.released = False

    def rollout_generate(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append(payload)
        k, steps = payload["num_outputs_per_prompt"], payload["num_inference_steps"]
        gen = torch.Generator().manual_seed(payload["seed"])
        out = []
        for _ in range(k):
            out.append(
                {
                    "request_id": "r",
                    "prompt": payload["prompt"],
                    "seed": payload["seed"],
                    "generated_output": torch.randint(
                        0, 256, (64, 64, 3), dtype=torch.uint8, generator=gen
                    ),
                    "rollout_log_probs": torch.randn(steps, generator=gen),
                    "dit_trajectory": {
                        "latents": torch.randn(steps + 1, *LATENT, generator=gen),
                        "timesteps": self.sigmas[:-1] * 1000,
                        "sigmas": self.sigmas,
                    },
                    "denoising_env": {
                        "pos_cond_kwargs": {
                            "encoder_hidden_states": torch.randn(1, 10, 16),
                            "pooled_projections": torch.randn(1, 8),
                        },
                        "neg_cond_kwargs": {
                            "encoder_hidden_states": torch.zeros(1, 10, 16),
                            "pooled_projections": torch.zeros(1, 8),
                        },
                    },
                }
            )
        return out

    def update_weights_from_tensor(
        self, named_tensors, *, target_modules, **kwargs
    ) -> dict[str, Any]:
        for name, t in named_tensors:
            if (
                name in self.params
            ):  # unknown names are skipped without a word, as SGLang's loader does
                self.params[name] = t.clone()
        return {"success": True, "message": "ok"}

    def check_weights(self, target_module: str, expected_sha256: dict[str, str]) -> dict[str, Any]:
        missing = [n for n in expected_sha256 if n not in self.params]
        wrong = [
            n
            for n in expected_sha256
            if n in self.params and sha256_like_sglang(self.params[n]) != expected_sha256[n]
        ]
        if missing or wrong:
            return {"success": False, "message": f"missing {missing}; checksum mismatch {wrong}"}
        return {"success": True, "message": "verified"}

    def release_memory(self) -> dict[str, Any]:
        self.released = True
        return {"success": True}

    def resume_memory(self) -> dict[str, Any]:
        self.released = False
        return {"success": True}


def test_sglang_outputs_map_into_the_contract() -> None:
    req = _req()
    server = FakeSGLangServer(sigmas=stage(req).sigmas.clone())
    engine = SGLangEngine(model_path="fake", family=SD3, client=server, storage_dtype="fp32")
    resp = engine.generate(req)
    assert [c["num_outputs_per_prompt"] for c in server.calls] == [
        2,
        2,
    ]  # one call per prompt group
    assert (
        server.calls[0]["rollout_sde_step_indices"] == [0, 2, 4]
        and server.calls[0]["rollout_noise_level"] == 0.7
    )
    assert (
        server.calls[0]["rollout_return_dit_trajectory"]
        and server.calls[0]["rollout_return_denoising_env"]
    )
    track = resp.tracks["diffusion"]
    seg = track.segment
    assert isinstance(seg, LatentSegment) and torch.equal(track.sample_ids, req.sample_ids)
    assert tuple(seg.latents.shape) == (4, 3, *LATENT) and tuple(seg.sde_logp.shape) == (4, 3)
    # the sparse cut is the dense trajectory at the SDE steps (recomputed from the fake's seed)
    again = FakeSGLangServer(sigmas=stage(req).sigmas.clone()).rollout_generate(
        dict(server.calls[1])
    )
    traj = torch.stack([o["dit_trajectory"]["latents"] for o in again])
    logp = torch.stack([o["rollout_log_probs"] for o in again])
    idx = torch.tensor([0, 2, 4])
    assert torch.equal(seg.latents[2:], traj[:, idx]) and torch.equal(
        seg.next_latents[2:], traj[:, idx + 1]
    )
    assert torch.equal(seg.sde_logp[2:], logp[:, idx]) and torch.equal(
        seg.final_latents[2:], traj[:, -1]
    )
    assert tuple(track.conditions.prompt_embeds.shape) == (4, 10, 16)
    assert tuple(track.conditions.negative_pooled_prompt_embeds.shape) == (4, 8)
    assert isinstance(track.decoded, Images) and tuple(track.decoded.pixels.shape) == (4, 3, 64, 64)
    assert float(track.decoded.pixels.min()) >= 0.0 and float(track.decoded.pixels.max()) <= 1.0


def test_sglang_contract_violations_raise() -> None:
    req = _req()
    shifted = FakeSGLangServer(sigmas=stage(req).sigmas.clone() * 0.9)
    with pytest.raises(EngineContractError, match="sampled with σ"):
        SGLangEngine(model_path="fake", family=SD3, client=shifted).generate(req)
    with pytest.raises(EngineContractError, match="different x_T"):
        SGLangEngine(
            model_path="fake",
            family=SD3,
            client=FakeSGLangServer(sigmas=stage(req).sigmas.clone()),
            init_noise="verify",
        ).generate(req)


def _manifest(names: list[str]) -> SyncManifest:
    return SyncManifest(
        kind="full",
        entries=tuple(
            TensorMeta(
                name=n, source=n, shape=(4, 4), dtype="torch.float32", wire_dtype="torch.bfloat16"
            )
            for n in names
        ),
    )


def test_sglang_weight_sync_is_checked_by_the_server() -> None:
    server = FakeSGLangServer(
        sigmas=torch.zeros(2), params={"a.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}
    )
    engine = SGLangEngine(model_path="fake", family=SD3, client=server)
    manifest = _manifest(["a.weight"])
    assert engine.prepare_sync(manifest) == {"a.weight": "torch.bfloat16"}
    value = torch.randn(4, 4).to(torch.bfloat16)
    report = engine.receive_tensors({"a.weight": value}, manifest)
    assert torch.equal(server.params["a.weight"], value) and report["num_tensors"] == 1
    # a name the server does not know: SGLang skips it silently, its checker does not
    bad = _manifest(["a.weight", "blocks.9.weight"])
    engine.prepare_sync(bad)
    with pytest.raises(
        WeightSyncError, match=r"read-back check failed: missing \['blocks.9.weight'\]"
    ):
        engine.receive_tensors({"a.weight": value, "blocks.9.weight": value}, bad)
    engine.sleep()
    assert server.released
    with pytest.raises(RuntimeError, match="while asleep"):
        engine.generate(_req())


# -- vLLM-Omni ---------------------------------------------------------------------------------------


class FakeOmni:
    """Like the ``OmniBackend``: honours pinned latents, reports timesteps (σ·1000) and a dense
    trajectory, optionally per-step log-probs; weight RPCs store and checksum."""

    def __init__(self, *, sigmas: torch.Tensor, log_probs: bool = True) -> None:
        self.sigmas, self.log_probs = sigmas, log_probs
        self.calls: list[tuple[Any, dict[str, Any]]] = []
        self.weights: dict[str, torch.Tensor] = {}

    def generate(self, prompt: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append((prompt, params))
        steps = params["num_inference_steps"]
        out = []
        for x_t in params["latents"]:
            traj = torch.cat([x_t[None], torch.randn(steps, *x_t.shape)])
            out.append(
                {
                    "image": torch.rand(3, 64, 64),
                    "trajectory_latents": traj,
                    "trajectory_timesteps": self.sigmas[:-1] * 1000,
                    "log_probs": torch.randn(steps) if self.log_probs else None,
                }
            )
        return out

    def update_weights(self, named_tensors, *, kind, lora_config) -> None:
        self.weights.update({n: t.clone() for n, t in named_tensors})

    def weight_checksums(self, names: list[str]) -> dict[str, int]:
        return {n: tensor_checksum(self.weights[n]) for n in names if n in self.weights}

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


@pytest.fixture(scope="module")
def vllm_req():
    from unirl.models.sd3 import SD3Bundle

    bundle = SD3Bundle(**{k: v for k, v in BUNDLE_BLOCK.items() if k != "_target_"})
    return make_request(bundle.scheduler_config, bundle.latent_shape(64, 64))


def test_vllm_omni_pins_x_t_and_maps_outputs(vllm_req) -> None:
    fake = FakeOmni(sigmas=stage(vllm_req).sigmas.clone())
    engine = VllmOmniEngine(
        model_path="fake", encoder=dict(BUNDLE_BLOCK), backend=fake, storage_dtype="fp32"
    )
    track = engine.generate(vllm_req).tracks["diffusion"]
    prompt, params = fake.calls[0]
    assert (
        torch.equal(params["latents"], stage(vllm_req).initial_noise(vllm_req.seed)[:1])
        and params["return_trajectory_latents"]
    )
    assert (
        prompt["prompt_embeds"].ndim == 2  # one request's [L, D]: vLLM-Omni stacks requests
        and "pooled_prompt_embeds" in prompt["additional_information"]
    )
    assert [p["num_outputs_per_prompt"] for _, p in fake.calls] == [1, 1, 1, 1]
    seg = track.segment
    assert torch.equal(
        seg.latents[:, 0], stage(vllm_req).initial_noise(vllm_req.seed)
    )  # step 0 trained: x_T itself
    assert tuple(seg.sde_logp.shape) == (4, 3)
    assert (
        track.conditions.prompt_embeds.shape[0] == 4
        and track.conditions.negative_prompt_embeds is not None
    )


def test_vllm_omni_without_log_probs_and_sigma_mismatch(vllm_req) -> None:
    fake = FakeOmni(sigmas=stage(vllm_req).sigmas.clone(), log_probs=False)
    engine = VllmOmniEngine(
        model_path="fake", encoder=dict(BUNDLE_BLOCK), backend=fake, log_prob_attr=None
    )
    assert (
        engine.generate(vllm_req).tracks["diffusion"].segment.sde_logp is None
    )  # old_logp_source: replay
    strict = VllmOmniEngine(model_path="fake", encoder=dict(BUNDLE_BLOCK), backend=fake)
    with pytest.raises(EngineContractError, match="no per-step log-probs"):
        strict.generate(vllm_req)
    shifted = VllmOmniEngine(
        model_path="fake",
        encoder=dict(BUNDLE_BLOCK),
        backend=FakeOmni(sigmas=stage(vllm_req).sigmas * 0.5),
    )
    with pytest.raises(EngineContractError, match="sampled with σ"):
        shifted.generate(vllm_req)


def test_vllm_omni_weight_sync_reads_back(vllm_req) -> None:
    fake = FakeOmni(sigmas=stage(vllm_req).sigmas.clone())
    engine = VllmOmniEngine(model_path="fake", encoder=dict(BUNDLE_BLOCK), backend=fake)
    manifest = _manifest(["a.weight"])
    engine.prepare_sync(manifest)
    value = torch.randn(4, 4)
    report = engine.receive_tensors({"a.weight": value}, manifest)
    assert report["checksums"] == {"a.weight": tensor_checksum(value.to(torch.bfloat16))}


# -- lazy imports ----------------------------------------------------------------------------------------


def test_missing_stacks_fail_naming_the_extra() -> None:
    with pytest.raises(ImportError, match=r"pip install 'unirl-mm\[sglang\]'"):
        SGLangEngine(model_path="stabilityai/stable-diffusion-3.5-medium", family=SD3)
    with pytest.raises(ImportError, match=r"pip install 'unirl-mm\[vllm\]'"):
        VllmOmniEngine(
            model_path="stabilityai/stable-diffusion-3.5-medium", encoder=dict(BUNDLE_BLOCK)
        )


def test_dry_run_of_adapter_recipes_imports_neither_stack(tmp_path: Path) -> None:
    code = """
import sys
class Spy:
    seen = []
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('sglang', 'vllm', 'vllm_omni'):
            Spy.seen.append(name)
        return None
sys.meta_path.insert(0, Spy())
sys.path.insert(0, CONFIG_TESTS)
from unirl.config.entry import compose_recipe
from unirl.config.validate import validate
import unirl.rollout
for name in ('sd3_sglang_native_colocate', 'sd3_sglang_full_nccl_separate', 'sd3_vllmomni_full_ipc', 'sd3_vllmomni_lora_separate'):
    validate(compose_recipe('diffusion/' + name, ['dry_run=true']))
print('SEEN', Spy.seen)
"""
    config_tests = str(Path(__file__).resolve().parents[1] / "config")
    code = code.replace("CONFIG_TESTS", repr(config_tests)).replace("OUT", repr(str(tmp_path)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SEEN []" in out.stdout
