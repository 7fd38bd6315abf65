"""``janus-pro-*-arch`` presets: the released Janus-Pro shapes with random weights (benchmarks,
memory planning, offline dry runs), in the layout transformers' ``JanusConfig`` takes.

How the numbers were checked (against public copies; the ``deepseek-ai`` / ``deepseek-community``
``config.json`` files themselves are not in the stored corpus this was checked with):

- transformers' converter, ``huggingface/transformers``
  ``src/transformers/models/janus/convert_janus_weights_to_hf.py`` (the versions that read
  ``config_data["language_config"]``): ``text_config`` takes ``vocab_size``, ``hidden_size``,
  ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``num_key_value_heads``, ``hidden_act``, ``max_position_embeddings`` from the released
  ``language_config`` (the rest: ``LlamaConfig`` defaults: ``rms_norm_eps`` 1e-6, RoPE theta
  10,000, untied LM head) and pad / BOS / EOS from the tokenizer; ``vision_config`` takes
  ``image_size`` and the aligner's ``n_embed`` (``projection_dim``) and ``depth`` (the rest:
  ``JanusVisionConfig`` defaults, SigLIP-L/16: 1024 wide, 24 layers, 16 heads, MLP ratio 4,
  576 tokens); ``vq_config`` takes ``embed_dim`` 8 and ``num_embeddings`` 16,384 (``VQ-16``'s
  ``n_embed`` / ``image_token_size``), the generation aligner's ``n_embed`` and ``depth`` and the
  generation head's ``image_token_embed`` (the decoder's channels, multipliers, resolution
  blocks: ``JanusVQVAEConfig`` defaults); the generation config's pad is ``<｜▁pad▁｜>``.
- Janus-Pro-7B (``deepseek-ai/Janus-Pro-7B`` ``config.json``, as copied on the Hub into
  ``cyan2k/Janus-Pro-7B-bnb-4bit`` ``config.json`` @ f90ae86 and ``YhangChen/iris-step200``
  ``config.json`` (``_name_or_path`` ``deepseek-ai/Janus-Pro-7B``)): ``language_config`` =
  llama, 30 layers, vocab 102,400, 16,384 positions (width, MLP and heads left to
  ``LlamaConfig``'s defaults 4096 / 11,008 / 32, which ``wnma3mz/Janus-Pro-7B-LM``
  ``config.json`` @ fd07ec9, the extracted LLM, states, with 32 KV heads, ``rms_norm_eps``
  1e-6, theta 10,000, ``tie_word_embeddings`` false); aligner
  ``mlp_gelu`` depth 2, 1024 -> 4096; generation aligner depth 2, 8 -> 4096; generation head
  ``image_token_embed`` 4096, ``image_token_size`` 16,384; ``gen_vision_config`` ``VQ-16``,
  16,384 codes of dimension 8.
- Janus-Pro-1B (converted layout: ``hf-internal-testing/tiny-processor-janus``
  ``config.json`` @ b60fa57, transformers 4.52, every text and vision number at the 1B size;
  ``pruna-test/tiny_janus``
  the same with one layer): text 2048 wide, MLP 5632, 16 heads, 16 KV heads, 24 layers, 16,384
  positions, vocab 102,400, ``rms_norm_eps`` 1e-6, theta 10,000, BOS 100000, EOS 100001, pad
  100002; vision 1024 wide, 384 px, patch 16, MLP ratio 4, aligner depth 2, 2048 out, 576
  tokens; ``image_token_id`` 100581.

Fixed by this check: ``text_config.pad_token_id`` was 100015 (``<｜▁pad▁｜>``, the pad of
*image generation*'s unconditional branch, which the converter puts in the generation config);
the converted configs carry the tokenizer's pad, 100002. Not verified: the 1B VQ and generation
head/aligner widths (no 1B ``vq_config`` copy was found; they follow the converter's rule from
the 7B-style fields, at width 2048); ``<begin_of_image>`` 100016 (from the released
tokenizer's added tokens, not seen in a copy); the top-level ``tie_word_embeddings`` of the
``deepseek-community`` folders (``JanusConfig`` defaults it to true in transformers 5.x; the
released LLM is untied, so it is false here).
"""

from __future__ import annotations

import copy
from typing import Any

BOS_ID, EOS_ID, PAD_ID, BOI_ID, IMAGE_PLACEHOLDER_ID = 100000, 100001, 100002, 100016, 100581


def _janus(hidden: int, intermediate: int, layers: int, heads: int) -> dict[str, Any]:
    return {
        "text_config": {
            "model_type": "llama",
            "vocab_size": 102400,
            "hidden_size": hidden,
            "intermediate_size": intermediate,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "hidden_act": "silu",
            "max_position_embeddings": 16384,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
        },
        "vision_config": {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "image_size": 384,
            "patch_size": 16,
            "mlp_ratio": 4.0,
            "projection_dim": hidden,
            "depth": 2,
            "num_image_tokens": 576,
        },
        "vq_config": {
            "embed_dim": 8,
            "num_embeddings": 16384,
            "latent_channels": 256,
            "base_channels": 128,
            "channel_multiplier": [1, 1, 2, 2, 4],
            "num_res_blocks": 2,
            "projection_dim": hidden,
            "image_token_embed_dim": hidden,
            "num_hidden_layers": 2,
        },
        "image_token_id": IMAGE_PLACEHOLDER_ID,
        "tie_word_embeddings": False,
    }


ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "janus-pro-1b-arch": _janus(hidden=2048, intermediate=5632, layers=24, heads=16),
    "janus-pro-7b-arch": _janus(hidden=4096, intermediate=11008, layers=30, heads=32),
}


def arch_config(name: str) -> dict[str, Any]:
    """A copy of the transformers ``JanusConfig`` (as a dict) of preset ``name``."""
    if name not in ARCH_CONFIGS:
        raise KeyError(f"unknown Janus arch preset {name!r}; known: {sorted(ARCH_CONFIGS)}")
    return copy.deepcopy(ARCH_CONFIGS[name])
