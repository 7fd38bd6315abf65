"""Latent geometry and velocity-call inputs every image family shares, written once.

Two latent layouts cover the image families; a bundle mixes in the one it carries (before
``FlowMatchingBundle`` in its bases) and sets the attributes it reads in ``load``:

- :class:`VAELatentGeometry`: the VAE latent ``[C, H/f, W/f]``, patchified inside the
  transformer (SD3, Z-Image); reads ``latent_channels``, ``vae_scale_factor``, ``patch_size``.
- :class:`PackedLatentGeometry`: 2x2 patches of the VAE latent packed channels last,
  ``[H/2f, W/2f, 4·C]`` (Qwen-Image, FLUX.2); reads ``vae_scale_factor``,
  ``packed_channels``.

A video family (Wan, HunyuanVideo 1.5) mixes in :class:`VideoLatentGeometry`: a causal video
VAE's ``[C, F, H/f, W/f]`` with ``F = (num_frames − 1)/t + 1`` (:func:`check_video_frames`);
:func:`video_pixels` turns its decoded videos into the project's pixel layout.

:func:`sigma_per_sample` is the σ check at the top of every ``predict_velocity``.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass
from typing import ClassVar

import torch

from unirl.config.require import ConfigError
from unirl.types import DiffusionSamplingParams

PATCH = 2  # the 2x2 packing of VAE latents into tokens (PackedLatentGeometry)


def require_latent_multiple(height: int, width: int, multiple: int, why: str) -> None:
    """``height`` and ``width`` must be positive multiples of ``multiple`` (``why`` says
    which factors make it)."""
    if height % multiple or width % multiple or height <= 0 or width <= 0:
        raise ValueError(
            f"sampling.height={height} and sampling.width={width} must be positive multiples of "
            f"{multiple} ({why})"
        )


def sigma_per_sample(
    sigma: torch.Tensor | float, latents: torch.Tensor, conditions: Sized, *, device: torch.device
) -> torch.Tensor:
    """``sigma`` as float32 ``[B]`` on ``device`` for ``latents[B, ...]`` (a scalar or one
    value is broadcast); refuses ``conditions`` without ``B`` rows and a σ of another length."""
    b = latents.shape[0]
    if len(conditions) != b:
        raise ValueError(f"predict_velocity: {b} latents but {len(conditions)} condition rows")
    sigma_t = torch.as_tensor(sigma, dtype=torch.float32, device=device).reshape(-1)
    if sigma_t.numel() == 1:
        return sigma_t.expand(b)
    if sigma_t.numel() != b:
        raise ValueError(f"predict_velocity: sigma has {sigma_t.numel()} values for {b} latents")
    return sigma_t


class VAELatentGeometry:
    """Latents are the VAE's ``[C, H/f, W/f]``; the transformer cuts ``patch_size`` patches."""

    latent_channels: int
    vae_scale_factor: int
    patch_size: int

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """``(C, H/f, W/f)``: the VAE latent of a ``height x width`` image (``f`` the VAE
        factor; sizes multiples of ``f · patch_size``)."""
        f, p = self.vae_scale_factor, self.patch_size
        require_latent_multiple(height, width, f * p, f"VAE factor {f} x {p}x{p} patches")
        return (self.latent_channels, height // f, width // f)

    def image_seq_len(self, height: int, width: int) -> int:
        """Image tokens the transformer sees (what a resolution-dependent σ shift reads)."""
        _, h, w = self.latent_shape(height, width)
        return (h // self.patch_size) * (w // self.patch_size)


class PackedLatentGeometry:
    """Latents are carried packed, ``[H/2f, W/2f, 4·C]``: one 2x2 patch of the C-channel
    VAE latent per token, channels last (``reshape(N, L, 4·C)`` is diffusers' packed
    sequence)."""

    vae_scale_factor: int
    packed_channels: int

    def check_packing(self, latent_channels: int) -> None:
        """The transformer's ``in_channels`` (``packed_channels``) must be 2x2 patches of the
        VAE's ``latent_channels``."""
        if self.packed_channels != PATCH * PATCH * latent_channels:
            raise ValueError(
                f"transformer in_channels={self.packed_channels} is not {PATCH}x{PATCH} patches of "
                f"the VAE's {latent_channels} latent channels"
            )

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """``(H/2f, W/2f, 4·C)``: the packed latent of a ``height x width`` image."""
        f = self.vae_scale_factor
        multiple = f * PATCH
        require_latent_multiple(
            height, width, multiple, f"VAE factor {f} x {PATCH}x{PATCH} packing"
        )
        return (height // multiple, width // multiple, self.packed_channels)

    def image_seq_len(self, height: int, width: int) -> int:
        """Generated-image tokens (reference tokens excluded): μ of a dynamic shift grows with
        it."""
        grid_h, grid_w, _ = self.latent_shape(height, width)
        return grid_h * grid_w


def check_video_frames(num_frames: int, temporal_factor: int, vae: str) -> None:
    """``num_frames`` must be ``temporal_factor·k + 1``: a causal video VAE keeps the first
    frame and groups the rest by ``temporal_factor``; ``vae`` names it in the error (``the Wan
    VAE``), which offers the two nearest valid counts."""
    if num_frames < 1 or (num_frames - 1) % temporal_factor:
        k = max(0, (num_frames - 1) // temporal_factor)
        raise ConfigError(
            f"sampling.num_frames={num_frames} must be {temporal_factor}·k + 1 ({vae} keeps "
            f"the first frame and groups the rest by {temporal_factor}); use "
            f"{temporal_factor * k + 1} or {temporal_factor * (k + 1) + 1}"
        )


def video_pixels(video: torch.Tensor) -> torch.Tensor:
    """A decoded ``video[B, 3, T, H, W]`` in [-1, 1] as ``pixels[B, T, 3, H, W]`` float32 in
    [0, 1]."""
    return (video.float().permute(0, 2, 1, 3, 4) / 2 + 0.5).clamp(0, 1)


@dataclass(frozen=True)
class VideoGrid:
    """A video family's token grid, read from its configs: the VAE's ``spatial`` and
    ``temporal`` compression and the transformer's ``patch_t`` x ``patch`` x ``patch`` patches
    (the size checks and the token count of sequence parallelism both use it)."""

    spatial: int
    temporal: int
    patch_t: int
    patch: int

    def tokens(self, height: int, width: int, frames: int) -> int:
        """The transformer's video tokens per sample at ``height`` x ``width``, ``frames``."""
        latent_frames = (frames - 1) // self.temporal + 1
        side = self.spatial * self.patch
        return (latent_frames // self.patch_t) * (height // side) * (width // side)


class VideoLatentGeometry:
    """Latents are a causal video VAE's ``[C, F, H/f, W/f]`` (``f = spatial_factor``,
    ``F = (num_frames − 1)/temporal_factor + 1``); the transformer cuts ``patch x patch``
    spatial patches. Reads ``latent_channels``, ``spatial_factor``, ``temporal_factor``,
    ``patch``; ``video_vae`` names the VAE in a frame-count error."""

    latent_channels: int
    spatial_factor: int
    temporal_factor: int
    patch: int
    video_vae: ClassVar[str] = "the video VAE"

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames of a ``num_frames`` video (``(num_frames - 1) / t + 1``)."""
        check_video_frames(num_frames, self.temporal_factor, self.video_vae)
        return (num_frames - 1) // self.temporal_factor + 1

    def video_latent_shape(
        self, num_frames: int, height: int, width: int
    ) -> tuple[int, int, int, int]:
        """``(C, F, H/f, W/f)``: the latent of a ``num_frames x height x width`` video (sizes
        multiples of ``f · patch``)."""
        f, p = self.spatial_factor, self.patch
        require_latent_multiple(height, width, f * p, f"VAE factor {f} x {p}x{p} patches")
        return (self.latent_channels, self.latent_frames(num_frames), height // f, width // f)

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int, int]:
        """The latent of one frame (``num_frames=1``); videos: :meth:`latent_shape_for`."""
        return self.video_latent_shape(1, height, width)

    def latent_shape_for(self, params: DiffusionSamplingParams) -> tuple[int, int, int, int]:
        """The latent of a request's sampling params (``num_frames``, ``height``, ``width``)."""
        return self.video_latent_shape(
            int(getattr(params, "num_frames", 1)), int(params.height), int(params.width)
        )

    def image_seq_len(self, height: int, width: int) -> int:
        """Tokens of one latent frame (a video family's σ shift is static: nothing reads it
        for σ)."""
        _, _, h, w = self.latent_shape(height, width)
        return (h // self.patch) * (w // self.patch)
