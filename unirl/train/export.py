"""Export a trained LoRA adapter in the formats other tools load unchanged.

- diffusers: ``pytorch_lora_weights.safetensors`` (keys ``transformer.<module>.lora_A.weight``,
  the peft config in the safetensors metadata so ``lora_alpha != rank`` round-trips), which
  ``StableDiffusion3Pipeline.load_lora_weights(dir)`` accepts;
- peft: ``adapter_config.json`` + ``adapter_model.safetensors`` (keys ``base_model.model.…``),
  which ``peft.PeftModel.from_pretrained(base_transformer, dir)`` accepts;
- transformers: a whole trained model (a full fine-tune, or a LoRA fused into its base) as a
  ``save_pretrained`` folder with its tokenizer (``write_pretrained``, ``merged_state``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from peft import LoraConfig

DIFFUSERS_WEIGHTS = "pytorch_lora_weights.safetensors"
PEFT_WEIGHTS = "adapter_model.safetensors"


class SavesPretrained(Protocol):
    """A tokenizer or processor: it writes its own files into a ``save_pretrained`` folder."""

    def save_pretrained(self, save_directory: str) -> object: ...


def write_lora_export(
    path: str | Path, lora_state: dict[str, torch.Tensor], peft_config: LoraConfig
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


# -- whole models (full fine-tunes, AR LoRA merged) -----------------------------------------------

MODEL_WEIGHTS = "model.safetensors"
LORA_KEY_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")


def merged_state(
    module: torch.nn.Module, adapter: str | None, gather: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The whole state of ``module`` under its own names, unsharded by ``gather(tensor)`` (a
    collective for DTensors: call on every rank). With ``adapter`` the LoRA of that name is
    fused into each base weight (``W + scaling · B @ A``, in fp32) and every adapter's keys are
    dropped, so the names are the plain model's (``q_proj.weight``, not ``base_layer``)."""
    state = {k: gather(v) for k, v in module.state_dict().items()}
    if adapter is None:
        return state
    from peft.tuners.lora import LoraLayer

    for name, layer in module.named_modules():
        if not isinstance(layer, LoraLayer) or adapter not in layer.lora_A:
            continue
        if layer.use_dora.get(adapter, False):
            raise ValueError(f"{name}: a DoRA adapter cannot be fused by this export")
        prefix = f"{name}." if name else ""
        base_key = f"{prefix}base_layer.weight"
        a = state[f"{prefix}lora_A.{adapter}.weight"].float()
        b = state[f"{prefix}lora_B.{adapter}.weight"].float()
        base = state[base_key]
        delta = (b @ a) * float(layer.scaling[adapter])
        state[base_key] = (base.float() + delta.reshape(base.shape)).to(base.dtype)
    return {
        k.replace(".base_layer.", "."): v
        for k, v in state.items()
        if not any(part in k for part in LORA_KEY_PARTS)
    }


def plain_class(module: torch.nn.Module) -> type:
    """The model's own class: FSDP2 wraps a module by swapping in a subclass named
    ``FSDP<name>``, which ``config.json`` must not record."""
    for cls in type(module).__mro__:
        if not cls.__name__.startswith("FSDP"):
            return cls
    return type(module)


def write_pretrained(
    path: str | Path,
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    tokenizer: SavesPretrained | None,
) -> Path:
    """A ``save_pretrained`` folder of a transformers model that plain
    ``AutoModelFor*.from_pretrained(path)`` loads: ``config.json`` (its ``architectures`` the
    model's own class), ``generation_config.json``, ``model.safetensors`` from ``state`` (the
    names ``model.state_dict()`` uses) and the tokenizer or processor's files."""
    from safetensors.torch import save_file
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"{type(model).__name__} is not a transformers PreTrainedModel: the bundle must "
            "define save_pretrained(path, state) to export it"
        )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.architectures = [plain_class(model).__name__]
    config.save_pretrained(str(path))
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(str(path))
    # tied weights (embed_tokens / lm_head) are separate copies here; transformers ties them
    # again on load when the config says so
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(path / MODEL_WEIGHTS), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path


def base_model_reference(bundle: object) -> str | None:
    """What an adapter of ``bundle`` is applied to, for ``adapter_config.json``'s
    ``base_model_name_or_path``: the bundle's ``path`` (a hub id or a folder), or the folder a
    ``tiny`` preset was built in (under ``~/.cache/unirl``, which a user cannot guess);
    ``None`` when the bundle names no path (an ``*-arch`` preset has no weights to name)."""
    import importlib

    path = getattr(getattr(bundle, "config", None), "path", None)
    if not path or str(path).endswith("-arch"):
        return None
    path = str(path)
    if path.startswith("tiny"):
        package = importlib.import_module(type(bundle).__module__.rsplit(".", 1)[0])
        preset = getattr(package, "tiny_preset_path", None)
        if preset is None:
            return path
        return str(preset() if path == "tiny" else preset(path))
    return path
