"""HunyuanVideo 1.5 proves the shared family contract (``family_tester.py``) on its tiny
preset: videos of 5 frames (2 latent frames) at 32x48 (a 2x3 latent grid), 32 prompt tokens,
16 glyph bytes (the second prompt's quoted "OPEN" goes through the ByT5 encoder), no image
slots (they are masked out; the diffusers pipeline is set to the same count)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from diffusers import ClassifierFreeGuidance
from diffusers import HunyuanVideo15Pipeline as DiffusersHunyuanVideo15Pipeline
from family_tester import DiffusersSample, FamilyTester

from unirl.models.hunyuan_video import (
    HunyuanVideo15Bundle,
    HunyuanVideo15Pipeline,
    count_params,
    hunyuan_video15_arch_spec,
    tiny_preset_path,
)

TEXT_TOKENS = 32
GLYPH_TOKENS = 16
IMAGE_TOKENS = 0


def configure_reference(pipe: Any, guidance_scale: float) -> Any:
    """The diffusers pipeline at the bundle's lengths and guidance scale (the pipeline takes
    them as attributes and a guider, not as call arguments); one video per VAE call."""
    pipe.tokenizer_max_length = TEXT_TOKENS
    pipe.tokenizer_2_max_length = GLYPH_TOKENS
    pipe.vision_num_semantic_tokens = IMAGE_TOKENS
    pipe.guider = ClassifierFreeGuidance(guidance_scale=guidance_scale)
    # diffusers 0.42.1's VAE mid attention only broadcasts its causal mask over a batch of one
    pipe.vae.enable_slicing()
    return pipe


class TestHunyuanVideo15Family(FamilyTester):
    pipeline_class = HunyuanVideo15Pipeline
    diffusers_class = DiffusersHunyuanVideo15Pipeline
    lora_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj")
    guidance_scale = 4.0
    height = 32
    width = 48
    num_frames = 5

    def make_bundle(self, **overrides: Any) -> HunyuanVideo15Bundle:
        kwargs: dict[str, Any] = {
            "path": "tiny",
            "dtype": "fp32",
            "text_encoder_dtype": "fp32",
            "device": "cpu",
            "max_sequence_length": TEXT_TOKENS,
            "glyph_max_sequence_length": GLYPH_TOKENS,
            "image_tokens": IMAGE_TOKENS,
        }
        return HunyuanVideo15Bundle(**{**kwargs, **overrides})

    def tiny_path(self) -> Path:
        return tiny_preset_path()

    def diffusers_sample(
        self,
        pipe: Any,
        *,
        prompts: list[str],
        x_T: torch.Tensor,
        steps: int,
        guidance_scale: float,
        negative_prompt: str,
        height: int,
        width: int,
    ) -> DiffusersSample:
        configure_reference(pipe, guidance_scale)
        call = dict(
            prompt=prompts,
            negative_prompt=[negative_prompt] * len(prompts),
            num_inference_steps=steps,
            height=height,
            width=width,
            num_frames=self.num_frames,
            latents=x_T,  # the same [N, C, F, h, w] layout as ours
        )
        # the pipeline has no step-end callback: its final latents come from one call with
        # output_type="latent", its decoded frames from a second, identical one
        latents = pipe(**call, output_type="latent").frames
        frames = pipe(**call, output_type="pt").frames
        return DiffusersSample(latents=latents, pixels=frames, sigmas=pipe.scheduler.sigmas)

    def load_exported_lora(self, pipe: Any, folder: Path) -> None:
        # diffusers 0.42.1 gives HunyuanVideo15Pipeline no LoRA loader mixin; its transformer's
        # own peft loader takes the same file's tensors (keys ``transformer.*``) and, as the
        # pipelines' loader does, the rank / alpha stored in the file's metadata
        from safetensors import safe_open

        with safe_open(str(folder / "pytorch_lora_weights.safetensors"), "pt") as handle:
            state = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
            metadata = json.loads(handle.metadata()["lora_adapter_metadata"])
        pipe.transformer.load_lora_adapter(state, prefix="transformer", metadata=metadata)

    def check_arch(self) -> None:
        spec = hunyuan_video15_arch_spec()
        tr = spec.transformer
        assert (
            tr["num_layers"] == 54 and tr["num_attention_heads"] * tr["attention_head_dim"] == 2048
        )
        assert tr["in_channels"] == 2 * spec.vae["latent_channels"] + 1 == 65
        assert tr["text_embed_dim"] == spec.text_encoder["hidden_size"] == 3584
        assert tr["text_embed_2_dim"] == spec.text_encoder_2["d_model"] == 1472
        assert spec.scheduler["shift"] == 5.0
        counts = count_params(spec)
        assert 8.30e9 <= counts["transformer"] <= 8.35e9, counts  # "8.3 B parameters"
        assert 7.0e9 <= counts["text_encoder"] <= 7.1e9, counts  # Qwen2.5-VL-7B's language model
        assert 0.21e9 <= counts["text_encoder_2"] <= 0.22e9, counts  # byt5-small's encoder
        module = HunyuanVideo15Bundle.trainable_on_meta({"path": "hunyuan-video-1.5-arch"})
        assert module is not None and next(module.parameters()).device.type == "meta"
        assert sum(p.numel() for p in module.parameters()) == counts["transformer"]
