"""``QwenVLPipeline``: the shared causal-LM sampler and token policy with one image per sample.

Sampling: the request's ``image`` primitive (``Images[N, 3, H, W]``, resized by the driver to
``bundle.image_size``) becomes the vision tower's patches, the prefill gets ``pixel_values``
and ``image_grid_thw`` and multimodal-RoPE positions (``vision.mrope_positions``), then the
shared loop decodes. Replay: a right-padded batch (the vision model's rotary positions do not
restart with packed rows), logits only at the columns some row needs, gathered per row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Sequence

import torch

from unirl.models.common_ar.conditions import PromptConditions
from unirl.models.common_ar.engine import hf_prefill
from unirl.models.common_ar.generate import suppress
from unirl.models.common_ar.pipeline import CausalLMPipeline, packed_positions
from unirl.models.common_ar.track import text_track
from unirl.models.qwen_vl.conditions import VisionPromptConditions
from unirl.models.qwen_vl.vision import padded_mrope_positions, patchify
from unirl.types import Images, Packed, RolloutReq, RolloutResp, TextRequest, TextSegment


class QwenVLPipeline(CausalLMPipeline):
    """:class:`CausalLMPipeline` for a ``QwenVLBundle``: every sample has one image."""

    def _images(self, req: RolloutReq) -> list[torch.Tensor]:
        images = req.primitives.get("image")
        if not isinstance(images, Images):
            raise ValueError(
                "QwenVLPipeline: the request carries no 'image' primitive; a vision-language "
                "prompt file gives every line a media image (see datasets/README.md)"
            )
        size = int(self.bundle.config.image_size)
        pixels = images.pixels
        if tuple(pixels.shape[-2:]) != (size, size):
            raise ValueError(
                f"QwenVLPipeline: images are {tuple(pixels.shape[-2:])}, bundle.image_size is "
                f"{size}; the driver resizes them to the bundle's size"
            )
        return [pixels[i] for i in range(len(pixels))]

    def generate(self, req: RolloutReq) -> RolloutResp:
        bundle = self.bundle
        block = req.params_for(self.track_name, TextRequest)
        t0 = time.perf_counter()
        prompt_ids = bundle.encode_prompts(req.prompts)
        images = self._images(req)
        patches = [patchify(img) for img in images]
        t_encode = time.perf_counter() - t0
        uniforms = block.uniforms(req.seed)
        image_token = bundle.prompts.image_token_id

        def pixels(rows: Sequence[int]) -> dict[str, torch.Tensor]:
            return {
                "pixel_values": torch.cat([patches[i][0] for i in rows]).to(bundle.dtype),
                "image_grid_thw": torch.stack([patches[i][1] for i in rows]),
            }

        def positions(rows: Sequence[int], ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            grids = torch.stack([patches[i][1] for i in rows])
            return padded_mrope_positions(ids, mask, image_token, grids)

        t0 = time.perf_counter()
        with bundle.sampling_mode():
            if self.engine is not None:
                # one prefill per distinct (prompt, image): a group shares both
                keys = [
                    (tuple(ids), hashlib.sha1(img.numpy().tobytes()).hexdigest())
                    for ids, img in zip(prompt_ids, images, strict=True)
                ]
                prefill = hf_prefill(
                    bundle.model,
                    prompt_ids,
                    pad_token_id=bundle.pad_token_id,
                    extra_inputs=pixels,
                    positions_fn=positions,
                )
                completions = self.sample(
                    prompt_ids, uniforms, block, prefix_keys=keys, prefill=prefill
                )
            else:
                completions = self.sample(
                    prompt_ids,
                    uniforms,
                    block,
                    prefill_inputs_for=pixels,
                    positions_fn_for=lambda rows: lambda ids, mask: positions(rows, ids, mask),
                )
        t_generate = time.perf_counter() - t0
        track = text_track(
            req, prompt_ids, completions, formatter=bundle.prompts, temperature=block.temperature
        )
        prompt = track.conditions
        if not isinstance(prompt, PromptConditions):
            raise TypeError(f"text_track returned {type(prompt).__name__}, not PromptConditions")
        conditions = VisionPromptConditions(
            prompt_lengths=prompt.prompt_lengths,
            temperature=prompt.temperature,
            pixel_values=Packed.from_list([p for p, _ in patches]),
            image_grid_thw=torch.stack([g for _, g in patches]),
        )
        return RolloutResp(
            tracks={self.track_name: dataclasses.replace(track, conditions=conditions)},
            timings={"encode": t_encode, "generate": t_generate, **self.engine_timings()},
        )

    def token_log_probs(  # type: ignore[override]
        self, conditions: VisionPromptConditions, segment: TextSegment
    ) -> Packed:
        """log π(y_t | y_<t, image) at every loss token, fp32, 0 elsewhere (see module doc)."""
        bundle = self.bundle
        device = bundle.device
        tokens = segment.tokens.values.to(device)
        offsets = segment.tokens.offsets.to(device)
        lengths = (offsets[1:] - offsets[:-1]).tolist()
        n, width = len(lengths), max(lengths)
        positions_in_row = packed_positions(offsets)
        if segment.loss_mask is not None:
            wanted = segment.loss_mask.values.to(device).bool() & (positions_in_row > 0)
        else:
            wanted = positions_in_row > 0
        rows = torch.repeat_interleave(
            torch.arange(n, device=device), torch.as_tensor(lengths, device=device)
        )
        ids = torch.full((n, width), bundle.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros((n, width), dtype=torch.long, device=device)
        ids[rows, positions_in_row] = tokens
        mask[rows, positions_in_row] = 1
        grids = conditions.image_grid_thw.to(device)
        position_ids = padded_mrope_positions(ids, mask, bundle.prompts.image_token_id, grids)
        targets = wanted.nonzero()[:, 0]
        if targets.numel() == 0:
            raise ValueError("token_log_probs: the micro-batch holds no token to score")
        columns = torch.unique(positions_in_row[targets] - 1)  # logits only where a row needs one
        with bundle.autocast():
            out = bundle.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                pixel_values=conditions.pixel_values.values.to(device=device, dtype=bundle.dtype),
                image_grid_thw=grids,
                use_cache=False,
                logits_to_keep=columns,
            )
        column_of = torch.full((width,), -1, dtype=torch.long, device=device)
        column_of[columns] = torch.arange(len(columns), device=device)
        picked_logits = out.logits[rows[targets], column_of[positions_in_row[targets] - 1]]
        picked_logits = suppress(picked_logits.float(), bundle.prompts.suppressed_token_ids)
        logp = torch.log_softmax(picked_logits / float(conditions.temperature), dim=-1)
        picked = logp.gather(1, tokens[targets][:, None])[:, 0]
        values = torch.zeros(tokens.shape[0], dtype=torch.float32, device=device)
        values = values.index_put((targets,), picked)
        return Packed(values=values, offsets=segment.tokens.offsets)
