"""``TransfusionModel``: one decoder-only transformer that writes text and denoises images.

A transfusion-style model (text tokens and continuous image-latent patches in one sequence,
one set of transformer weights): the causal LM (a transformers ``Qwen3ForCausalLM``) is the
backbone; :class:`ImageHead` adds what the image tokens need around it (patch in / out, the
noise-level embedding, 2D patch positions). Two calls, one module:

- text: ``model(input_ids=..., past_key_values=..., ...)`` is the causal LM's own forward
  (KV-cached sampling, packed replay), so the shared AR sampler and token policy
  (``unirl.models.common_ar``) run on it unchanged;
- image: ``model(image_latents=x[B, C, h, w], sigma=σ[B], context_ids=..., context_mask=...)``
  embeds the context tokens, appends the ``(h/p)·(w/p)`` latent patches and runs the same
  decoder layers with a mask in which text is causal among text, image tokens see every
  context token and every image token (bidirectional among themselves), and padding sees
  only itself; returns the velocity ``v[B, C, h, w]`` (fp32).

Both calls go through this module's ``forward`` (not through a submodule), so FSDP2's root
hooks and peft's injected layers apply to both.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import GenerationConfig, PretrainedConfig


def timestep_features(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features ``[B, dim]`` of ``1000·σ`` (fp32)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10_000.0) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half
    )
    angles = sigma.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class ImageHead(nn.Module):
    """The image side of the shared transformer: patchify + linear in, noise-level MLP, learned
    row / column embeddings of the patch grid, and norm + linear out to the patch velocity."""

    def __init__(
        self,
        *,
        latent_channels: int,
        patch_size: int,
        hidden_size: int,
        max_grid: int,
        time_dim: int = 64,
    ) -> None:
        super().__init__()
        self.latent_channels = latent_channels
        self.patch_size = patch_size
        self.time_dim = time_dim
        patch_dim = latent_channels * patch_size * patch_size
        self.patch_in = nn.Linear(patch_dim, hidden_size)
        self.time_in = nn.Sequential(
            nn.Linear(time_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        self.row_embed = nn.Parameter(torch.randn(max_grid, hidden_size) * 0.02)
        self.col_embed = nn.Parameter(torch.randn(max_grid, hidden_size) * 0.02)
        self.norm_out = nn.LayerNorm(hidden_size)
        self.patch_out = nn.Linear(hidden_size, patch_dim)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        p = self.patch_size
        return height // p, width // p

    def embed(self, latents: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """``tokens[B, P, D]`` of ``latents[B, C, h, w]`` at ``sigma[B]`` (row-major patches)."""
        b, c, h, w = latents.shape
        p = self.patch_size
        gh, gw = self.grid(h, w)
        patches = latents.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
        patches = patches.reshape(b, gh * gw, c * p * p)
        tokens = self.patch_in(patches.to(self.patch_in.weight.dtype))
        time = self.time_in(timestep_features(sigma, self.time_dim).to(tokens.dtype))
        position = (self.row_embed[:gh, None, :] + self.col_embed[None, :gw, :]).reshape(
            gh * gw, -1
        )
        return tokens + time[:, None, :] + position[None].to(tokens.dtype)

    def unembed(self, hidden: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """``v[B, C, h, w]`` (fp32) from the image tokens' last hidden states ``[B, P, D]``."""
        b, c, h, w = shape
        p = self.patch_size
        gh, gw = self.grid(h, w)
        out = self.patch_out(self.norm_out(hidden)).float()
        out = out.reshape(b, gh, gw, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, c, h, w)


def image_attention_mask(context_mask: torch.Tensor, num_image: int) -> torch.Tensor:
    """``allowed[B, 1, L+P, L+P]`` (bool, True = may attend) for ``context_mask[B, L]`` (1 on
    real tokens, left padding 0) followed by ``num_image`` image tokens: text causal over real
    text, image tokens over all real text and all image tokens, every row its own diagonal
    (a padding row attends only itself, so no row is empty)."""
    b, length = context_mask.shape
    total = length + num_image
    device = context_mask.device
    real = torch.cat(
        [context_mask.bool(), torch.ones(b, num_image, dtype=torch.bool, device=device)], dim=1
    )
    idx = torch.arange(total, device=device)
    causal = idx[None, :] <= idx[:, None]  # [query, key]
    image_query = (idx >= length)[:, None]
    allowed = (causal | image_query)[None] & real[:, None, :] & real[:, :, None]
    allowed = allowed | torch.eye(total, dtype=torch.bool, device=device)[None]
    return allowed[:, None]


def _cache_keyword(module: nn.Module) -> str:
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class TransfusionModel(nn.Module):
    """The causal LM ``lm`` and its :class:`ImageHead` ``image``: one trainable module."""

    causal_lm_attr = "lm"  # where the AR decode engine finds the causal LM it samples

    def __init__(self, lm: nn.Module, image: ImageHead) -> None:
        super().__init__()
        self.lm: Any = lm
        self.image = image
        self._lm_cache_keyword = _cache_keyword(lm)

    @property
    def config(self) -> PretrainedConfig:
        return self.lm.config

    @property
    def generation_config(self) -> GenerationConfig | None:
        return getattr(self.lm, "generation_config", None)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.lm.gradient_checkpointing_enable(**kwargs)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        *,
        image_latents: torch.Tensor | None = None,
        sigma: torch.Tensor | None = None,
        context_ids: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        if image_latents is None:  # the causal LM's own call (sampling with a cache, replay)
            if "past_key_values" in kwargs and self._lm_cache_keyword != "past_key_values":
                kwargs[self._lm_cache_keyword] = kwargs.pop("past_key_values")
            return self.lm(input_ids=input_ids, **kwargs)
        if sigma is None or context_ids is None or context_mask is None:
            raise ValueError("the image call needs sigma, context_ids and context_mask")
        return self.velocity(image_latents, sigma, context_ids, context_mask)

    def velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        context_ids: torch.Tensor,
        context_mask: torch.Tensor,
    ) -> torch.Tensor:
        """``v[B, C, h, w]`` (fp32) of ``latents`` at ``sigma[B]`` given the left-padded
        context tokens ``context_ids[B, L]`` (``context_mask`` 1 on real tokens)."""
        backbone: Any = self.lm.model  # embeddings, decoder layers, final norm (no LM head)
        text = backbone.embed_tokens(context_ids)
        image = self.image.embed(latents, sigma).to(text.dtype)
        sequence = torch.cat([text, image], dim=1)
        num_image = image.shape[1]
        text_pos = (context_mask.long().cumsum(-1) - 1).clamp_min(0)
        after = context_mask.long().sum(-1, keepdim=True)
        image_pos = after + torch.arange(num_image, device=after.device)[None]
        positions = torch.cat([text_pos, image_pos], dim=1)
        mask = image_attention_mask(context_mask, num_image)
        hidden = backbone(
            inputs_embeds=sequence, attention_mask=mask, position_ids=positions, use_cache=False
        ).last_hidden_state
        return self.image.unembed(hidden[:, -num_image:], tuple(latents.shape))
