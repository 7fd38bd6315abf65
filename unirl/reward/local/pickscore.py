"""PickScore (Kirstain et al., 2023): a CLIP-H/14 fine-tuned on Pick-a-Pic human preferences."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from unirl.reward.local.clip_score import CLIPSimilarityScorer


@dataclass(kw_only=True)
class PickScore(CLIPSimilarityScorer):
    """PickScore: ``s = exp(logit_scale) · cos(E_img(x), E_txt(p))``, as in the reference
    usage of ``yuvalkirstain/PickScore_v1`` (``exp(logit_scale)`` is about 100 there, so
    typical scores are ~18-24).

    ``model``: the fine-tuned ``CLIPModel`` (folder or hub id); ``processor``: the folder or
    hub id of its processor, ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` (tokenizer,
    ``preprocessor_config.json``: shortest side 224, centre crop, OpenAI mean/std). Prompts
    are truncated at 77 tokens. Returns ``score[N]``.
    """

    model: str = "yuvalkirstain/PickScore_v1"
    processor: str | None = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
    name: str = "pickscore"

    def _scale(self, cosine: Tensor) -> Tensor:
        return self.logit_scale().to(cosine.device) * cosine
