"""Wan prompt and first-frame encoding, computed as ``WanPipeline`` / ``WanImageToVideoPipeline``
compute them.

Text: each prompt is cleaned with the pipeline's own ``prompt_clean`` (HTML unescape, ftfy
when installed, whitespace collapsed), tokenised to exactly ``max_sequence_length`` tokens
(``</s>`` appended, padded, truncated), and run through the UMT5 encoder with the mask; the
hidden states of the real tokens are kept and every padding position is set to zero. The
transformer gets no mask: the zero rows are what it attends to past the prompt.

Image (I2V): the CLIP vision tower's second-to-last hidden state of the processed first frame
(``image_embeds``), and the first frame followed by ``num_frames - 1`` black frames through the
VAE encoder (posterior mean, normalised with the latent statistics) with a 4-channel mask that
marks the first frame as given (``image_condition``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from unirl.models.common.text_encode import warn_truncated_prompts

if TYPE_CHECKING:
    from transformers import CLIPImageProcessor, PreTrainedTokenizerBase


def _device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _dtype_of(module: torch.nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


@torch.no_grad()
def encode_umt5_prompts(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: torch.nn.Module,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
) -> torch.Tensor:
    """``prompt_embeds[N, max_sequence_length, D]`` in the text encoder's dtype, zero past each
    prompt's tokens."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    if not texts:
        raise ValueError("encode_umt5_prompts: no texts to encode")
    cleaned = [prompt_clean(t) for t in texts]
    warn_truncated_prompts(tokenizer, cleaned, max_sequence_length, "bundle.max_sequence_length")
    tokens = tokenizer(
        cleaned,
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    device = _device_of(text_encoder)
    mask = tokens.attention_mask.to(device)
    hidden = text_encoder(tokens.input_ids.to(device), mask).last_hidden_state
    keep = (torch.arange(hidden.shape[1], device=device)[None, :] < mask.sum(dim=1)[:, None]).to(
        hidden.dtype
    )
    return (hidden * keep[..., None]).to(_dtype_of(text_encoder))


def pixels_to_uint8(pixels: torch.Tensor) -> list[np.ndarray]:
    """``pixels[N, 3, H, W]`` in [0, 1] as ``N`` ``H x W x 3`` uint8 arrays (what a PIL image
    of the same picture holds; the CLIP processor reads these)."""
    rounded = (pixels.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return [row.permute(1, 2, 0).cpu().numpy() for row in rounded]


@torch.no_grad()
def encode_clip_images(
    image_processor: CLIPImageProcessor, image_encoder: torch.nn.Module, pixels: torch.Tensor
) -> torch.Tensor:
    """``image_embeds[N, S, D]``: the CLIP tower's second-to-last hidden state of each frame
    (``pixels[N, 3, H, W]`` in [0, 1], quantised to 8 bits as an image file holds it)."""
    inputs = image_processor(images=pixels_to_uint8(pixels), return_tensors="pt")
    values = inputs["pixel_values"].to(_device_of(image_encoder), _dtype_of(image_encoder))
    return image_encoder(pixel_values=values, output_hidden_states=True).hidden_states[-2]


@torch.no_grad()
def encode_first_frame(
    vae: torch.nn.Module,
    pixels: torch.Tensor,
    *,
    num_frames: int,
    latents_mean: torch.Tensor,
    latents_std: torch.Tensor,
    temporal_factor: int,
) -> torch.Tensor:
    """``image_condition[N, 4 + C, F, h, w]``: the first-frame mask (4 channels: one per pixel
    frame folded into each latent frame, 1 on the first frame) then the normalised latent of
    ``[first frame, num_frames - 1 black frames]`` (``pixels[N, 3, H, W]`` in [0, 1])."""
    n, _, height, width = pixels.shape
    dtype = _dtype_of(vae)
    frame = (pixels.float() * 2 - 1).to(_device_of(vae), dtype).unsqueeze(2)
    video = torch.cat([frame, frame.new_zeros(n, 3, num_frames - 1, height, width)], dim=2)
    latent = vae.encode(video).latent_dist.mode().float()
    shape = (1, -1, 1, 1, 1)
    latent = (latent - latents_mean.view(shape).to(latent)) * (
        1.0 / latents_std.view(shape).to(latent)
    )
    frames_latent, grid_h, grid_w = latent.shape[2:]
    # pixel frame 0 stands for the first latent frame alone: repeat its mask T times so every
    # latent frame folds T mask channels
    mask = torch.zeros(n, temporal_factor, frames_latent, grid_h, grid_w, device=latent.device)
    mask[:, :, 0] = 1.0
    return torch.cat([mask, latent], dim=1)
