"""HPS v2 / v2.1 (Wu et al., 2023): an open_clip ViT-H-14 fine-tuned on human preference
pairs, run here as a transformers ``CLIPModel`` after a one-off state-dict conversion.

Convert the released open_clip checkpoint once (needs the HF folder or hub id of the base
``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` for its config, tokenizer and preprocessor)::

    python -m unirl.reward.local.hps --checkpoint HPS_v2_compressed.pt \\
        --base /models/CLIP-ViT-H-14-laion2B-s32B-b79K --out /models/hps_v2_hf
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from torch import Tensor

from unirl.config import require
from unirl.reward.local._hf import (
    RewardWeightsNotFound,
    load_pretrained,
    load_state_dict_file,
    pretrained_file,
)
from unirl.reward.local.clip_score import CLIPSimilarityScorer

_TOP_LEVEL = {
    "logit_scale": "logit_scale",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "text_projection.weight": "text_projection.weight",  # newer open_clip: nn.Linear, no bias
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
}
_TRANSPOSED = {  # open_clip keeps these as [width, embed_dim] Parameters used as x @ P
    "text_projection": "text_projection.weight",
    "visual.proj": "visual_projection.weight",
}
_BLOCK = {
    "ln_1.weight": "layer_norm1.weight",
    "ln_1.bias": "layer_norm1.bias",
    "ln_2.weight": "layer_norm2.weight",
    "ln_2.bias": "layer_norm2.bias",
    "attn.out_proj.weight": "self_attn.out_proj.weight",
    "attn.out_proj.bias": "self_attn.out_proj.bias",
    "mlp.c_fc.weight": "mlp.fc1.weight",
    "mlp.c_fc.bias": "mlp.fc1.bias",
    "mlp.c_proj.weight": "mlp.fc2.weight",
    "mlp.c_proj.bias": "mlp.fc2.bias",
}
_BLOCK_KEY = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.(.+)$")
_DROPPED = {"attn_mask", "visual.attn_mask"}  # buffers open_clip rebuilds; HF builds its own


def convert_open_clip_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An open_clip ``CLIP`` state dict (ViT visual tower + text transformer, e.g. ViT-H-14,
    ViT-L-14, ViT-B-32) -> transformers ``CLIPModel`` keys.

    Renames ``ln_1/ln_2/mlp.c_fc/mlp.c_proj/attn.out_proj`` per block, splits the fused
    ``attn.in_proj_weight[3W, W]`` / ``in_proj_bias[3W]`` into ``q/k/v_proj`` (in that order),
    transposes ``text_projection`` and ``visual.proj`` (``[W, D]`` -> ``Linear.weight[D, W]``),
    and drops the ``attn_mask`` buffer. A ``"state_dict"`` wrapper and ``module.`` prefixes
    are removed. Keys of features HF CLIP lacks (layer scale ``ls_1/ls_2``, attention
    pooling, projection biases, ...) raise ``ValueError`` listing them.
    """
    if isinstance(state_dict.get("state_dict"), Mapping):
        state_dict = cast(Mapping[str, Tensor], state_dict["state_dict"])
    converted: dict[str, Tensor] = {}
    unknown: list[str] = []
    for raw_key, value in state_dict.items():
        key = raw_key.removeprefix("module.")
        if key in _DROPPED:
            continue
        if key in _TOP_LEVEL:
            converted[_TOP_LEVEL[key]] = value
            continue
        if key in _TRANSPOSED:
            converted[_TRANSPOSED[key]] = value.t().contiguous()
            continue
        match = _BLOCK_KEY.match(key)
        if match is None:
            unknown.append(raw_key)
            continue
        tower = "vision_model" if match.group(1) else "text_model"
        prefix = f"{tower}.encoder.layers.{match.group(2)}."
        name = match.group(3)
        if name in ("attn.in_proj_weight", "attn.in_proj_bias"):
            kind = "weight" if name.endswith("weight") else "bias"
            width = value.shape[0] // 3
            require(value.shape[0] == 3 * width, f"{raw_key}: fused qkv of {value.shape[0]} rows")
            for part, chunk in zip(("q", "k", "v"), value.split(width, dim=0)):
                converted[f"{prefix}self_attn.{part}_proj.{kind}"] = chunk.contiguous()
        elif name in _BLOCK:
            converted[prefix + _BLOCK[name]] = value
        else:
            unknown.append(raw_key)
    if unknown:
        raise ValueError(
            f"convert_open_clip_state_dict: {len(unknown)} open_clip keys have no transformers "
            f"CLIPModel counterpart (unsupported architecture?): {sorted(unknown)[:10]}"
        )
    return converted


