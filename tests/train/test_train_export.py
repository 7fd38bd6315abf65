"""An exported LoRA loads unchanged into diffusers' ``StableDiffusion3Pipeline`` (the ``tiny``
preset) and into ``peft.PeftModel``, and reproduces the trained module's output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_fakes import make_backend, output, train_step, transformer_inputs

from unirl.train import LoraConfig

# alpha != rank: the scale only survives if the adapter config travels with the weights.
LORA = LoraConfig(
    rank=4, alpha=12.0, targets=["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "to_add_out"]
)


class _Bundle:
    def __init__(self, transformer: torch.nn.Module) -> None:
        self.transformer = transformer

    @property
    def trainable_module(self) -> torch.nn.Module:
        return self.transformer


@pytest.fixture(scope="module")
def tiny_folder() -> Path:
    from unirl.models.sd3.presets import resolve_model_source

    folder = resolve_model_source("tiny")
    assert isinstance(folder, Path)
    return folder


def _pipeline(folder: Path):
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline.from_pretrained(str(folder), dtype=torch.float32)


def test_exported_lora_loads_into_sd3_pipeline_and_peft(tiny_folder: Path, tmp_path: Path) -> None:
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    trained = _pipeline(tiny_folder)
    config = trained.transformer.config
    inputs = transformer_inputs(2, seed=3, config=config)
    backend = make_backend(bundle=_Bundle(trained.transformer), lora=LORA, lr=5e-2)
    for step in range(2):
        train_step(backend, transformer_inputs(2, seed=10 + step, config=config))
    ours = output(backend, inputs)
    backend.export_lora(tmp_path / "lora")
    assert sorted(p.name for p in (tmp_path / "lora").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "pytorch_lora_weights.safetensors",
    ]

    fresh = _pipeline(tiny_folder)
    with torch.no_grad():
        base = fresh.transformer(**inputs).sample
    assert float((ours - base).abs().max()) > 1e-3  # training moved the output
    fresh.load_lora_weights(str(tmp_path / "lora"))
    with torch.no_grad():
        loaded = fresh.transformer(**inputs).sample
    assert float((loaded - base).abs().max()) > 1e-3
    torch.testing.assert_close(loaded, ours, atol=1e-5, rtol=0)

    state = fresh.lora_state_dict(str(tmp_path / "lora"))
    state = state[0] if isinstance(state, tuple) else state
    assert all(k.startswith("transformer.") for k in state)
    assert len(state) == len(backend.adapter_state_dict())

    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(
        _pipeline(tiny_folder).transformer, str(tmp_path / "lora")
    )
    with torch.no_grad():
        via_peft = peft_model(**inputs).sample
    torch.testing.assert_close(via_peft, ours, atol=1e-5, rtol=0)
