"""``FlowMatchingPipeline``: RolloutReq -> RolloutResp for any flow-matching family.

A family package binds it to its bundle (a subclass with a name and nothing else); everything
else (the family's guidance, x_T and SDE noise from the request, the denoise loop, decode to
media, replay) is here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.profiler import record_function

from unirl.config.precision import parse_dtype
from unirl.config.typecheck import PositiveInt
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.denoise import (
    StepRecord,
    forward_conditions,
    replay_step,
    sample_trajectory,
)
from unirl.models.common.guidance import CFGGradient, Guidance, guidance_of
from unirl.sde.kernels import SDEStrategy
from unirl.types import (
    Conditions,
    DiffusionRequest,
    DiffusionSamplingParams,
    Images,
    LatentSegment,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    Videos,
    init_noise,
)

# one background thread draws a rollout's SDE noise while the first forwards run (the CPU
# generator is per sample and single-threaded: 28 ms for Flow-GRPO's 8 x 9 SD3.5 latents,
# 0.22 s for one 81-frame Wan video with 16 SDE steps on the development machine)
# (a forked child gets its own: the parent's worker thread does not exist there)
_noise_thread: ThreadPoolExecutor | None = None


def noise_thread() -> ThreadPoolExecutor:
    """This process's thread for SDE noise (created on first use)."""
    global _noise_thread
    if _noise_thread is None:
        _noise_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unirl-sde-noise")
    return _noise_thread


def _forget_noise_thread() -> None:
    global _noise_thread
    _noise_thread = None


os.register_at_fork(after_in_child=_forget_noise_thread)


def _rows_of(noise: Future[torch.Tensor], rows: slice) -> Callable[[], torch.Tensor]:
    """The rows ``rows`` of the noise ``noise`` will hold, when they are asked for."""
    return lambda: noise.result()[rows]


def as_media(pixels: torch.Tensor, fps: float = 16.0) -> Images | Videos:
    """Decoded pixels as the media type they are: ``[N, 3, H, W]`` images or
    ``[N, T, 3, H, W]`` videos at ``fps`` (float32 in [0, 1])."""
    if pixels.ndim == 5:
        return Videos(frames=pixels.float(), fps=float(fps))
    return Images(pixels=pixels.float())


