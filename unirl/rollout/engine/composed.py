"""The composed engine: an autoregressive prompt enhancer feeding a diffusion model.

One request in, one response with two tracks out, on the same worker:

    user prompts --AR generate--> rewrites (the parent track)
                 --clean / cap--> drawn prompts --diffusion generate (k each)--> images
                                                  (the child track, lineage to its rewrite)

Who samples each track is pluggable: the *text sampler* is the trained policy's own causal-LM
pipeline (trainside: a sibling of the trainer roles, no weight copy) or a dedicated text
engine sibling that holds its own copy of the policy (``SGLangLLMEngine``: the trainer syncs
the policy's weights into it, ``unirl.trainer.pe``); the *image sampler* is the drawer's
flow-matching pipeline (frozen, or trained beside it with ``pe.train_both``) or a dedicated
diffusion engine sibling (``DedicatedEngine``: its own copy of the trained drawer, synced by
the trainer). Anything with ``generate(req) -> RolloutResp`` plugs in; the track it answers
is its ``track_name`` (an engine's: its ``pipeline.track_name``). This engine only composes.

The driver authors everything random: the AR stage's ``TextRequest`` (seed ids) under the
parent track's name and a fanned-out :class:`DiffusionRequest` under the child's (each
rewrite's ``k`` image ids, their x_T ids, the SDE steps, the σ schedule and the drawer's
sampling params), so a
sample's tokens and noise depend on ``(seed, id)`` only, whatever the data-parallel split.

Which text the drawer sees: the completion without the policy's ``response_prefix`` (a
prefill such as Qwen3's empty think block), surrounding whitespace stripped, cut to
``max_rewrite_chars`` characters. An empty rewrite (nothing left after stripping) is never
drawn as an empty prompt: ``empty_rewrite: original`` draws the user's prompt instead and
keeps the sample (the policy is scored as if it had copied the prompt), ``drop`` draws the
user's prompt too but drops the rewrite's images, so the rewrite leaves the advantages and the
update; either way the parent's metadata marks it (``rewrite_empty``) and the trainer counts
it (``pe/empty_rewrites``).

The child track's ``prompts`` are the *user's* prompts (what a reward compares an image with:
scoring against the rewrite would let the policy write prompts that are easy to satisfy); the
drawn text is in each child's metadata as ``rewrite``. Child groups are the ``k`` images of
one rewrite (``group_ids`` = the parent sample id), parent groups the rewrites of one user
prompt.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import torch

from unirl.config.require import require
from unirl.config.typecheck import PositiveInt
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import (
    STATUS_DROPPED,
    DiffusionRequest,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    TextRequest,
    Texts,
)
from unirl.types.resident import park, unpark

EmptyRewrite = Literal["original", "drop"]


def clean_rewrite(text: str, max_chars: int) -> tuple[str, bool]:
    """``(drawn text, capped)``: ``text`` stripped, cut to ``max_chars`` characters and
    stripped again (a cut never leaves trailing whitespace)."""
    stripped = text.strip()
    if len(stripped) <= max_chars:
        return stripped, False
    return stripped[:max_chars].rstrip(), True


def sampler_track(sampler: Any) -> str:
    """The track a sampler answers: its ``track_name`` (a pipeline, the SGLang text engine),
    else its pipeline's (``DedicatedEngine``)."""
    name = getattr(sampler, "track_name", None)
    if name is None:
        name = getattr(getattr(sampler, "pipeline", None), "track_name", None)
    if name is None:
        raise TypeError(
            f"{type(sampler).__name__} names no track (track_name, or pipeline.track_name); "
            "a composed engine's sampler must say which track its response holds"
        )
    return str(name)


