"""HunyuanVideo 1.0 (a dual- then single-stream video DiT with a Llama text encoder, CLIP's
pooled text embedding, a guidance embedding and a 16-channel 3D causal VAE, flow matching):
bundle, conditions, encoding, presets. HunyuanVideo 1.5 is ``unirl.models.hunyuan_video``."""

from __future__ import annotations

from unirl.models.hunyuan_video_v1.arch import (
    HunyuanVideoArchSpec,
    build_arch_modules,
    count_params,
    hunyuan_video_arch_spec,
)
from unirl.models.hunyuan_video_v1.bundle import HunyuanVideoBundle
from unirl.models.hunyuan_video_v1.conditions import HunyuanVideoConditions
from unirl.models.hunyuan_video_v1.config import HunyuanVideoBundleConfig
from unirl.models.hunyuan_video_v1.guidance import EmbeddedGuidance
from unirl.models.hunyuan_video_v1.pipeline import HunyuanVideoPipeline
from unirl.models.hunyuan_video_v1.presets import (
    HUNYUAN_VIDEO_ARCH,
    PRESET_NAMES,
    arch_spec,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.hunyuan_video_v1.text_encode import (
    encode_clip_pooled,
    encode_llama_prompts,
    pipeline_prompt_template,
)
from unirl.models.hunyuan_video_v1.tiny import TinyHunyuanVideoSpec, build_tiny_pipeline

__all__ = [
    "HUNYUAN_VIDEO_ARCH",
    "PRESET_NAMES",
    "EmbeddedGuidance",
    "HunyuanVideoArchSpec",
    "HunyuanVideoBundle",
    "HunyuanVideoBundleConfig",
    "HunyuanVideoConditions",
    "HunyuanVideoPipeline",
    "TinyHunyuanVideoSpec",
    "arch_spec",
    "build_arch_modules",
    "build_tiny_pipeline",
    "count_params",
    "encode_clip_pooled",
    "encode_llama_prompts",
    "hunyuan_video_arch_spec",
    "pipeline_prompt_template",
    "resolve_model_source",
    "tiny_preset_path",
]