class FlowMatchingPipeline:
    """Samples and replays trajectories of ``bundle`` with the SDE ``strategy``.

    ``storage_dtype`` is the dtype trajectories are carried and stored in (bf16 halves the
    memory; log-probs stay exact because kernels round before taking them).
    ``forward_batch_size`` bounds how many samples one denoise loop runs at once.
    ``record_means`` also stores each trained step's SDE mean (``segment.sde_means``: what
    FlowGRPO's ``ratio_norm=grpo_guard`` and FlowDPPO need with ``old_logp_source=rollout``).
    ``decode_chunk_size`` splits a rollout's latents into chunks of at most this many before
    the bundle's decode (which splits again by ``bundle.decode_chunk_size``); null: one chunk.
    ``record_uncond`` stores the unconditional velocity of every trained step of a guided
    rollout (``segment.sde_uncond``, fp32: bf16 would move log p by ~1e-3) with the policy
    version it was computed at (``bundle.policy_version``, kept by the backend that trains the
    bundle; -1 when the bundle has none, e.g. a dedicated engine's copy, and then it is never
    reused), so a ``cfg_gradient=cond_only`` loss can skip the unconditional forward while the
    policy is unchanged.
    """

    track_name = "diffusion"

    def __init__(
        self,
        *,
        bundle: Any,
        strategy: SDEStrategy,
        storage_dtype: str = "fp32",
        record_means: bool = False,
        record_uncond: bool = False,
        forward_batch_size: PositiveInt | None = None,
        decode_chunk_size: PositiveInt | None = None,
    ) -> None:
        self.bundle = bundle
        self.strategy = strategy
        self.storage_dtype = parse_dtype(storage_dtype, "pipeline.storage_dtype")
        self.record_means = record_means
        self.record_uncond = record_uncond
        self.forward_batch_size = forward_batch_size
        self.decode_chunk_size = decode_chunk_size

    # -- family hooks (the protocol of ``unirl.models.common.protocols``) --------------------

    @property
    def device(self) -> torch.device:
        return self.bundle.device

    @property
    def policy_version(self) -> int:
        """The version of the weights sampling runs with (``bundle.policy_version``, bumped
        by the training backend at every optimizer step), -1 when unknown."""
        version = getattr(self.bundle, "policy_version", None)
        return -1 if version is None else int(version)

    @property
    def guidance(self) -> Guidance:
        """The family's guidance (``bundle.guidance``; batched CFG by default)."""
        return guidance_of(self.bundle)

    @property
    def scheduler_config(self) -> ConfigDict:
        return self.bundle.scheduler_config

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        return tuple(self.bundle.latent_shape(height, width))

    def image_seq_len(self, height: int, width: int) -> int:
        return int(self.bundle.image_seq_len(height, width))

    def cfg_conditions(self, conditions: Conditions) -> Conditions:
        """``[uncond; cond]`` rows; the bundle knows its condition layout."""
        return self.bundle.cfg_conditions(conditions)

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        return self.bundle.predict_velocity(latents, sigma, conditions)

    def encode(
        self, prompts: list[str], params: DiffusionSamplingParams, guidance_scale: float
    ) -> Conditions:
        """Conditions for ``prompts`` (each unique prompt encoded once and shared by its
        group); negative rows are added when CFG runs."""
        if guidance_scale > 1.0:
            return self.bundle.encode_prompts(
                prompts, negative=True, negative_prompt=params.negative_prompt
            )
        return self.bundle.encode_prompts(prompts)

    # -- sampling --------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self, req: RolloutReq, on_decoded: Callable[[slice, torch.Tensor], None] | None = None
    ) -> RolloutResp:
        """Sample every request row; returns one track named ``track_name``.

        ``on_decoded(rows, pixels)``: when given, each forward chunk is decoded as soon as it
        is sampled and handed over (its reward can then run under the next chunk's sampling;
        ``unirl.reward.overlap``); the track's pixels are those chunks, concatenated.

        The σ schedule, SDE steps and x_T recipe come from the request's
        ``DiffusionRequest`` under ``track_name``.

        Every tensor of the track (conditions, trajectory, decoded pixels) is on the
        pipeline's device: the engine decides what leaves the worker and moves it to CPU
        then (a trainside engine keeps a training rollout's tensors where they are, so the
        reward sibling converts the pixels on the device).
        """
        params: DiffusionSamplingParams = req.sampling_params
        stage = req.params_for(self.track_name, DiffusionRequest)
        timings: dict[str, float] = {}
        guidance = params.guidance_for(req.mode)
        num_sde = stage.num_sde_steps
        sde_noise: Future[torch.Tensor] | None = None
        if num_sde:  # drawn while the prompts are encoded, x_T is drawn and the first
            # forwards are launched
            sde_noise = noise_thread().submit(
                init_noise,
                req.sample_ids,
                (num_sde, *stage.init_noise_shape),
                req.seed,
                stream=f"sde/{req.rollout_index}",
            )
        t0 = time.perf_counter()
        with record_function("unirl/text_encode"):
            conditions = self.encode(req.prompts, params, guidance).to(self.device)
            references = req.primitives.get("image")
            if references is not None:  # editing: each row is conditioned on its source image
                conditions = self.bundle.encode_references(
                    conditions,
                    references.pixels.to(self.device),  # type: ignore[attr-defined]
                )
        timings["text_encode"] = time.perf_counter() - t0

        x_T = stage.initial_noise(req.seed)

        t0 = time.perf_counter()
        chunk = self.forward_batch_size or len(req)
        segments = []
        decoded_chunks: list[torch.Tensor] = []
        with record_function("unirl/denoise"), self._sampling_precision():
            for start in range(0, len(req), chunk):
                rows = slice(start, start + chunk)
                segments.append(
                    sample_trajectory(
                        self,
                        conditions=conditions.select(torch.arange(len(req))[rows]),
                        x_T=x_T[rows].to(self.device),
                        sigmas=stage.sigmas,
                        sde_indices=stage.sde_indices[rows],
                        sde_noise=None if sde_noise is None else _rows_of(sde_noise, rows),
                        strategy=self.strategy,
                        guidance_scale=guidance,
                        storage_dtype=self.storage_dtype,
                        record_means=self.record_means,
                        record_uncond=self.record_uncond,
                        policy_version=self.policy_version,
                    )
                )
                if on_decoded is not None:
                    # no sync: the scorer's stream waits for this stream's work so far
                    # (unirl.reward.overlap), and this stream does not wait for the scorer
                    decoded_chunks.append(self.decode(segments[-1].final_latents))
                    on_decoded(rows, decoded_chunks[-1])
            segment = LatentSegment.concat(segments)
            self._sync()
        timings["rollout"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with record_function("unirl/decode"):
            if on_decoded is not None:  # decoded chunk by chunk above
                pixels = torch.cat(decoded_chunks)
            else:
                pixels = self.decode(segment.final_latents)
            self._sync()
        timings["decode"] = time.perf_counter() - t0

        track = RolloutTrack(
            sample_ids=req.sample_ids.clone(),
            group_ids=req.group_ids.clone(),
            prompts=req.prompts,
            metadata=list(req.metadata),
            conditions=conditions,
            segment=segment,
            decoded=as_media(pixels, fps=params.fps),
            references=references,
        )
        return RolloutResp(tracks={self.track_name: track}, timings=timings)

    def _sampling_precision(self) -> contextlib.AbstractContextManager[object]:
        """The bundle's precision switch for sampling forwards (``bundle.fp8_sampling``); a
        bundle without the hook has no such knob."""
        hook = getattr(self.bundle, "sampling_precision", None)
        return contextlib.nullcontext() if hook is None else hook()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        chunk = self.decode_chunk_size or latents.shape[0]
        return torch.cat(
            [self.bundle.decode(latents[i : i + chunk]) for i in range(0, latents.shape[0], chunk)]
        )

    def _sync(self) -> None:
        """Wait for this thread's stream (the phase timings), not the whole device: a reward
        scorer's stream (``rollout.reward_overlap``) keeps running."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    # -- training-side replay -------------------------------------------------------------------

    def replay(
        self,
        conditions: Conditions,
        segment: LatentSegment,
        slot: int,
        *,
        cfg_gradient: CFGGradient = "both",
        reuse_uncond: bool = False,
    ) -> StepRecord:
        """Log-prob, mean and std of trained slot ``slot`` under the current weights;
        ``cfg_gradient``: which CFG branches carry a gradient (the algorithm's knob);
        ``reuse_uncond``: take v_u from ``segment.sde_uncond`` (the caller checked the version)."""
        fwd = forward_conditions(self, conditions, segment.guidance_scale)
        return replay_step(
            self,
            fwd_conditions=fwd,
            segment=segment,
            slot=slot,
            strategy=self.strategy,
            cfg_gradient=cfg_gradient,
            reuse_uncond=reuse_uncond,
        )