def convert_open_clip_checkpoint(checkpoint: str, *, base: str, out_dir: str) -> str:
    """Convert an open_clip ``.pt`` (HPS v2 / v2.1) into a ``CLIPModel`` folder at ``out_dir``.

    ``base``: folder or hub id of the transformers version of the architecture the checkpoint
    fine-tunes (``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` for HPS); its ``config.json``,
    tokenizer and ``preprocessor_config.json`` are copied. Loading is strict, so a wrong base
    fails on the first mismatched key or shape. Returns ``out_dir``.
    """
    from transformers import AutoTokenizer, CLIPConfig, CLIPModel

    owner = "convert_open_clip_checkpoint"
    state = load_state_dict_file(checkpoint, owner=owner, field_name="checkpoint")
    converted = convert_open_clip_state_dict(state)
    config = load_pretrained(CLIPConfig.from_pretrained, base, owner=owner, field_name="base")
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, base, owner=owner, field_name="base")
    processor_file = pretrained_file(
        base, "preprocessor_config.json", owner=owner, field_name="base"
    )
    if processor_file is None:
        raise RewardWeightsNotFound(f"{owner}: base={base!r} has no preprocessor_config.json")
    model = CLIPModel(config)
    try:
        model.load_state_dict(converted, strict=True)
    except RuntimeError as exc:
        raise ValueError(
            f"{owner}: checkpoint={checkpoint!r} does not match the architecture of base={base!r} "
            f"(wrong base model?): {exc}"
        ) from exc
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    shutil.copyfile(processor_file, os.path.join(out_dir, "preprocessor_config.json"))
    return out_dir


@dataclass(kw_only=True)
class HPSv2(CLIPSimilarityScorer):
    """Human Preference Score v2 / v2.1: ``s = scale · cos(E_img(x), E_txt(p))``, with
    ``scale = 1`` by default, exactly the reference ``hpsv2`` score (the diagonal of
    ``image_features @ text_features.T`` of normalised features, ~0.25-0.30 for real
    images). The paper's tables report ``100 · cos``: set ``scale=100`` for that unit.

    ``model``: a local ``CLIPModel`` folder converted from ``HPS_v2_compressed.pt`` /
    ``HPS_v2.1_compressed.pt`` by :func:`convert_open_clip_checkpoint` (a ``.pt`` path is
    rejected with that instruction). Preprocessing follows HPS's ``preprocess_val``:
    ``longest_pad`` (resize the longer side to 224, pad with black), OpenAI mean/std.
    Returns ``score[N]``.
    """

    name: str = "hps"
    resize: str = "longest_pad"
    scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            not str(self.model).endswith((".pt", ".pth", ".bin")),
            f"HPSv2.model={self.model!r} is an open_clip checkpoint; convert it once with "
            "`python -m unirl.reward.local.hps --checkpoint <file.pt> --base "
            "<laion/CLIP-ViT-H-14-laion2B-s32B-b79K folder> --out <folder>` and set "
            "model=<folder>",
        )
        require(self.scale > 0, f"HPSv2.scale={self.scale!r}: use a positive number")

    def _scale(self, cosine: Tensor) -> Tensor:
        return self.scale * cosine


def main(argv: list[str] | None = None) -> None:
    """CLI: convert an open_clip HPS checkpoint into a transformers ``CLIPModel`` folder."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--checkpoint", required=True, help="HPS_v2_compressed.pt (open_clip)")
    parser.add_argument(
        "--base", required=True, help="folder or hub id of laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
    )
    parser.add_argument("--out", required=True, help="output folder (HPSv2.model)")
    args = parser.parse_args(argv)
    print(convert_open_clip_checkpoint(args.checkpoint, base=args.base, out_dir=args.out))


if __name__ == "__main__":
    main()
