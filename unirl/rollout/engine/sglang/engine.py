"""``SGLangEngine``: the rollout contract on top of an SGLang diffusion server.

One server per rollout worker (launched as a child process, or reached at ``server_url``).
``generate`` sends one ``/rollout/generate`` call per prompt group and maps the per-sample
outputs (dense trajectory, σ schedule, per-step log-probs, encoded conditions, images) into a
``RolloutTrack`` with a sparse ``LatentSegment``; the ``engine_maps`` of the family it serves
turn the recorded denoising env into that family's conditions and its latent layout into ours.
Weight-sync receivers forward the tensors to the server (``/update_weights_from_tensor``) and
verify them with the server's SHA-256 checker before reporting success. See README.md: no GPU run of this adapter was possible here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from unirl.config.precision import parse_dtype
from unirl.config.require import require
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.weight_sync.checksum import tensor_checksum
from unirl.distributed.weight_sync.group import free_port
from unirl.distributed.weight_sync.manifest import SyncManifest, WeightSyncError
from unirl.distributed.weight_sync.receiver import WeightReceiver
from unirl.distributed.weight_sync.tensor_wire import DecodedBucket
from unirl.models.common.engine_maps import EngineMapError, engine_maps_for
from unirl.rollout.engine.dedicated.trajectory import (
    EngineContractError,
    check_sigmas,
    pixels_from_output,
    prompt_groups,
    segment_from_trajectory,
)
from unirl.rollout.engine.sglang.client import sha256_like_sglang
from unirl.rollout.engine.sglang_server import ServerSleep
from unirl.types import (
    DiffusionRequest,
    Images,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    noise_seed,
)


class SGLangEngine(ServerSleep, WeightReceiver):
    """Rollout through SGLang's diffusion engine (``sglang.multimodal_gen``).

    ``model_path``: what the server loads. ``family``: the bundle class of that model (the
    recipe's ``${bundle._target_}``); its ``engine_maps`` map SGLang's denoising env into the
    family's conditions (a family without one is refused here, before any server starts).
    ``server_url``: use a running server instead of launching one (``launch=false``). ``server_args``: extra ``sglang serve`` flags.
    ``dtype``: the server's weight dtype (for the SHA-256 read-back check).
    ``sde_type``: SGLang's ``rollout_sde_type``. ``init_noise``: ``record`` (SGLang draws x_T
    from its own generator; the segment keeps the engine's latents) or ``verify``.
    ``target_module``: the pipeline module weight syncs update. ``client``: a ready client
    object (tests inject a fake); when omitted, sglang must be installed.
    ``request_timeout_s``: the HTTP timeout (s) of each request to the server;
    ``startup_timeout_s``: how long a launched server may take to answer ``/health``.
    ``storage_dtype``: the dtype the returned trajectories are stored in (the segment the
    trainer replays).
    ``strict_version``: refuse a server whose ``/server_info`` version is not one of
    ``SUPPORTED_SGLANG_VERSIONS`` (default: one warning line naming both).
    """

    engine_kind = "sglang"
    track_name = "diffusion"

    @classmethod
    def check_config(cls, block: dict[str, Any], recipe: Any) -> None:
        """Before Ray: the family this engine serves has SGLang maps (no server starts)."""
        family = block.get("family")
        if family is not None:
            engine_maps_for(family, "sglang")  # ConfigError naming the family and the engine

    def __init__(
        self,
        *,
        model_path: str,
        family: str | type,
        server_url: str | None = None,
        launch: bool = True,
        server_args: list[str] | None = None,
        dtype: str = "bf16",
        sde_type: str = "sde",
        init_noise: str = "record",
        target_module: str = "transformer",
        request_timeout_s: float = 600.0,
        startup_timeout_s: float = 900.0,
        storage_dtype: str = "bf16",
        strict_version: bool = False,
        client: Any = None,
    ) -> None:
        require(
            init_noise in ("record", "verify"),
            f"rollout.init_noise must be record or verify, got {init_noise!r}",
        )
        require(
            server_url is not None or launch or client is not None,
            "rollout: set server_url or launch=true",
        )
        self.maps = engine_maps_for(family, "sglang")
        self.model_path = model_path
        self.dtype = parse_dtype(dtype, "rollout.dtype")
        self.storage_dtype = parse_dtype(storage_dtype, "rollout.storage_dtype")
        self.sde_type = sde_type
        self.init_noise = init_noise
        self.target_module = target_module
        self.process = None
        if client is None:
            from unirl.rollout.engine.sglang.client import SGLangHttpClient, launch_server

            if server_url is None:
                port = free_port()
                self.process = launch_server(
                    model_path=model_path,
                    port=port,
                    args=list(server_args or []),
                    startup_timeout_s=startup_timeout_s,
                )
                server_url = f"http://127.0.0.1:{port}"
            client = SGLangHttpClient(base_url=server_url, timeout_s=request_timeout_s)
            client.check_version(strict=strict_version)
        self.client = client
        self.asleep = False

    # -- sampling ----------------------------------------------------------------------------------

    def _payload(self, req: RolloutReq, stage: DiffusionRequest, rows: list[int]) -> dict[str, Any]:
        params = req.sampling_params
        return {
            "prompt": req.prompts[rows[0]],
            "negative_prompt": params.negative_prompt,
            "seed": noise_seed(req.seed, int(req.sample_ids[rows[0]]), "sglang") % (2**31),
            "width": params.width,
            "height": params.height,
            "num_inference_steps": stage.num_steps,
            "num_outputs_per_prompt": len(rows),
            **self.maps.sglang_guidance(params.guidance_for(req.mode)),
            "rollout": True,
            "rollout_sde_type": self.sde_type,
            "rollout_noise_level": params.eta,
            "rollout_debug_mode": False,
            "rollout_sde_step_indices": [int(i) for i in stage.sde_indices[rows[0]].tolist()],
            "rollout_return_dit_trajectory": True,
            "rollout_return_denoising_env": True,
        }

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """This rank's shard: one server call per prompt group, mapped into the contract."""
        if self.asleep:
            raise RuntimeError(
                "SGLangEngine.generate while asleep; the driver calls wake_up() first"
            )
        stage = req.params_for(self.track_name, DiffusionRequest)
        t0 = time.perf_counter()
        outputs: list[dict[str, Any]] = []
        for rows in prompt_groups(req.prompts, stage.sde_indices):
            got = self.client.rollout_generate(self._payload(req, stage, rows))
            if len(got) != len(rows):
                raise EngineContractError(f"sglang: asked for {len(rows)} samples, got {len(got)}")
            outputs.extend(got)
        t_rollout = time.perf_counter() - t0
        for key in ("dit_trajectory", "rollout_log_probs", "generated_output"):
            missing = [i for i, o in enumerate(outputs) if o.get(key) is None]
            if missing:
                raise EngineContractError(
                    f"sglang: {len(missing)} sample(s) came back without {key!r} (rollout=true?)"
                )
        trajectory = self.maps.from_engine_latents(
            torch.stack([torch.as_tensor(o["dit_trajectory"]["latents"]) for o in outputs]),
            stage.init_noise_shape,
        )
        check_sigmas("sglang", torch.as_tensor(outputs[0]["dit_trajectory"]["sigmas"]), stage)
        params = req.sampling_params
        segment = segment_from_trajectory(
            engine="sglang",
            stage=stage,
            seed=req.seed,
            trajectory=trajectory,
            log_probs=torch.stack(
                [torch.as_tensor(o["rollout_log_probs"]).reshape(-1) for o in outputs]
            ),
            guidance_scale=params.guidance_for(req.mode),
            strategy=f"sglang:{self.sde_type}",
            storage_dtype=self.storage_dtype,
            init_noise=self.init_noise,
        )
        track = RolloutTrack(
            sample_ids=req.sample_ids.clone(),
            group_ids=req.group_ids.clone(),
            prompts=req.prompts,
            metadata=[dict(m) for m in req.metadata],
            conditions=self._conditions([o.get("denoising_env") or {} for o in outputs]),
            segment=segment,
            decoded=Images(
                pixels=pixels_from_output([torch.as_tensor(o["generated_output"]) for o in outputs])
            ),
        )
        return RolloutResp(tracks={self.track_name: track}, timings={"rollout": t_rollout})

    def _conditions(self, envs: list[dict[str, Any]]) -> Any:
        """The family's conditions from the per-sample denoising envs (its engine maps)."""
        try:
            return self.maps.sglang_conditions(envs)
        except EngineMapError as exc:
            raise EngineContractError(f"sglang: {exc}") from exc

    # -- weight sync: the server holds the weights ------------------------------------------------

    def _sync_prepare(self, manifest: SyncManifest) -> dict[str, str]:
        """The server exposes no parameter table: names and shapes are checked by its SHA-256
        checker after the update (missing names are reported there); dtypes are the server's."""
        return {e.name: str(self.dtype) for e in manifest.entries}

    def _apply_synced(
        self, manifest: SyncManifest, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        """Colocated syncs (``local`` / ``cuda_ipc``): one update with SGLang's own serializer
        (CUDA tensors as IPC handles), then the SHA-256 check."""
        named = [(e.name, tensors[e.name].to(self.dtype)) for e in manifest.entries]
        self._post_update(manifest, named, serialization="ipc")
        return self._verified(manifest, named)

    def _apply_tensor_buckets(
        self, manifest: SyncManifest, buckets: Iterable[DecodedBucket]
    ) -> dict[str, Any]:
        """``tensor`` transport: each bucket is one update with the tensors' bytes inline (the
        server may be on another node), then one SHA-256 check of everything."""
        named: list[tuple[str, torch.Tensor]] = []
        for bucket in buckets:
            part = [(n, t.to(self.dtype)) for n, t in bucket.tensors.items()]
            self._post_update(manifest, part, serialization="inline")
            named.extend(part)
        got = {n for n, _ in named}
        missing = [e.name for e in manifest.entries if e.name not in got]
        if missing:
            raise WeightSyncError(
                f"sglang: the buckets lack {len(missing)} manifest tensor(s): {missing[:8]}"
            )
        return self._verified(manifest, named)

    def _post_update(
        self, manifest: SyncManifest, named: list[tuple[str, torch.Tensor]], *, serialization: str
    ) -> None:
        lora = manifest.lora_config if manifest.kind == "lora" else None
        out = self.client.update_weights_from_tensor(
            named,
            target_modules=[self.target_module],
            weight_update_mode=("merge" if manifest.merged_lora else "lora") if lora else None,
            lora_rank=int(lora["r"]) if lora else None,
            lora_alpha=float(lora["lora_alpha"]) if lora else None,
            serialization=serialization,
        )
        if not out.get("success", False):
            raise WeightSyncError(
                f"sglang update_weights_from_tensor failed: {out.get('message', out)}"
            )

    def _verified(
        self, manifest: SyncManifest, named: list[tuple[str, torch.Tensor]]
    ) -> dict[str, Any]:
        check = self.client.check_weights(
            self.target_module, {n: sha256_like_sglang(t) for n, t in named}
        )
        if not check.get("success", False):
            raise WeightSyncError(f"sglang read-back check failed: {check.get('message', check)}")
        # the server confirmed it holds exactly these tensors (SHA-256): their checksums are the
        # read-back the driver compares with the trainer's
        received = sum(t.numel() * t.element_size() for _, t in named)
        checksums = {n: tensor_checksum(t) for n, t in named}
        return {"bytes": received, "checksums": checksums, "merged": bool(manifest.merged_lora)}

    @distributed(dispatch=Dispatch.BROADCAST)
    def checksums(self, kind: str | None = None, names: list[str] | None = None) -> dict[str, int]:
        raise WeightSyncError(
            "SGLangEngine cannot read weights back into unirl checksums; syncs are verified by the "
            "server's SHA-256 checker (/update_weights_from_tensor_checker) instead"
        )

    def __del__(self) -> None:
        proc = getattr(self, "process", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
