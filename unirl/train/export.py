"""Export a trained LoRA adapter in the formats other tools load unchanged.

- diffusers: ``pytorch_lora_weights.safetensors`` (keys ``transformer.<module>.lora_A.weight``,
  the peft config in the safetensors metadata so ``lora_alpha != rank`` round-trips), which
  ``StableDiffusion3Pipeline.load_lora_weights(dir)`` accepts;
- peft: ``adapter_config.json`` + ``adapter_model.safetensors`` (keys ``base_model.model.…``),
  which ``peft.PeftModel.from_pretrained(base_transformer, dir)`` accepts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

DIFFUSERS_WEIGHTS = "pytorch_lora_weights.safetensors"
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"


def write_lora_export(
    path: str | Path, lora_state: dict[str, torch.Tensor], peft_config: Any
) -> Path:
    """Write both formats to ``path`` from ``lora_state`` (peft names without the adapter
    name, full tensors) and the adapter's ``peft.LoraConfig``."""
    from safetensors.torch import save_file
    from transformers.utils import logging as hf_logging

    # Importing the SD3 pipeline class touches its optional IP-adapter components (Siglip /
    # CLIP image processors), and transformers warns that torchvision is missing for them —
    # unrelated to the export, so that one import runs with transformers' warnings off.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        from diffusers import StableDiffusion3Pipeline
    finally:
        hf_logging.set_verbosity(verbosity)

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in lora_state.items()}
    StableDiffusion3Pipeline.save_lora_weights(
        str(path),
        transformer_lora_layers=state,
        transformer_lora_adapter_metadata=peft_config.to_dict(),
        weight_name=DIFFUSERS_WEIGHTS,
    )
    peft_config.save_pretrained(str(path))
    save_file(
        {f"base_model.model.{k}": v for k, v in state.items()},
        str(path / PEFT_WEIGHTS),
        metadata={"format": "pt"},
    )
    return path
