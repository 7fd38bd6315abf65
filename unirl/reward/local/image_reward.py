"""ImageReward (Xu et al., 2023): BLIP image-grounded text encoder + a linear MLP head,
standardised with the released mean / std. Runs on transformers' BLIP classes.

The released ``ImageReward.pt`` is a BLIP (``BLIP_Pretrain``) state dict; convert it once::

    python -m unirl.reward.local.image_reward --checkpoint ImageReward.pt \\
        --tokenizer /models/bert-base-uncased --out /models/image_reward_hf
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from unirl.config import require
from unirl.reward.local._hf import (
    ImagePreprocess,
    PretrainedScorer,
    RewardWeightsNotFound,
    load_pretrained,
    load_reward_mlp,
    load_state_dict_file,
    pretrained_file,
)

if TYPE_CHECKING:
    from transformers import BlipConfig

IMAGE_REWARD_MEAN = 0.16717362830052426
IMAGE_REWARD_STD = 1.0333394966054072
HEAD_FILENAME = "image_reward_head.safetensors"


def image_reward_blip_config() -> BlipConfig:
    """The transformers ``BlipConfig`` of ImageReward-v1.0: BLIP ViT-L/16 at 224 px (24 layers,
    width 1024, 16 heads, LayerNorm eps 1e-6) and BLIP's BERT-base ``med`` text encoder
    (12 layers, width 768, vocab 30524 = bert-base-uncased + ``[DEC]`` + ``[ENC]``, cross
    attention to the image tokens in every layer)."""
    from transformers import BlipConfig

    return BlipConfig(
        vision_config={
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "image_size": 224,
            "patch_size": 16,
            "layer_norm_eps": 1e-6,
            "hidden_act": "gelu",
        },
        text_config={
            "vocab_size": 30524,
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "max_position_embeddings": 512,
            "layer_norm_eps": 1e-12,
            "hidden_act": "gelu",
            "pad_token_id": 0,
            "bos_token_id": 30522,
            "sep_token_id": 102,
        },
        image_text_hidden_size=256,
    )


_VISION_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_VISION_TOP = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}
_VISION_BLOCK_PARTS = {
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "attn.qkv": "self_attn.qkv",
    "attn.proj": "self_attn.projection",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}


def convert_image_reward_state_dict(
    state_dict: Mapping[str, Tensor],
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``ImageReward.pt`` -> ``(BlipForImageTextRetrieval state dict, reward head state dict)``.

    ``blip.visual_encoder.*`` (BLIP's timm-style ViT) -> ``vision_model.*`` (``blocks.i`` ->
    ``encoder.layers.i``, ``norm1/2`` -> ``layer_norm1/2``, ``attn.proj`` ->
    ``self_attn.projection``, ``cls_token`` / ``pos_embed`` / ``patch_embed.proj`` ->
    embeddings, ``norm`` -> ``post_layernorm``); ``blip.text_encoder.*`` -> ``text_encoder.*``
    unchanged (transformers' BLIP text model keeps BLIP's ``med`` names; the ``position_ids``
    buffer is dropped); ``blip.{vision,text,itm}_proj|head`` kept; ``mlp.layers.*`` -> head.
    Any other key raises ``ValueError``.
    """
    if isinstance(state_dict.get("state_dict"), Mapping):
        state_dict = cast(Mapping[str, Tensor], state_dict["state_dict"])
    blip: dict[str, Tensor] = {}
    head: dict[str, Tensor] = {}
    unknown: list[str] = []
    for raw_key, value in state_dict.items():
        key = raw_key.removeprefix("module.")
        if key.startswith("mlp."):
            head[key.removeprefix("mlp.")] = value
        elif key.startswith("blip.visual_encoder."):
            name = key.removeprefix("blip.visual_encoder.")
            match = _VISION_BLOCK.match(name)
            if name in _VISION_TOP:
                blip["vision_model." + _VISION_TOP[name]] = value
            elif match and match.group(2).rsplit(".", 1)[0] in _VISION_BLOCK_PARTS:
                part, kind = match.group(2).rsplit(".", 1)
                layer = f"vision_model.encoder.layers.{match.group(1)}."
                blip[f"{layer}{_VISION_BLOCK_PARTS[part]}.{kind}"] = value
            else:
                unknown.append(raw_key)
        elif key.startswith("blip.text_encoder."):
            name = key.removeprefix("blip.text_encoder.")
            if name != "embeddings.position_ids":
                blip["text_encoder." + name] = value
        elif key.split(".")[:2] in (["blip", "vision_proj"], ["blip", "text_proj"]) or (
            key.startswith("blip.itm_head.")
        ):
            blip[key.removeprefix("blip.")] = value
        else:
            unknown.append(raw_key)
    if unknown:
        raise ValueError(
            f"convert_image_reward_state_dict: {len(unknown)} keys are not part of ImageReward "
            f"(BLIP ViT + text encoder + mlp head): {sorted(unknown)[:10]}"
        )
    return blip, head


