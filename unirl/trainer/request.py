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

from collections.abc import Callable
from typing import Any

import torch

from unirl.config.run import RunConfig
from unirl.types import (
    ARSamplingParams,
    DiffusionRequest,
    DiffusionSamplingParams,
    Images,
    RolloutReq,
    TextRequest,
    Texts,
)

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


def diffusion_request(
    sampling: DiffusionSamplingParams,
    sde_steps: Any,
    schedules: dict[str, torch.Tensor],
    latent_shape: tuple[int, ...],
    *,
    noise_ids: torch.Tensor,
    seed: int,
    rollout_index: int,
    train: bool,
    trains_sde: bool,
    sample_ids: torch.Tensor | None = None,
    own_params: bool = False,
) -> DiffusionRequest:
    """A diffusion stage's block: x_T ids ``noise_ids`` (``[N]``, or ``[N, k]`` with the
    fan-out's ``sample_ids``), the σ schedule of the mode's step count, the SDE steps
    (:func:`sde_indices`, when ``train`` and the stage trains them) and the latent shape;
    ``own_params``: the stage's ``sampling`` rides along (a composed request, whose top-level
    params are its text stage's)."""
    steps = sampling.num_inference_steps if train else sampling.eval_num_inference_steps
    return DiffusionRequest(
        init_noise_ids=noise_ids.clone(),
        sde_indices=sde_indices(
            sde_steps,
            steps,
            seed=seed,
            rollout_index=rollout_index,
            n=len(noise_ids),
            trains=train and trains_sde,
        ),
        sigmas=schedules["train" if train else "eval"].clone(),
        init_noise_shape=tuple(latent_shape),
        sampling_params=sampling if own_params else None,
        sample_ids=None if sample_ids is None else sample_ids.clone(),
    )


def prompt_request(
    cfg: RunConfig,
    prompts: list[Any],
    samples_per_prompt: int,
    rollout_index: int,
    mode: str,
    *,
    stages: Callable[[torch.Tensor], dict[str, Any]],
    sampling_params: Any,
    images: torch.Tensor | None = None,
) -> RolloutReq:
    """The request of ``samples_per_prompt`` samples of each prompt: :func:`rollout_ids`,
    each prompt's text and metadata per sample, ``images`` (each sample's reference image,
    when the recipe has them), the stages' blocks (``stages(sample_ids)``: each stage's
    draws follow from the sample ids), and the recipe's seed of ``mode``."""
    train = mode == "train"
    sample_ids, group_ids = rollout_ids(
        len(prompts), samples_per_prompt, rollout_index, train=train
    )
    primitives: dict[str, Any] = {"text": prompt_texts(prompts, samples_per_prompt)}
    if images is not None:
        primitives["image"] = Images(pixels=images)
    return RolloutReq(
        sample_ids=sample_ids,
        group_ids=group_ids,
        primitives=primitives,
        metadata=prompt_metadata(prompts, samples_per_prompt),
        stage_params=stages(sample_ids),
        sampling_params=sampling_params,
        seed=cfg.seed if train else cfg.eval.seed,
        rollout_index=rollout_index,
        mode=mode,  # type: ignore[arg-type]
    )


__all__ = [
    "EVAL_ID_OFFSET",
    "diffusion_request",
    "prompt_metadata",
    "prompt_request",
    "prompt_texts",
    "rollout_ids",
    "sde_indices",
    "text_request",
]