class ComposedEngine:
    """Prompt enhancer -> drawer on one worker: ``text_sampler`` rewrites each prompt,
    ``image_sampler`` (a flow-matching pipeline, frozen or trained) draws ``k`` images of each
    rewrite.

    ``text_sampler``: the policy's causal-LM pipeline (trainside) or a dedicated text engine
    sibling (``SGLangLLMEngine``); ``image_sampler``: the drawer's pipeline or a dedicated
    diffusion engine sibling. A dedicated sampler is woken, synced and put to sleep by the
    trainer's layout, never by this engine. ``text_track`` / ``image_track`` (class attributes): the response's
    track names, also the keys of the request's stage blocks. ``max_rewrite_chars``: the
    longest text the drawer is given. ``empty_rewrite``: ``original`` | ``drop`` (module
    docstring). ``resident``: as :class:`~unirl.rollout.engine.trainside.TrainsideEngine` (a
    training rollout's conditions, trajectories and media stay on this worker; only where the
    trainer is a sibling, i.e. not on a separate rollout slab). ``keep_image_trajectory``:
    keep the child's conditions and trajectory (a trained drawer needs them; a frozen one
    drops them at once).
    """

    engine_kind = "trainside"
    text_track = "pe"
    image_track = "diffusion"

    def __init__(
        self,
        *,
        text_sampler: Any,
        image_sampler: Any,
        max_rewrite_chars: PositiveInt = 512,
        empty_rewrite: EmptyRewrite = "original",
        resident: bool = True,
        keep_image_trajectory: bool = False,
    ) -> None:
        require(
            max_rewrite_chars >= 1,
            f"rollout.max_rewrite_chars must be >= 1, got {max_rewrite_chars}",
        )
        require(
            empty_rewrite in ("original", "drop"),
            f"rollout.empty_rewrite must be 'original' (draw the user's prompt) or 'drop' "
            f"(drop the rewrite's images), got {empty_rewrite!r}",
        )
        self.text_sampler = text_sampler
        self.image_sampler = image_sampler
        self.max_rewrite_chars = int(max_rewrite_chars)
        self.empty_rewrite: EmptyRewrite = empty_rewrite
        self.resident = bool(resident)
        self.keep_image_trajectory = bool(keep_image_trajectory)

    @property
    def response_prefix(self) -> str:
        """The policy's prefilled assistant text (e.g. Qwen3's empty think block): part of the
        decoded completion, never of the drawn prompt. A dedicated text engine states it
        (``response_prefix``, from the bundle block it formats prompts with); the policy's
        pipeline carries it in ``bundle.config.response_prefix``."""
        stated = getattr(self.text_sampler, "response_prefix", None)
        if stated is not None:
            return str(stated)
        config = getattr(getattr(self.text_sampler, "bundle", None), "config", None)
        return str(getattr(config, "response_prefix", "") or "")

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """This rank's shard: its rewrites and their images, as two tracks on CPU (without
        the resident training inputs when ``resident``)."""
        resp = self.compose(req)
        if self.resident and req.mode == "train":
            resp = park(resp, f"rollout_{req.rollout_index}")
        return resp.to("cpu")

    def compose(self, req: RolloutReq) -> RolloutResp:
        """AR generate -> cleaned rewrites -> diffusion generate; tensors where the pipelines
        left them."""
        draw = req.params_for(self.image_track, DiffusionRequest)
        if draw.sample_ids is None:
            raise ValueError(
                f"the composed engine draws k images per rewrite: the {self.image_track!r} "
                "DiffusionRequest needs its fan-out (sample_ids[N, k], init_noise_ids[N, k])"
            )
        text_name = sampler_track(self.text_sampler)
        text_req = dataclasses.replace(
            req, stage_params={text_name: req.params_for(self.text_track, TextRequest)}
        )
        text_resp = self.text_sampler.generate(text_req)
        parent = text_resp.tracks[text_name]
        assert isinstance(parent.decoded, Texts), "the text sampler returns decoded Texts"

        t0 = time.perf_counter()
        user_prompts = list(req.prompts)
        prefix = self.response_prefix
        drawn, parent_meta, empty = [], [], []
        for completion, prompt, meta in zip(
            parent.decoded.texts, user_prompts, parent.metadata, strict=True
        ):
            if prefix and completion.startswith(prefix):  # the prefill is not the model's text
                completion = completion[len(prefix) :]
            text, capped = clean_rewrite(completion, self.max_rewrite_chars)
            meta = {**meta, "rewrite": text, "rewrite_empty": not text, "rewrite_capped": capped}
            empty.append(not text)
            drawn.append(text or prompt)  # an empty rewrite is never drawn as ""
            parent_meta.append(meta)
        parent = dataclasses.replace(parent, metadata=parent_meta)

        k = draw.fan_out
        image_name = sampler_track(self.image_sampler)
        child_meta = [
            {**req.metadata[i], "rewrite": drawn[i], "parent_prompt": user_prompts[i]}
            for i in range(len(req))
            for _ in range(k)
        ]
        parent_ids = req.sample_ids.repeat_interleave(k)
        child_req = RolloutReq(
            sample_ids=draw.sample_ids.reshape(-1).clone(),
            group_ids=parent_ids.clone(),  # a rewrite's k images are one group
            primitives={"text": Texts(texts=[t for t in drawn for _ in range(k)])},
            metadata=child_meta,
            stage_params={image_name: draw.expand()},
            sampling_params=draw.own_sampling(),
            seed=req.seed,
            rollout_index=req.rollout_index,
            mode=req.mode,
        )
        t_compose = time.perf_counter() - t0
        image_resp = self.image_sampler.generate(child_req)
        child = image_resp.tracks[image_name]
        status = child.status
        if self.empty_rewrite == "drop" and any(empty):
            dropped = torch.tensor(empty, dtype=torch.bool).repeat_interleave(k)
            status = torch.where(dropped.to(status.device), STATUS_DROPPED, status)
        extra: dict[str, Any] = {}
        if not self.keep_image_trajectory:
            extra = {"conditions": None, "segment": None}
        child = dataclasses.replace(
            child,
            prompts=[p for p in user_prompts for _ in range(k)],
            parent_ids=parent_ids.to(child.sample_ids.device),
            parent_track=self.text_track,
            status=status,
            **extra,
        )
        timings = {f"{self.text_track}/{k_}": v for k_, v in text_resp.timings.items()}
        timings.update({f"{self.image_track}/{k_}": v for k_, v in image_resp.timings.items()})
        timings[f"{self.text_track}/compose"] = t_compose
        return RolloutResp(
            tracks={self.text_track: parent, self.image_track: child}, timings=timings
        )

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def fetch_decoded(self, track: RolloutTrack) -> RolloutTrack:
        """This rank's shard of ``track`` with its parked media (on CPU); unchanged if none."""
        return unpark(track, ("decoded",)).to("cpu")

    @distributed(dispatch=Dispatch.BROADCAST)
    def sleep(self) -> None:
        """Nothing to free here: the samplers are this worker's roles (a dedicated text
        engine sleeps and wakes through the trainer's layout)."""

    @distributed(dispatch=Dispatch.BROADCAST)
    def wake_up(self) -> None:
        """Nothing to restore."""
