"""SD3's joint attention with each attention's q / k / v projections fused into one matmul.

Same math as diffusers' ``JointAttnProcessor2_0`` (the MMDiT joint attention, and the
image-only second attention of SD3.5's MMDiT-X blocks); the projections of the image stream
and of the text stream each run as one ``fused_projections`` call, with any LoRA ``A`` riding
in the same matmul. ``SD3Bundle(fuse_projections=True)`` installs it on every attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from unirl.models.common.fused_linear import fused_projections


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, N, H·d] -> [B, H, N, d]``."""
    return t.unflatten(-1, (heads, -1)).transpose(1, 2)


def _normed(norm: nn.Module | None, t: torch.Tensor) -> torch.Tensor:
    return t if norm is None else norm(t)


class FusedJointAttnProcessor:
    """Joint (image + text) or image-only attention of an SD3 ``Attention`` module.

    Returns ``(image_out, text_out)`` with text, ``image_out`` without, like the processor it
    replaces. ``text_out`` is left unprojected in a block's last (``context_pre_only``)
    attention, whose text output nothing reads.
    """

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if attention_mask is not None:
            raise ValueError(
                "FusedJointAttnProcessor: SD3 joint attention takes no attention_mask; "
                "set bundle.fuse_projections=false to use diffusers' processor"
            )
        heads = attn.heads
        n_image = hidden_states.shape[1]
        q, k, v = (
            _heads(t, heads)
            for t in fused_projections(hidden_states, (attn.to_q, attn.to_k, attn.to_v))
        )
        q, k = _normed(attn.norm_q, q), _normed(attn.norm_k, k)
        if encoder_hidden_states is not None:
            text = (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
            tq, tk, tv = (_heads(t, heads) for t in fused_projections(encoder_hidden_states, text))
            tq, tk = _normed(attn.norm_added_q, tq), _normed(attn.norm_added_k, tk)
            q, k, v = (torch.cat(pair, dim=2) for pair in ((q, tq), (k, tk), (v, tv)))

        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).to(q.dtype)  # [B, N, H, d]
        if encoder_hidden_states is None:
            return attn.to_out[1](attn.to_out[0](out.flatten(2)))
        # Split the heads-last view first and gather each stream into its own contiguous
        # [B, n, H·d] buffer (the copy the transpose needs anyway). Slicing the flattened joint
        # output instead leaves the image rows strided per batch row, which Inductor lowers
        # to a batched matmul over B slices; here `to_out` is one [B·n, H·d] matmul (on an
        # H100 the two ran equally fast, see docs/performance.md).
        image = out[:, :n_image].reshape(out.shape[0], n_image, -1)
        text_out = out[:, n_image:].reshape(out.shape[0], out.shape[1] - n_image, -1)
        if not attn.context_pre_only:
            text_out = attn.to_add_out(text_out)
        return attn.to_out[1](attn.to_out[0](image)), text_out


def install_fused_attention(transformer: nn.Module) -> None:
    """Give every attention module of an SD3 transformer the fused processor."""
    from diffusers.models.attention_processor import Attention

    attentions = [m for m in transformer.modules() if isinstance(m, Attention)]
    for module in attentions:
        module.set_processor(FusedJointAttnProcessor())
    if not attentions:
        raise ValueError(
            f"{type(transformer).__name__} has no diffusers Attention modules to fuse; "
            "set bundle.fuse_projections=false"
        )
