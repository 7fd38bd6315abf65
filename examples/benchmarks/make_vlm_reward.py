"""An HPSv3 reward folder with random weights at a released backbone's architecture, for timing
a VLM judge on a GPU where no checkpoint can be downloaded.

The backbone has the layer shapes of the named Qwen2-VL model's ``config.json`` (the 7B one is
HPSv3's); the reward head is HPSv3's ranknet head; the tokenizer is a byte-level BPE trained
on the bundled prompt corpus with Qwen's special tokens and ``<|Reward|>``, under a Qwen-style
chat template (``unirl.models.common.tiny_qwen``, as the VLM reward tests use). The image
processor keeps Qwen2-VL's patching (14 px patches, 2 x 2 merge). Scores are meaningless; the compute per image is the released model's, except
that the small tokenizer writes a prompt in more tokens than Qwen's (the 256 image tokens of an
HPSv3 image dominate either way)::

    python examples/benchmarks/make_vlm_reward.py --out /tmp/hpsv3_7b_arch --arch qwen2-vl-7b
    python -m unirl.tools.bench ... reward.backend._target_=unirl.reward.local.HPSv3 \\
        +reward.backend.path=/tmp/hpsv3_7b_arch

``--device cuda`` builds the weights on the GPU (seconds instead of minutes for 7B).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from unirl.models.common.tiny_qwen import SPECIALS, qwen_tokenizer
from unirl.reward.local.vlm.engine import HEAD_FILE, ranknet_head
from unirl.reward.local.vlm.templates import HPSV3_REWARD_TOKEN

# layer shapes of the released config.json files (text: Qwen2 decoder; vision: the ViT and merger)
ARCHS = {
    "qwen2-vl-7b": {
        "text": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                 "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064},
        "vision": {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "num_heads": 16,
                   "mlp_ratio": 4},
        "tie_word_embeddings": False,
    },
    "qwen2-vl-2b": {
        "text": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                 "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936},
        "vision": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16,
                   "mlp_ratio": 4},
        "tie_word_embeddings": True,
    },
    # a few-layer model of the same kind, for checking this script on a CPU
    "tiny": {
        "text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512},
        "vision": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2,
                   "mlp_ratio": 2},
        "tie_word_embeddings": False,
    },
}  # fmt: skip


def backbone_config(arch: str, tok: Any) -> Any:
    """The ``Qwen2VLConfig`` of ``arch`` with ``tok``'s special token ids."""
    import transformers

    spec = ARCHS[arch]
    head_dim = spec["text"]["hidden_size"] // spec["text"]["num_attention_heads"]
    text = {
        **spec["text"],
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        # the released M-RoPE split (16, 24, 24) of a 128-wide head, scaled to this head
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16],
        },
        "bos_token_id": None,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIALS[3:7]]  # vision start / end, pads
    return transformers.Qwen2VLConfig(
        text_config=text,
        vision_config={**spec["vision"], "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2, "in_chans": 3},
        vision_start_token_id=ids[0],
        vision_end_token_id=ids[1],
        image_token_id=ids[2],
        video_token_id=ids[3],
        tie_word_embeddings=spec["tie_word_embeddings"],
    )  # fmt: skip


def write(out: Path, arch: str, device: str, seed: int = 0) -> Path:
    """Write the folder: backbone (bf16), tokenizer, image processor, ``reward_head.safetensors``."""
    import transformers
    from safetensors.torch import save_file
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tok = qwen_tokenizer(special=(HPSV3_REWARD_TOKEN,))
    config = backbone_config(arch, tok)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen2VLForConditionalGeneration(config).to(torch.bfloat16).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    Qwen2VLImageProcessorPil().save_pretrained(out)  # no torchvision needed
    head = ranknet_head(config.text_config.hidden_size, 2)
    save_file(
        {f"rm_head.{k}": v.contiguous() for k, v in head.state_dict().items()}, out / HEAD_FILE
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="qwen2-vl-7b")
    parser.add_argument("--device", default="cpu", help="where to build the weights (cuda: fast)")
    args = parser.parse_args(argv)
    path = write(args.out, args.arch, args.device)
    print(f"wrote a random-weight HPSv3 folder at {args.arch}'s shapes to {path}")


if __name__ == "__main__":
    main()