def convert_image_reward_checkpoint(
    checkpoint: str, *, tokenizer: str, out_dir: str, config: str | None = None
) -> str:
    """Convert ``ImageReward.pt`` into a folder :class:`ImageReward` loads: a
    ``BlipForImageTextRetrieval`` save (``config.json``, weights), the BERT tokenizer with
    BLIP's ``[DEC]`` (bos) and ``[ENC]`` tokens added, and ``image_reward_head.safetensors``.

    ``tokenizer``: folder or hub id of ``bert-base-uncased``. ``config``: folder or hub id of
    a ``BlipConfig``; default :func:`image_reward_blip_config`. Only ``itm_head`` (unused by
    ImageReward) may be missing from the checkpoint; it keeps its initialisation.
    """
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BlipConfig, BlipForImageTextRetrieval, BlipTextConfig

    owner = "convert_image_reward_checkpoint"
    state = load_state_dict_file(checkpoint, owner=owner, field_name="checkpoint")
    blip_state, head_state = convert_image_reward_state_dict(state)
    blip_config = (
        load_pretrained(BlipConfig.from_pretrained, config, owner=owner, field_name="config")
        if config
        else image_reward_blip_config()
    )
    tok = load_pretrained(
        AutoTokenizer.from_pretrained, tokenizer, owner=owner, field_name="tokenizer"
    )
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    # transformers types a sub-config as dict | PreTrainedConfig | None; BlipConfig builds it
    text_config = blip_config.text_config
    assert isinstance(text_config, BlipTextConfig)
    vocab = int(text_config.vocab_size)
    require(
        len(tok) == vocab,
        f"{owner}: tokenizer={tokenizer!r} has {len(tok)} tokens after adding [DEC] and [ENC]; "
        f"the text encoder expects {vocab} (use bert-base-uncased)",
    )
    model = BlipForImageTextRetrieval(blip_config)
    missing, unexpected = model.load_state_dict(blip_state, strict=False)
    bad_missing = [k for k in missing if not k.startswith("itm_head.")]
    if bad_missing or unexpected:
        raise ValueError(
            f"{owner}: checkpoint does not match the BLIP config: missing {bad_missing[:10]}, "
            f"unexpected {list(unexpected)[:10]}"
        )
    load_reward_mlp(head_state, text_config.hidden_size, owner=owner, where="the mlp.* keys")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    save_file({k: v.contiguous() for k, v in head_state.items()}, f"{out_dir}/{HEAD_FILENAME}")
    return out_dir


