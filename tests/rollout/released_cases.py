"""The values behind the released-engine fixtures (``tests/fixtures/engines/``).

The recording scripts (run where the released package is installed) turn these tensors into
wire bytes with the package's own serializers; the tests rebuild the same tensors here and
compare what the real clients decode with them. Everything is deterministic (no RNG state):
a fixture re-recorded with the same package version is byte-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from unirl.sde import sigmas_from_scheduler_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SGLANG_VERSION = "0.5.23"
SGLANG_DIR = FIXTURES / f"sglang-{SGLANG_VERSION}"
VLLM_OMNI_VERSION = "0.30.0"
VLLM_OMNI_DIR = FIXTURES / f"vllm_omni-{VLLM_OMNI_VERSION}"

# the tiny SD3 request of tests/rollout/rollout_fakes.py: 6 steps, latents [16, 8, 8]
SCHED = {"shift": 3.0, "use_dynamic_shifting": False, "num_train_timesteps": 1000}
STEPS = 6
LATENT = (16, 8, 8)
SAMPLES = 2  # num_outputs_per_prompt of the recorded call
PROMPT = "a red cube on a table"
SEED = 1234
PIXELS = (3, 16, 16)
TEXT_SHAPE = (10, 16)  # encoder_hidden_states per sample [L, D]
POOLED = 8


def ramp(shape: tuple[int, ...], *, start: float, step: float, dtype: torch.dtype) -> torch.Tensor:
    """``start + step * i`` over the flat index, reshaped; exact in fp32 for these sizes."""
    n = 1
    for s in shape:
        n *= s
    return (start + step * torch.arange(n, dtype=torch.float64)).to(dtype).reshape(shape)


def diffusion_sigmas() -> torch.Tensor:
    return sigmas_from_scheduler_config(SCHED, STEPS, image_seq_len=16)


def diffusion_batch() -> dict[str, Any]:
    """What SGLang's pipeline hands the rollout route for one call (batch-first tensors, as
    ``OutputBatch.output`` and ``RolloutTrajectoryData`` hold them)."""
    sigmas = diffusion_sigmas().to(torch.float32)
    return {
        "output": ramp((SAMPLES, *PIXELS), start=0.0, step=1.0 / 2048, dtype=torch.float32),
        "log_probs": ramp((SAMPLES, STEPS), start=-3.0, step=0.125, dtype=torch.float32),
        "latents": ramp(
            (SAMPLES, STEPS + 1, *LATENT), start=-1.0, step=1.0 / 8192, dtype=torch.float32
        ),
        "timesteps": sigmas[:-1] * 1000.0,
        "sigmas": sigmas,
        "pos": {
            "encoder_hidden_states": ramp(
                (SAMPLES, *TEXT_SHAPE), start=0.5, step=1 / 64, dtype=torch.bfloat16
            ),
            "pooled_projections": ramp(
                (SAMPLES, POOLED), start=-0.25, step=1 / 32, dtype=torch.bfloat16
            ),
        },
        "neg": {
            "encoder_hidden_states": torch.zeros(SAMPLES, *TEXT_SHAPE, dtype=torch.bfloat16),
            "pooled_projections": torch.zeros(SAMPLES, POOLED, dtype=torch.bfloat16),
        },
    }


# -- the language-model server (/generate) -------------------------------------------------------

LLM_PROMPTS = [[11, 12, 13], [21, 22]]
LLM_OUTPUTS = [[101, 102, 103, 2], [201, 202, 203, 204, 205]]  # the first stops on token 2
LLM_STOP_TOKEN = 2


def llm_log_probs(index: int) -> list[float]:
    """Per generated token, exact binary fractions (JSON round trip is exact)."""
    return [-0.5 - 0.25 * k - index for k in range(len(LLM_OUTPUTS[index]))]


# -- weight updates (/update_weights_from_tensor) -----------------------------------------------


def weight_update_tensors() -> list[tuple[str, torch.Tensor]]:
    """Named tensors a trainer sends (bf16 and fp32, as a full sync of SD3 would)."""
    return [
        (
            "transformer_blocks.0.attn.to_q.weight",
            ramp((4, 4), start=0.0, step=0.5, dtype=torch.bfloat16),
        ),
        (
            "transformer_blocks.0.attn.to_q.bias",
            ramp((4,), start=-1.0, step=0.25, dtype=torch.float32),
        ),
    ]


# -- vLLM-Omni worker extension (collective_rpc) -------------------------------------------------


def vllm_omni_full_tensors() -> list[tuple[str, torch.Tensor]]:
    """Full weights for the stand-in worker's ``transformer`` (two ``Linear(4, 4)``)."""
    return [
        ("to_q.weight", ramp((4, 4), start=-1.0, step=0.125, dtype=torch.float32)),
        ("to_q.bias", ramp((4,), start=0.5, step=0.25, dtype=torch.float32)),
        ("to_k.weight", ramp((4, 4), start=1.0, step=-0.0625, dtype=torch.float32)),
        ("to_k.bias", torch.zeros(4)),
    ]


def vllm_omni_lora_config() -> dict[str, Any]:
    return {
        "r": 2,
        "lora_alpha": 4.0,
        "target_modules": ["to_k", "to_q"],
        "use_rslora": False,
        "adapter_name": "default",
    }


def vllm_omni_lora_tensors() -> list[tuple[str, torch.Tensor]]:
    """The adapter under the trainer's saved-state names (``lora_A.weight`` / ``lora_B.weight``)."""
    out = []
    for k, module in enumerate(("to_k", "to_q")):
        out.append(
            (
                f"{module}.lora_A.weight",
                ramp((2, 4), start=0.25 * k, step=0.125, dtype=torch.float32),
            )
        )
        out.append(
            (f"{module}.lora_B.weight", ramp((4, 2), start=-0.5, step=0.25, dtype=torch.float32))
        )
    return out
