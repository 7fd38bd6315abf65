"""The tiny presets' ``AutoencoderKL``-style VAE, written once: its config and the decoder
shaping that makes pixel rewards learnable.

A randomly initialised decoder barely reacts to its latents, so a tiny model could never
learn a pixel reward (brightness, colour, JPEG size). :class:`TinyKLVAE` describes a toy
diffusers ``AutoencoderKL`` (equal widths at every level, one norm group) and turns its
decoder into a smooth, strongly responsive up-projection. SD3 and Z-Image use both halves;
FLUX.2 shapes the same diffusers ``Decoder`` inside its ``AutoencoderKLFlux2`` and re-centres
it for its batch-norm latent statistics.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from unirl.models.common.config_dict import ConfigDict


@dataclass(kw_only=True, frozen=True)
class TinyKLVAE:
    """Sizes of a tiny ``AutoencoderKL`` and its decoder shaping (see :meth:`shape_decoder`).

    The fields are named as in the families' tiny specs, so :meth:`from_spec` reads them from
    one; ``spec_name`` is that spec's class, named by the error a bad size raises."""

    spec_name: str
    latent_channels: int
    vae_channels: int
    vae_levels: int
    scaling_factor: float
    shift_factor: float
    latent_sample_size: int  # latent side of the centring batch (and of the config)
    decoder_anchor_channels: int
    decoder_anchor_value: float
    decoder_gain: float
    decoder_residual_damping: float

    @classmethod
    def from_spec(cls, spec: object, **overrides: Any) -> TinyKLVAE:
        """The fields of a family's tiny ``spec`` (same names), ``overrides`` replacing or
        supplying some (``latent_sample_size`` where the spec names it otherwise)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "spec_name"]
        values = {
            name: overrides.pop(name) if name in overrides else getattr(spec, name)
            for name in names
        }
        if overrides:
            raise TypeError(f"TinyKLVAE.from_spec: unknown fields {sorted(overrides)}")
        return cls(spec_name=type(spec).__name__, **values)

    def config(self) -> ConfigDict:
        """The ``AutoencoderKL`` config: ``vae_levels`` blocks of ``vae_channels`` each."""
        return {
            "in_channels": 3,
            "out_channels": 3,
            "down_block_types": ("DownEncoderBlock2D",) * self.vae_levels,
            "up_block_types": ("UpDecoderBlock2D",) * self.vae_levels,
            # equal widths: no conv shortcuts, so the decoder's residual path is an identity
            "block_out_channels": (self.vae_channels,) * self.vae_levels,
            "layers_per_block": 1,
            "latent_channels": self.latent_channels,
            # one group: GroupNorm normalises over all channels, which the anchor channels pin
            "norm_num_groups": 1,
            "sample_size": self.latent_sample_size * 2 ** (self.vae_levels - 1),
            "scaling_factor": self.scaling_factor,
            "shift_factor": self.shift_factor,
            "use_quant_conv": False,
            "use_post_quant_conv": False,
            "force_upcast": True,
        }

    @torch.no_grad()
    def shape_decoder(self, decoder: torch.nn.Module, generator: torch.Generator) -> None:
        """Turn a random diffusers ``Decoder`` into a smooth, strongly responsive one.

        Hidden channels split into *signal* and *anchor* channels. ``conv_in`` maps the latent
        to the signal channels by a random 1x1 projection and writes constant ±A into the
        anchor channels; the anchors dominate every (single-group) GroupNorm's statistics, so
        the normalisations act as fixed affine maps instead of erasing global shifts. Residual
        branches (resnets, mid attention) are damped, upsamplers blur (nearest x2 then a 3x3
        binomial), the last norm puts SiLU in its monotone near-linear range and ``conv_out``
        mixes signal channels into RGB centred on mid-grey over N(0, 1) model-space latents
        (un-normalised as ``z / scaling_factor + shift_factor``). The decoder is then close to
        a smooth linear up-projection: shifting a latent direction moves brightness and colour
        monotonically and different latents give visibly different images.
        """
        from diffusers.models.resnet import ResnetBlock2D
        from diffusers.models.upsampling import Upsample2D

        channels = self.vae_channels
        anchors = self.decoder_anchor_channels
        signal = channels - anchors
        if anchors < 2 or anchors % 2 or signal < 3:
            raise ValueError(
                f"{self.spec_name}: decoder_anchor_channels={anchors} must be even and >= 2, "
                f"leaving >= 3 of vae_channels={channels} for the signal"
            )
        latent = self.latent_channels

        w_in = torch.zeros_like(decoder.conv_in.weight)
        w_in[:signal, :, 1, 1] = torch.randn(signal, latent, generator=generator) / math.sqrt(
            latent
        )
        decoder.conv_in.weight.copy_(w_in)
        b_in = torch.zeros(channels)
        b_in[signal:] = self.decoder_anchor_value * torch.tensor([1.0, -1.0]).repeat(anchors // 2)
        decoder.conv_in.bias.copy_(b_in)

        blur = torch.tensor([1.0, 2.0, 1.0])
        blur = (blur[:, None] * blur[None, :]) / 16.0
        for module in decoder.modules():
            if isinstance(module, ResnetBlock2D):
                module.conv2.weight.mul_(self.decoder_residual_damping)
                module.conv2.bias.zero_()
            elif isinstance(module, Upsample2D):
                w_up = torch.zeros_like(module.conv.weight)
                for c in range(channels):
                    w_up[c, c] = blur
                module.conv.weight.copy_(w_up)
                module.conv.bias.zero_()
        for attn in decoder.mid_block.attentions:
            if attn is not None:
                attn.to_out[0].weight.mul_(self.decoder_residual_damping)
                attn.to_out[0].bias.zero_()

        # Global std after conv_in is ~A·sqrt(anchors/channels); undo it for the signal
        # channels, scale to ~0.6 and bias by +1 so SiLU works in its monotone, near-linear range.
        norm_scale = self.decoder_anchor_value * math.sqrt(anchors / channels)
        norm = decoder.conv_norm_out
        norm.weight.zero_()
        norm.weight[:signal] = 0.6 * norm_scale
        norm.bias.zero_()
        norm.bias[:signal] = 1.0

        mix = torch.randn(3, signal, generator=generator) * (self.decoder_gain / math.sqrt(signal))
        w_out = torch.zeros_like(decoder.conv_out.weight)
        w_out[:, :signal, 1, 1] = mix
        decoder.conv_out.weight.copy_(w_out)
        decoder.conv_out.bias.zero_()
        # Centre each RGB channel on mid-grey over N(0, 1) model-space latents (the damped
        # residual branches and SiLU's curvature leave a small offset otherwise).
        side = self.latent_sample_size
        z = torch.randn(32, latent, side, side, generator=generator)
        offset = decoder(z / self.scaling_factor + self.shift_factor).mean(dim=(0, 2, 3))
        decoder.conv_out.bias.copy_(-offset)
