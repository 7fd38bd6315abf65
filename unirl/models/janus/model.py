"""``JanusPolicy``: transformers' ``JanusForConditionalGeneration`` behind one ``forward`` with
three calls, so FSDP2's root hooks and peft's injected layers act on all of them:

- text: ``policy(input_ids=..., attention_mask=..., position_ids=..., cache=..., ...)`` is
  Janus's own forward (the LM head over the shared LLaMA decoder; ``pixel_values`` for an
  understanding prompt through SigLIP and the aligner), so the shared AR sampler and token
  policy (``unirl.models.common_ar``) run on it unchanged;
- image tokens: ``policy(input_ids=ctx[R, L] | None, image_tokens=tok[R, K] | None,
  image_head=True, ...)`` embeds the context tokens with the text embedding and the image
  tokens with the generation embedding + aligner (what transformers' ``generate`` in image
  mode feeds back), runs the same decoder and returns the generation head's logits over the
  VQ codebook at the last ``logits_to_keep`` positions (``logits[R, k, codebook]``);
- decode: ``policy(decode_tokens=tok[B, N])`` is the VQ model's decode
  (``pixels[B, 3, H, W]`` in [-1, 1], the VQ model's own output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class ImageLogits:
    """The image call's output: ``logits[R, k, codebook]`` and the KV cache."""

    logits: torch.Tensor
    cache: Any = None


class JanusPolicy(nn.Module):
    """One module around a ``JanusForConditionalGeneration`` (``self.janus``); see the module
    docstring. ``causal_lm_attr`` tells the decode engine where the causal LM is."""

    causal_lm_attr = "janus"

    def __init__(self, janus: nn.Module) -> None:
        super().__init__()
        self.janus = janus

    @property
    def config(self) -> Any:
        return self.janus.config

    @property
    def generation_config(self) -> Any:
        return self.janus.generation_config

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.janus.gradient_checkpointing_enable(**kwargs)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        *,
        image_tokens: torch.Tensor | None = None,
        image_head: bool = False,
        decode_tokens: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        if decode_tokens is not None:
            return self.janus.model.vqmodel.decode(decode_tokens)
        if not image_head:
            return self.janus(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )
        parts = []
        if input_ids is not None:
            parts.append(self.janus.get_input_embeddings()(input_ids))
        if image_tokens is not None:
            parts.append(self.janus.prepare_embeddings_for_image_generation(image_tokens))
        embeds = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        out = self.janus.model.language_model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:] if logits_to_keep > 0 else hidden
        else:
            hidden = hidden[:, logits_to_keep]
        return ImageLogits(logits=self.janus.model.generation_head(hidden), cache=out.cache)
