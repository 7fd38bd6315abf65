"""Per-stage request blocks: what one stage of a ``RolloutReq`` needs beyond ids and prompts.

``RolloutReq.stage_params`` maps a stage (track) name to its block, so a domain's knobs never
widen ``RolloutReq`` itself. The diffusion stage's block is :class:`DiffusionRequest` (σ
schedule, SDE steps, x_T recipe); an autoregressive stage will carry its own block
(``max_new_tokens``, stop strings …) under its own name, beside it in this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from unirl.types.batch import Batch, batch_field
from unirl.types.rollout import init_noise


@dataclass(kw_only=True)
class DiffusionRequest(Batch):
    """The diffusion stage's part of a request, authored by the driver.

    ``init_noise_ids[N]`` (per sample) and ``init_noise_shape`` (shared) are the x_T recipe:
    :meth:`initial_noise` regenerates x_T per id on CPU in fp32, so every engine starts from
    the same noise whatever the data-parallel split. ``sde_indices[N, S]`` (per sample) are
    the stochastic / trained steps, identical within a group (``S = 0``: the ODE everywhere).
    ``sigmas[T+1]`` (shared) is the one σ schedule every engine must use.

    The schedule metadata stays on the host through :meth:`to` (``host_fields``).
    """

    host_fields: ClassVar[tuple[str, ...]] = ("init_noise_ids", "sde_indices", "sigmas")

    init_noise_ids: torch.Tensor = batch_field("concat")
    sde_indices: torch.Tensor = batch_field("concat")
    sigmas: torch.Tensor = batch_field("shared")
    init_noise_shape: tuple[int, ...] = batch_field("shared")

    def __post_init__(self) -> None:
        self.init_noise_shape = tuple(int(d) for d in self.init_noise_shape)
        if self.init_noise_ids.ndim != 1:
            raise ValueError(
                "DiffusionRequest.init_noise_ids must be [N], got "
                f"{tuple(self.init_noise_ids.shape)}"
            )
        if self.sde_indices.ndim != 2:
            raise ValueError(
                f"DiffusionRequest.sde_indices must be [N, S], got {tuple(self.sde_indices.shape)}"
            )
        if self.sigmas.ndim != 1 or self.sigmas.numel() < 2:
            raise ValueError(
                f"DiffusionRequest.sigmas must be [T+1] with T >= 1, got {tuple(self.sigmas.shape)}"
            )
        if self.sde_indices.numel() and int(self.sde_indices.max()) >= self.num_steps:
            raise ValueError(
                f"DiffusionRequest.sde_indices point past the last of {self.num_steps} steps"
            )
        self.validate_lengths()

    @property
    def num_steps(self) -> int:
        """``T``: denoising steps of the schedule."""
        return int(self.sigmas.numel() - 1)

    @property
    def num_sde_steps(self) -> int:
        """``S``: stochastic (trained) steps per sample."""
        return int(self.sde_indices.shape[1])

    def initial_noise(self, seed: int) -> torch.Tensor:
        """``x_T[N, *init_noise_shape]`` fp32 on CPU: ``init_noise(init_noise_ids, shape, seed)``."""
        return init_noise(self.init_noise_ids, self.init_noise_shape, seed)
