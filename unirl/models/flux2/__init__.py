"""FLUX.2-Klein (DiT with a Qwen3 text encoder, flow matching, step-distilled or base;
text-to-image and reference-image editing): bundle, conditions, encoding, presets."""

from __future__ import annotations

from unirl.models.flux2.arch import (
    Flux2KleinArchSpec,
    build_arch_modules,
    count_params,
    flux2_klein_arch_spec,
)
from unirl.models.flux2.bundle import Flux2KleinBundle
from unirl.models.flux2.conditions import Flux2KleinConditions
from unirl.models.flux2.config import Flux2KleinBundleConfig
from unirl.models.flux2.engine_maps import Flux2KleinEngineMaps
from unirl.models.flux2.pipeline import Flux2KleinPipeline
from unirl.models.flux2.presets import (
    FLUX2_KLEIN_ARCH,
    PRESET_NAMES,
    arch_spec,
    resolve_model_source,
    source_is_distilled,
    tiny_preset_path,
)
from unirl.models.flux2.text_encode import encode_klein_prompts, pipeline_text_layers
from unirl.models.flux2.tiny import TinyFlux2Spec, build_tiny_pipeline

__all__ = [
    "FLUX2_KLEIN_ARCH",
    "PRESET_NAMES",
    "Flux2KleinArchSpec",
    "Flux2KleinBundle",
    "Flux2KleinBundleConfig",
    "Flux2KleinConditions",
    "Flux2KleinEngineMaps",
    "Flux2KleinPipeline",
    "TinyFlux2Spec",
    "arch_spec",
    "build_arch_modules",
    "build_tiny_pipeline",
    "count_params",
    "encode_klein_prompts",
    "flux2_klein_arch_spec",
    "pipeline_text_layers",
    "resolve_model_source",
    "source_is_distilled",
    "tiny_preset_path",
]