@dataclass(kw_only=True)
class ImageReward(PretrainedScorer):
    """ImageReward: ``s = (MLP(h_cls) - 0.16717362830052426) / 1.0333394966054072``.

    ``h_cls`` = the ``[CLS]`` state of BLIP's text encoder run on the prompt (``[CLS] p
    [SEP]``, padded to ``max_length=35``, truncated) with cross attention to all ViT tokens
    of the image; ``MLP`` = :class:`RewardMLP` (768 -> 1024 -> 128 -> 64 -> 16 -> 1, fp32).
    Images: shortest side to the ViT size (224) bicubic, centre crop, OpenAI CLIP mean/std.

    ``model``: a folder (or hub repo) holding a ``BlipForImageTextRetrieval`` save, its BERT
    tokenizer and ``image_reward_head.safetensors`` -- what
    :func:`convert_image_reward_checkpoint` writes from the released ``ImageReward.pt``.
    Returns ``score[N]`` (about N(0, 1) over the ImageReward training prompts).
    """

    model: str
    name: str = "image_reward"
    max_length: int = 35
    reward_mean: float = IMAGE_REWARD_MEAN  # subtracted from the raw score (released model's mean)
    reward_std: float = IMAGE_REWARD_STD  # divides the centred score (released model's std)
    _blip: Any = field(init=False, repr=False, default=None)
    _tokenizer: Any = field(init=False, repr=False, default=None)
    _head: Any = field(init=False, repr=False, default=None)
    _preprocess: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            bool(self.model) and not str(self.model).endswith((".pt", ".pth")),
            f"ImageReward.model={self.model!r}: give the converted folder; convert ImageReward.pt "
            "with `python -m unirl.reward.local.image_reward --checkpoint ImageReward.pt "
            "--tokenizer <bert-base-uncased> --out <folder>`",
        )
        require(self.max_length >= 2, "ImageReward.max_length must be >= 2 tokens")
        require(self.reward_std > 0, "ImageReward.reward_std must be positive")

    def _load(self) -> None:
        from transformers import (
            AutoTokenizer,
            BlipForImageTextRetrieval,
            BlipTextConfig,
        )

        owner = type(self).__name__
        blip = load_pretrained(
            BlipForImageTextRetrieval.from_pretrained,
            self.model,
            owner=owner,
            field_name="model",
            dtype=self.torch_dtype,
        )
        tokenizer = load_pretrained(
            AutoTokenizer.from_pretrained, self.model, owner=owner, field_name="model"
        )
        head_path = pretrained_file(self.model, HEAD_FILENAME, owner=owner, field_name="model")
        if head_path is None:
            raise RewardWeightsNotFound(
                f"{owner}: model={self.model!r} has no {HEAD_FILENAME}; write the folder with "
                "convert_image_reward_checkpoint (python -m unirl.reward.local.image_reward)"
            )
        state = load_state_dict_file(head_path, owner=owner, field_name="model")
        # transformers types a sub-config as dict | PreTrainedConfig | None; BlipConfig builds
        # them (the vision one's image_size is typed int | pair, BLIP's is an int)
        text_config = blip.config.text_config
        assert isinstance(text_config, BlipTextConfig)
        vision_config: Any = blip.config.vision_config
        head = load_reward_mlp(state, int(text_config.hidden_size), owner=owner, where=head_path)
        size = int(vision_config.image_size)
        self._preprocess = ImagePreprocess(crop_size=size, resize_size=size)
        self._blip = blip.to(self.torch_device)  # type: ignore[arg-type]  # transformers' _Wrapped.to
        self._tokenizer = tokenizer
        self._head = head.to(self.torch_device)

    def _modules(self) -> list[nn.Module]:
        return [m for m in (self._blip, self._head) if m is not None]

    def _score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        blip = self._blip
        pixels = self._preprocess(images).to(dtype=blip.dtype)
        image_embeds = blip.vision_model(pixel_values=pixels).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=pixels.device)
        tokens = self._tokenizer(
            prompts,
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        hidden = blip.text_encoder(
            input_ids=tokens["input_ids"].to(pixels.device),
            attention_mask=tokens["attention_mask"].to(pixels.device),
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=image_atts,
        ).last_hidden_state
        raw = self._head(hidden[:, 0, :].to(torch.float32))
        return (raw - self.reward_mean) / self.reward_std


def main(argv: list[str] | None = None) -> None:
    """CLI: convert the released ImageReward.pt into a folder for ``ImageReward(model=...)``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--checkpoint", required=True, help="ImageReward.pt")
    parser.add_argument("--tokenizer", required=True, help="folder or hub id of bert-base-uncased")
    parser.add_argument("--out", required=True, help="output folder (ImageReward.model)")
    parser.add_argument("--config", default=None, help="BlipConfig folder (default: v1.0)")
    args = parser.parse_args(argv)
    print(
        convert_image_reward_checkpoint(
            args.checkpoint, tokenizer=args.tokenizer, out_dir=args.out, config=args.config
        )
    )


if __name__ == "__main__":
    main()
