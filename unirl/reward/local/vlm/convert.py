"""One-off conversion of a released VLM reward checkpoint into the folder the rewards load.

HPSv3, VideoReward and EditReward are released as one state dict (backbone + reward head,
the backbone in transformers' pre-4.52 key layout) to be loaded onto their base model with
the reward tokens added. This writes a ``save_pretrained`` folder of the backbone, the
tokenizer (with the tokens) and the image processor of ``--base``, plus the head as
``reward_head.safetensors``::

    python -m unirl.reward.local.vlm.convert --kind hpsv3 --checkpoint HPSv3.safetensors \\
        --base Qwen/Qwen2-VL-7B-Instruct --out /models/hpsv3

No network is needed when ``--base`` is a local folder (or cached with ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import torch

from unirl.reward.base import RewardError
from unirl.reward.local._hf import load_pretrained, load_state_dict_file
from unirl.reward.local.vlm.engine import HEAD_FILE
from unirl.reward.local.vlm.templates import HPSV3_REWARD_TOKEN, VIDEOALIGN_TOKENS

TOKENS = {
    "hpsv3": (HPSV3_REWARD_TOKEN,),
    "videoalign": VIDEOALIGN_TOKENS,
    "editreward": (HPSV3_REWARD_TOKEN,),
}
HEAD_PREFIXES = ("rm_head.", "rm_heads.")
WRAPPERS = ("module.", "base_model.model.")


def _unwrap(key: str) -> str:
    for prefix in WRAPPERS:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def backbone_key(key: str, known: set[str]) -> str:
    """``key`` in the layout of ``known`` (the model's own keys): checkpoints written before
    transformers 4.52 name the vision tower ``visual.*`` and the language model ``model.*``,
    which are now ``model.visual.*`` and ``model.language_model.*``."""
    if key in known:
        return key
    if key.startswith("visual."):
        return "model." + key
    if key.startswith("model.") and not key.startswith(("model.language_model.", "model.visual.")):
        return "model.language_model." + key[len("model.") :]
    return key


def split_checkpoint(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """``(backbone, head)`` state dicts; head keys keep their ``rm_head.`` / ``rm_heads.``
    prefix (the names the rewards load)."""
    if isinstance(state.get("model"), dict):  # EditReward's {"model": state_dict}
        state = state["model"]  # type: ignore[assignment]
    backbone: dict[str, torch.Tensor] = {}
    head: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        key = _unwrap(key)
        (head if key.startswith(HEAD_PREFIXES) else backbone)[key] = value
    return backbone, head


def convert(kind: str, checkpoint: str, base: str, out: str, dtype: str = "bf16") -> str:
    """Write the folder ``out`` for reward ``kind`` from ``checkpoint`` on ``base``."""
    from safetensors.torch import save_file
    from transformers import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
        AutoConfig,
        AutoImageProcessor,
        AutoTokenizer,
    )

    if kind not in TOKENS:
        raise RewardError(f"convert: --kind {kind!r}: use one of {', '.join(TOKENS)}")
    owner = "convert"
    config = load_pretrained(AutoConfig.from_pretrained, base, owner=owner, field_name="base")
    model_cls: Any = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING.get(type(config), None)
    if model_cls is None:
        raise RewardError(f"convert: --base {base!r} is not a Qwen2-VL / Qwen2.5-VL model")
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    model = load_pretrained(
        model_cls.from_pretrained, base, owner=owner, field_name="base", dtype=torch_dtype
    )
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, base, owner=owner, field_name="base")
    processor = load_pretrained(
        AutoImageProcessor.from_pretrained, base, owner=owner, field_name="base"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(TOKENS[kind])})
    model.resize_token_embeddings(len(tokenizer))
    backbone, head = split_checkpoint(
        load_state_dict_file(checkpoint, owner=owner, field_name="checkpoint")
    )
    if not head:
        raise RewardError(f"convert: {checkpoint} holds no rm_head.* / rm_heads.* keys")
    known = set(model.state_dict())
    renamed = {backbone_key(k, known): v for k, v in backbone.items()}
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    unexpected = sorted(set(renamed) - known)
    missing = sorted(known - set(renamed) - tied)
    if unexpected or missing:
        raise RewardError(
            f"convert: {checkpoint} does not fit {type(model).__name__} of {base!r}: "
            f"{len(unexpected)} unexpected key(s) {unexpected[:3]}, {len(missing)} missing "
            f"{missing[:3]}"
        )
    model.load_state_dict(renamed, strict=not tied)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)
    save_file({k: v.float().contiguous() for k, v in head.items()}, os.path.join(out, HEAD_FILE))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", required=True, choices=sorted(TOKENS))
    parser.add_argument("--checkpoint", required=True, help="the released .safetensors / .pt")
    parser.add_argument("--base", required=True, help="hub id or folder of the base Qwen-VL")
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = parser.parse_args(argv)
    print(convert(args.kind, args.checkpoint, args.base, args.out, args.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
