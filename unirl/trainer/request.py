"""What every trainer's ``build_request`` authors the same way.

A request's ids (``sample_ids``: ``rollout_index · n …``, eval rollouts offset by
:data:`EVAL_ID_OFFSET` so their draws never meet a training rollout's; ``group_ids``: one
group per prompt), each prompt's text and metadata repeated ``samples_per_prompt`` times, a
text stage's :class:`TextRequest` (seed ids = sample ids) and a diffusion stage's SDE steps.
The text trainer (``ar``), the prompt enhancer (``pe``) and the unified model
(``unified_model``) build their requests from these; what differs (the image stage's block,
reference images) stays in each trainer.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.types import ARSamplingParams, TextRequest, Texts

EVAL_ID_OFFSET = 10**12  # eval sample ids start here: no eval draw repeats a training draw


def rollout_ids(
    num_prompts: int, samples_per_prompt: int, rollout_index: int, *, train: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sample_ids[n], group_ids[n])``, ``n = num_prompts · samples_per_prompt``: sample ids
    ``offset + rollout_index · n …`` (offset 0 in training, :data:`EVAL_ID_OFFSET` in eval),
    group ids ``rollout_index · num_prompts …``, each repeated ``samples_per_prompt`` times."""
    n = num_prompts * samples_per_prompt
    base = (0 if train else EVAL_ID_OFFSET) + rollout_index * n
    sample_ids = torch.arange(base, base + n, dtype=torch.long)
    group_base = rollout_index * num_prompts
    group_ids = torch.arange(group_base, group_base + num_prompts, dtype=torch.long)
    return sample_ids, group_ids.repeat_interleave(samples_per_prompt)


def prompt_texts(prompts: list[Any], samples_per_prompt: int) -> Texts:
    """Each prompt's text, ``samples_per_prompt`` times in a row."""
    return Texts(texts=[ex.prompt for ex in prompts for _ in range(samples_per_prompt)])


def prompt_metadata(prompts: list[Any], samples_per_prompt: int) -> list[dict[str, Any]]:
    """A copy of each prompt's metadata per sample, in the order of :func:`prompt_texts`."""
    return [dict(ex.metadata) for ex in prompts for _ in range(samples_per_prompt)]


def text_request(sampling: ARSamplingParams, sample_ids: torch.Tensor, mode: str) -> TextRequest:
    """A text stage's block: the sampling knobs (temperature per ``mode``: eval samples at
    ``eval_temperature``) and seed ids = ``sample_ids``, so each sample's draws follow from
    ``(seed, sample id)``."""
    return TextRequest(
        seed_ids=sample_ids.clone(),
        max_new_tokens=sampling.max_new_tokens,
        temperature=sampling.temperature_for(mode),
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        stop=tuple(sampling.stop or ()),
    )


def sde_indices(
    sde_steps: Any, steps: int, *, seed: int, rollout_index: int, n: int, trains: bool
) -> torch.Tensor:
    """``LongTensor[n, m]``: the denoising steps taken by SDE, the same ``m`` steps for every
    sample (``sde_steps.select``); ``[n, 0]`` (an ODE rollout) when ``trains`` is false (eval,
    or a frozen drawer)."""
    if not trains:
        return torch.zeros((n, 0), dtype=torch.long)
    chosen = sde_steps.select(steps, seed=seed, rollout_index=rollout_index)
    return torch.tensor([list(chosen)] * n, dtype=torch.long)


__all__ = [
    "EVAL_ID_OFFSET",
    "prompt_metadata",
    "prompt_texts",
    "rollout_ids",
    "sde_indices",
    "text_request",
]
