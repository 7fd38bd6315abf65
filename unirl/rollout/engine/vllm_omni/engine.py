"""``VllmOmniEngine``: the rollout contract on top of vLLM-Omni's diffusion engine.

The adapter encodes prompts with its own copy of the family's text encoders (the ``encoder``
bundle block: the same encoding code the trainer replays with), passes the embeddings and the
request's x_T (pinned ``latents``) to vLLM-Omni, asks for the dense trajectory, and cuts the
sparse ``LatentSegment`` at the request's SDE steps. The family's ``engine_maps`` (from the
encoder's bundle class) name the embedding kwargs, the CFG knob and the latent layout. Per-step log-probs are mapped when the
backend returns them; otherwise ``sde_logp`` stays empty and the recipe must use
``old_logp_source: replay``. See README.md: no GPU run of this adapter was possible here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from unirl.config.precision import parse_dtype
from unirl.config.require import require
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.weight_sync.ipc import IpcPayload
from unirl.distributed.weight_sync.manifest import SyncManifest, WeightSyncError, compare_checksums
from unirl.distributed.weight_sync.receiver import WeightReceiver
from unirl.models.common.engine_maps import EngineMapError, engine_maps_for
from unirl.rollout.engine.dedicated.engine import build_bundle, plain_block
from unirl.rollout.engine.dedicated.trajectory import (
    EngineContractError,
    check_sigmas,
    pixels_from_output,
    prompt_groups,
    segment_from_trajectory,
)
from unirl.rollout.engine.vllm_omni.video import frames_from_output
from unirl.types import (
    DiffusionRequest,
    Images,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    Videos,
)


def per_request(embeds: Mapping[str, Any]) -> dict[str, Any]:
    """The maps' ``[1, ...]`` rows as one request's tensors ``[...]``: vLLM-Omni 0.30 stacks
    the prompt tensors of the requests it batches (``DiffusionRequestBatch.
    collate_prompt_tensors``), so a request carries them without a batch dim; nested dicts
    (``additional_information``) likewise."""
    out: dict[str, Any] = {}
    for key, value in embeds.items():
        if isinstance(value, Mapping):
            out[key] = per_request(value)
        elif isinstance(value, torch.Tensor):
            if value.shape[:1] != (1,):
                raise EngineContractError(
                    f"vllm_omni: prompt tensor {key!r} has shape {list(value.shape)}; the "
                    "family's maps must give one row [1, ...]"
                )
            out[key] = value[0]
        else:
            out[key] = value
    return out


class VllmOmniEngine(WeightReceiver):
    """Rollout through vLLM-Omni (``vllm_omni.entrypoints.omni.Omni``).

    ``model_path``: what vLLM-Omni loads. ``encoder``: a bundle block (``${bundle}``) whose
    text encoders encode prompts (its transformer is freed after construction); its class is
    the family whose ``engine_maps`` the adapter uses (refused when it has none).
    ``omni_kwargs``: extra ``Omni(...)`` arguments. ``log_prob_attr``: the output attribute
    holding per-step log-probs (``null`` when the backend records none). ``dtype``: the
    server's weight dtype. ``backend``: a ready backend object (tests inject a fake); when
    omitted, vllm-omni must be installed. ``storage_dtype``: the dtype the returned
    trajectories are stored in (the segment the trainer replays).
    """

    engine_kind = "vllm_omni"

    @classmethod
    def check_config(cls, block: dict[str, Any], recipe: Any) -> None:
        """Before Ray: the encoder's family has vLLM-Omni maps (no stack loads)."""
        encoder = block.get("encoder")
        if isinstance(encoder, Mapping) and "_target_" in encoder:
            engine_maps_for(encoder["_target_"], "vllm_omni")  # ConfigError naming the family

    track_name = "diffusion"

    def __init__(
        self,
        *,
        model_path: str,
        encoder: Any = None,
        omni_kwargs: dict[str, Any] | None = None,
        log_prob_attr: str | None = "trajectory_log_probs",
        dtype: str = "bf16",
        storage_dtype: str = "bf16",
        backend: Any = None,
    ) -> None:
        require(
            encoder is not None,
            "rollout.encoder: give the bundle block (encoder: ${bundle}) used to encode prompts",
        )
        plain = plain_block(encoder)
        built_here = isinstance(plain, Mapping)
        require(
            not built_here or "_target_" in plain,
            "rollout.encoder must be a bundle block with _target_ (encoder: ${bundle})",
        )
        # the family's dialect (embedding kwargs, CFG knob, latent layout): a family without
        # one is refused before any stack loads
        self.maps = engine_maps_for(plain["_target_"] if built_here else type(encoder), "vllm_omni")
        self.dtype = parse_dtype(dtype, "rollout.dtype")
        self.storage_dtype = parse_dtype(storage_dtype, "rollout.storage_dtype")
        if backend is None:  # fails first, naming the extra, when vllm-omni is missing
            from unirl.rollout.engine.vllm_omni.backend import OmniBackend

            backend = OmniBackend(
                model_path=model_path, omni_kwargs=omni_kwargs, log_prob_attr=log_prob_attr or ""
            )
        self.backend = backend
        self.encoder = build_bundle(encoder, dtype=None, device=None)
        if built_here and hasattr(self.encoder, "transformer"):
            self.encoder.transformer = None  # our own copy: only its text encoders are used
        self.has_log_probs = log_prob_attr is not None
        self.asleep = False

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """This rank's shard: embeddings and x_T pinned, one backend call per sample."""
        if self.asleep:
            raise RuntimeError(
                "VllmOmniEngine.generate while asleep; the driver calls wake_up() first"
            )
        params = req.sampling_params
        stage = req.params_for(self.track_name, DiffusionRequest)
        guidance = params.guidance_for(req.mode)
        t0 = time.perf_counter()
        conditions = self.encoder.encode_prompts(
            req.prompts, negative=guidance > 1.0, negative_prompt=params.negative_prompt
        )
        x_t = stage.initial_noise(req.seed)
        try:  # video families: the frame count and rate; image families: none (1 frame)
            frames = self.maps.vllm_omni_video(params.num_frames, params.fps)
            engine_x_t = self.maps.to_engine_latents(x_t)
        except EngineMapError as exc:
            raise EngineContractError(f"vllm_omni: {exc}") from exc
        samples: list[dict[str, Any]] = []
        for rows in prompt_groups(req.prompts, stage.sde_indices):
            try:
                embeds = per_request(self.maps.vllm_omni_prompt(conditions, rows[0]))
            except EngineMapError as exc:
                raise EngineContractError(f"vllm_omni: {exc}") from exc
            prompt = {"prompt": req.prompts[rows[0]], **embeds}
            # one call per sample: vLLM-Omni 0.30 does not repeat given embeddings over
            # num_outputs_per_prompt (SD3: [1, L, D] text beside [N, ...] latents fails)
            for row in rows:
                call = {
                    "num_inference_steps": stage.num_steps,
                    **self.maps.vllm_omni_guidance(guidance),
                    "height": params.height,
                    "width": params.width,
                    **frames,
                    "num_outputs_per_prompt": 1,
                    "latents": engine_x_t[row : row + 1],
                    "return_trajectory_latents": True,
                }
                got = self.backend.generate(prompt, call)
                if len(got) != 1:
                    raise EngineContractError(f"vllm_omni: asked for 1 sample, got {len(got)}")
                samples.extend(got)
        t_rollout = time.perf_counter() - t0
        timesteps = samples[0].get("trajectory_timesteps")
        if timesteps is not None:  # vLLM-Omni reports timesteps = σ · 1000 for the T model calls
            check_sigmas(
                "vllm_omni",
                torch.cat([torch.as_tensor(timesteps).float() / 1000.0, stage.sigmas[-1:].float()]),
                stage,
            )
        logps = [s.get("log_probs") for s in samples]
        if self.has_log_probs and any(lp is None for lp in logps):
            raise EngineContractError(
                "vllm_omni: log_prob_attr is set but the backend returned no per-step log-probs"
            )
        trajectory = self.maps.from_engine_latents(
            torch.stack([torch.as_tensor(s["trajectory_latents"]) for s in samples]),
            stage.init_noise_shape,
        )
        segment = segment_from_trajectory(
            engine="vllm_omni",
            stage=stage,
            seed=req.seed,
            trajectory=trajectory,
            log_probs=torch.stack([torch.as_tensor(lp).reshape(-1) for lp in logps])
            if self.has_log_probs
            else None,
            guidance_scale=guidance,
            strategy="vllm_omni",
            storage_dtype=self.storage_dtype,
            init_noise="verify",
            atol=1e-2 if self.storage_dtype != torch.float32 else 0.0,
        )
        track = RolloutTrack(
            sample_ids=req.sample_ids.clone(),
            group_ids=req.group_ids.clone(),
            prompts=req.prompts,
            metadata=[dict(m) for m in req.metadata],
            conditions=conditions.to(torch.device("cpu")),
            segment=segment,
            decoded=self._decoded([s["image"] for s in samples], params),
        )
        return RolloutResp(tracks={self.track_name: track}, timings={"rollout": t_rollout})

    def _decoded(self, outputs: list[Any], params: Any) -> Images | Videos:
        """Images for an image family; ``Videos`` at the request's ``fps`` for a video family,
        each sample's frames checked against ``num_frames``."""
        if not self.maps.video:
            return Images(pixels=pixels_from_output(outputs))
        frames = frames_from_output(outputs)
        if frames.shape[1] != params.num_frames:
            raise EngineContractError(
                f"vllm_omni: asked for {params.num_frames} frames, got videos of {frames.shape[1]}"
            )
        return Videos(frames=frames, fps=float(params.fps))

    @distributed(dispatch=Dispatch.BROADCAST)
    def sleep(self) -> dict[str, Any]:
        self.backend.sleep()
        self.asleep = True
        return {}

    @distributed(dispatch=Dispatch.BROADCAST)
    def wake_up(self) -> dict[str, Any]:
        self.backend.wake_up()
        self.asleep = False
        return {}

    # -- weight sync: the workers hold the weights -----------------------------------------------

    def _sync_prepare(self, manifest: SyncManifest) -> dict[str, str]:
        return {e.name: str(self.dtype) for e in manifest.entries}

    def _apply_synced(
        self, manifest: SyncManifest, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        named = [(e.name, tensors[e.name].to(self.dtype)) for e in manifest.entries]
        self.backend.update_weights(named, kind=manifest.kind, lora_config=manifest.lora_config)
        got = self.backend.weight_checksums(manifest.names)
        return {
            "bytes": sum(t.numel() * t.element_size() for _, t in named),
            "checksums": got,
            "merged": manifest.merged_lora,
        }

    @distributed(dispatch=Dispatch.BROADCAST)
    def receive_ipc(self, payload: IpcPayload, manifest: SyncManifest) -> dict[str, Any]:
        """CUDA IPC: forward the handles unopened to vLLM-Omni's worker processes on this GPU."""
        t0 = time.perf_counter()
        self.backend.update_weights_ipc(
            payload, kind=manifest.kind, lora_config=manifest.lora_config
        )
        got = self.backend.weight_checksums(manifest.names)
        if manifest.expected:
            compare_checksums(manifest.expected, got, where="VllmOmniEngine read-back")
        return {
            "bytes": 0,
            "checksums": got,
            "num_tensors": len(manifest.entries),
            "time_s": time.perf_counter() - t0,
        }

    @distributed(dispatch=Dispatch.BROADCAST)
    def checksums(self, kind: str | None = None, names: list[str] | None = None) -> dict[str, int]:
        if names is None:
            if self._sync_manifest is None:
                raise WeightSyncError("VllmOmniEngine.checksums needs names before the first sync")
            names = self._sync_manifest.names
        return self.backend.weight_checksums(list(names))
