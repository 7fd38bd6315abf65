"""The tiny presets' decoder shaping for the causal 3-D VAE of Wan and Qwen-Image, written once.

``AutoencoderKLQwenImage`` and ``AutoencoderKLWan`` share one decoder design (causal 3-D
convolutions, per-pixel RMS norms, spatial and temporal resamplers) under two sets of
diffusers class names. A randomly initialised decoder barely reacts to its latents, so a tiny
model could never learn a pixel reward; :class:`TinyCausalDecoder` turns it into a smooth,
strongly responsive up-projection of the latent, frame by frame. The family passes its
diffusers block classes (:class:`CausalBlocks`), whether the temporal upsamplers are shaped
(video) and the batch the output is centred on.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class CausalBlocks:
    """The VAE's diffusers block classes: residual block, resampler, mid attention."""

    residual: type
    resample: type
    attention: type


@dataclass(kw_only=True, frozen=True)
class TinyCausalDecoder:
    """Sizes of the shaping, named as in the families' tiny specs (:meth:`from_spec`);
    ``spec_name`` is that spec's class, named by the error a bad size raises."""

    spec_name: str
    latent_channels: int
    vae_base_dim: int
    decoder_signal_channels: int
    decoder_anchor_channels: int
    decoder_anchor_value: float
    decoder_activation_std: float
    decoder_gain: float
    decoder_residual_damping: float

    @classmethod
    def from_spec(cls, spec: object) -> TinyCausalDecoder:
        """The fields of a family's tiny ``spec`` (same names)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "spec_name"]
        return cls(spec_name=type(spec).__name__, **{n: getattr(spec, n) for n in names})

    @torch.no_grad()
    def shape(
        self,
        vae: Any,
        generator: torch.Generator,
        *,
        blocks: CausalBlocks,
        temporal: bool,
        centre_batch: tuple[int, int, int, int],
    ) -> None:
        """Shape ``vae``'s decoder in place.

        The decoder's channels split into *signal* channels (a random projection of the
        current latent frame, written by ``conv_in`` at the causal kernel's last time slice),
        *anchor* channels (constant ±A from ``conv_in``'s bias) and unused ones. The anchors
        dominate every per-pixel RMS norm, so the norms act as fixed scalings instead of
        erasing each pixel's magnitude. Residual branches and the mid attention are damped,
        1x1 shortcuts pass the carried (signal and anchor) channels, the spatial upsamplers
        blur them (nearest x2 then a 3x3 binomial) and, with ``temporal``, the temporal
        upsamplers (``time_conv``, which doubles the frames of every latent frame after the
        first) copy the current frame into both new frames. The output norm keeps only the
        signal (scaled so SiLU works near its linear range) and ``conv_out`` mixes it into RGB
        centred on mid-grey over ``centre_batch = (N, T, h, w)`` N(0, 1) model-space latents
        (un-normalised with the VAE's ``latents_mean`` / ``latents_std``).
        """
        decoder = vae.decoder
        signal, anchors = self.decoder_signal_channels, self.decoder_anchor_channels
        width = self.vae_base_dim
        if anchors < 2 or anchors % 2 or signal < 3 or signal + anchors > width // 2:
            raise ValueError(
                f"{self.spec_name}: {signal} signal + {anchors} anchor channels must fit half "
                f"the decoder width ({width // 2}); anchors even and >= 2, signal >= 3"
            )
        carried = signal + anchors
        z_dim = self.latent_channels
        eye = torch.eye(carried)

        post = torch.zeros_like(vae.post_quant_conv.weight)
        post[:, :, 0, 0, 0] = torch.eye(z_dim)
        vae.post_quant_conv.weight.copy_(post)
        vae.post_quant_conv.bias.zero_()

        w_in = torch.zeros_like(decoder.conv_in.weight)  # [width, z, t=3, 3, 3]; t=2 is "now"
        w_in[:signal, :, 2, 1, 1] = torch.randn(signal, z_dim, generator=generator) / math.sqrt(
            z_dim
        )
        decoder.conv_in.weight.copy_(w_in)
        b_in = torch.zeros(width)
        b_in[signal:carried] = self.decoder_anchor_value * torch.tensor([1.0, -1.0]).repeat(
            anchors // 2
        )
        decoder.conv_in.bias.copy_(b_in)

        blur = torch.tensor([1.0, 2.0, 1.0])
        blur = (blur[:, None] * blur[None, :]) / 16.0
        for module in decoder.modules():
            if isinstance(module, blocks.residual):
                module.conv2.weight.mul_(self.decoder_residual_damping)
                module.conv2.bias.zero_()
                shortcut = module.conv_shortcut
                if isinstance(shortcut, torch.nn.Conv3d):
                    w = torch.zeros_like(shortcut.weight)
                    w[:carried, :carried, 0, 0, 0] = eye
                    shortcut.weight.copy_(w)
                    shortcut.bias.zero_()
            elif isinstance(module, blocks.resample) and module.mode.startswith("upsample"):
                conv = module.resample[1]
                w = torch.zeros_like(conv.weight)
                for c in range(carried):
                    w[c, c] = blur
                conv.weight.copy_(w)
                conv.bias.zero_()
                if temporal and module.mode == "upsample3d":
                    # [2·dim, dim, 3, 1, 1]: output halves are the two new frames of each frame
                    dim = module.dim
                    w = torch.zeros_like(module.time_conv.weight)
                    w[:carried, :carried, 2, 0, 0] = eye
                    w[dim : dim + carried, :carried, 2, 0, 0] = eye
                    module.time_conv.weight.copy_(w)
                    module.time_conv.bias.zero_()
            elif isinstance(module, blocks.attention):
                module.proj.weight.mul_(self.decoder_residual_damping)
                module.proj.bias.zero_()

        # After the output norm a signal channel is s·sqrt(width)/|x| ≈ s·sqrt(width)/(A·sqrt(
        # anchors)); scale it to `decoder_activation_std` for unit-variance s, drop the others.
        norm_scale = self.decoder_anchor_value * math.sqrt(anchors / width)
        gamma = torch.zeros_like(decoder.norm_out.gamma)
        gamma[:signal] = self.decoder_activation_std * norm_scale
        decoder.norm_out.gamma.copy_(gamma)

        mix = torch.randn(3, signal, generator=generator) * (self.decoder_gain / math.sqrt(signal))
        w_out = torch.zeros_like(decoder.conv_out.weight)
        w_out[:, :signal, 2, 1, 1] = mix / self.decoder_activation_std
        decoder.conv_out.weight.copy_(w_out)
        decoder.conv_out.bias.zero_()
        # Centre each RGB channel on mid-grey over N(0, 1) model-space latents.
        n, frames, h, w_ = centre_batch
        latents = torch.randn(n, z_dim, frames, h, w_, generator=generator)
        mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1)
        out = vae.decode(latents * std + mean, return_dict=False)[0]
        decoder.conv_out.bias.copy_(-out.mean(dim=(0, 2, 3, 4)))
