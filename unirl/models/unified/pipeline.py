"""Sampling and replay of the unified model: the text stage, the image stage, and the
two-stage sampler that chains them on one worker.

- :class:`TransfusionTextPipeline` is the shared causal-LM sampler and token policy
  (``CausalLMPipeline``) under this family's name: track ``text``.
- :class:`TransfusionImagePipeline` is the shared flow-matching pipeline
  (``FlowMatchingPipeline``: denoise loop, SDE kernels, sparse trajectory, replay); its
  conditions are :class:`ContextConditions`: the prompt alone when called on its own (the
  family tester), or the prompt plus the text the model wrote (the two-stage sampler).
- :class:`TransfusionPipeline` writes first, then draws: ``generate(req)`` samples the
  ``text`` track (a "think / recaption" completion after each prompt, KV-cached), builds each
  sample's context from the exact token ids (prompt + completion), and denoises one image per
  text sample into the ``image`` track, whose ``parent_ids`` name the text sample.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.pipeline import FlowMatchingPipeline
from unirl.models.common_ar.pipeline import CausalLMPipeline
from unirl.models.unified.conditions import ContextConditions
from unirl.sde.kernels import SDEStrategy
from unirl.types import (
    DiffusionRequest,
    DiffusionSamplingParams,
    RolloutReq,
    RolloutResp,
    TextRequest,
    Texts,
    TextSegment,
)

if TYPE_CHECKING:
    from unirl.models.unified.bundle import TransfusionBundle

TEXT_TRACK = "text"
IMAGE_TRACK = "image"


class TransfusionTextPipeline(CausalLMPipeline):
    """:class:`~unirl.models.common_ar.pipeline.CausalLMPipeline` for a ``TransfusionBundle``
    (track ``text``; every knob of the shared pipeline, ``sampler`` and ``engine`` included)."""


class TransfusionImagePipeline(FlowMatchingPipeline):
    """:class:`~unirl.models.common.pipeline.FlowMatchingPipeline` for a ``TransfusionBundle``
    (track ``image``). ``generate(req, context=...)`` draws conditioned on given context
    tokens; without ``context`` each image is conditioned on its formatted prompt alone.
    ``track_name``: its track (and request block) name, ``image`` by default."""

    track_name = IMAGE_TRACK

    def __init__(
        self,
        *,
        bundle: TransfusionBundle,
        strategy: SDEStrategy,
        track_name: str = IMAGE_TRACK,
        **knobs: Any,
    ) -> None:
        super().__init__(bundle=bundle, strategy=strategy, **knobs)
        self.track_name = track_name
        self._context: ContextConditions | None = None

    def encode(
        self, prompts: list[str], params: DiffusionSamplingParams, guidance_scale: float
    ) -> ContextConditions:
        if guidance_scale > 1.0:
            raise ValueError(
                f"sampling.guidance_scale={guidance_scale}: the transfusion family has no "
                "unconditional branch; set sampling.guidance_scale=1"
            )
        if self._context is not None:
            if len(self._context) != len(prompts):
                raise ValueError(
                    f"{len(self._context)} context rows for {len(prompts)} image samples"
                )
            return self._context
        return self.bundle.prompt_context(list(prompts))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels of final latents (the bundle's ``decode`` is the text half's)."""
        return self.bundle.decode_latents(latents)

    @torch.no_grad()
    def generate(self, req: RolloutReq, context: ContextConditions | None = None) -> RolloutResp:
        """The shared pipeline's ``generate``; ``context`` (one row per sample) replaces the
        prompt-only encoding."""
        self._context = context
        try:
            return super().generate(req)
        finally:
            self._context = None


class TransfusionPipeline:
    """Text, then an image conditioned on it, on one worker: ``generate(req)`` returns the
    ``text`` track (the parent) and the ``image`` track (one image per text sample; its
    ``parent_ids`` are the text sample ids, its ``group_ids`` the request's groups).

    The request carries a ``TextRequest`` under ``text`` and a ``DiffusionRequest``
    under ``image`` (x_T ids, SDE steps, σ and the image sampling params), all authored by the
    driver. ``track_name`` is the text track (what the loop's gallery and eval read first).
    """

    track_name = TEXT_TRACK

    def __init__(
        self, *, text_pipeline: TransfusionTextPipeline, image_pipeline: TransfusionImagePipeline
    ) -> None:
        self.text_pipeline = text_pipeline
        self.image_pipeline = image_pipeline

    @property
    def bundle(self) -> TransfusionBundle:
        return self.image_pipeline.bundle

    @property
    def forward_batch_size(self) -> int | None:
        return self.image_pipeline.forward_batch_size

    @forward_batch_size.setter
    def forward_batch_size(self, value: int | None) -> None:
        self.text_pipeline.forward_batch_size = value
        self.image_pipeline.forward_batch_size = value

    def generate(self, req: RolloutReq) -> RolloutResp:
        text_req = dataclasses.replace(
            req, stage_params={TEXT_TRACK: req.params_for(TEXT_TRACK, TextRequest)}
        )
        text_resp = self.text_pipeline.generate(text_req)
        text = text_resp.tracks[TEXT_TRACK]
        t0 = time.perf_counter()
        # the exact ids the model wrote after its prompt (stop token included)
        segment, decoded = text.segment, text.decoded
        if not isinstance(segment, TextSegment) or not isinstance(decoded, Texts | None):
            raise TypeError(
                f"the {TEXT_TRACK} track holds a {type(segment).__name__} segment and "
                f"{type(decoded).__name__} decoded rows, not a TextSegment and Texts"
            )
        context = ContextConditions(context=segment.tokens)
        stage = req.params_for(IMAGE_TRACK, DiffusionRequest)
        name = self.image_pipeline.track_name
        image_req = dataclasses.replace(
            req, sampling_params=stage.sampling_params, stage_params={name: stage}
        )
        t_context = time.perf_counter() - t0
        image_resp = self.image_pipeline.generate(image_req, context=context)
        image = image_resp.tracks[name]
        thoughts = decoded.texts if decoded is not None else [""] * len(text)
        image = dataclasses.replace(
            image,
            parent_ids=text.sample_ids.clone().to(image.sample_ids.device),
            parent_track=TEXT_TRACK,
            metadata=[{**m, "thought": t} for m, t in zip(image.metadata, thoughts, strict=True)],
        )
        timings = {f"{TEXT_TRACK}/{k}": v for k, v in text_resp.timings.items()}
        timings.update({f"{IMAGE_TRACK}/{k}": v for k, v in image_resp.timings.items()})
        timings[f"{IMAGE_TRACK}/context"] = t_context
        return RolloutResp(tracks={TEXT_TRACK: text, IMAGE_TRACK: image}, timings=timings)
