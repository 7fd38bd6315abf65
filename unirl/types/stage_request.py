"""Per-stage request blocks: what one stage of a ``RolloutReq`` needs beyond ids and prompts.

``RolloutReq.stage_params`` maps a stage (track) name to its block, so a domain's knobs never
widen ``RolloutReq`` itself. The diffusion stage's block is :class:`DiffusionRequest` (σ
schedule, SDE steps, x_T recipe); an autoregressive stage's block is :class:`TextRequest`
(``max_new_tokens``, temperature, stop strings, per-sample seeds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from unirl.types.batch import Batch, batch_field
from unirl.types.rollout import init_noise, noise_seed
from unirl.types.sampling import DiffusionSamplingParams


@dataclass(kw_only=True)
class DiffusionRequest(Batch):
    """The diffusion stage's part of a request, authored by the driver: the one request type
    of a diffusion stage, alone (``train_diffusion``), below a text stage (the unified model's
    image) or fanned out from one (a prompt enhancer's drawer).

    ``init_noise_ids[N]`` (per sample) and ``init_noise_shape`` (shared) are the x_T recipe:
    :meth:`initial_noise` regenerates x_T per id on CPU in fp32, so every engine starts from
    the same noise whatever the data-parallel split. ``sde_indices[N, S]`` (per sample) are
    the stochastic / trained steps, identical within a group (``S = 0``: the ODE everywhere).
    ``sigmas[T+1]`` (shared) is the one σ schedule every engine must use.
    ``sampling_params`` (shared, optional): the stage's own ``DiffusionSamplingParams`` when
    the request's top-level ones are another stage's (a composed recipe's text stage).

    Fan-out (optional): ``sample_ids[N, k]`` are the ids of the ``k`` samples each of the ``N``
    rows (a parent: one rewrite) draws, and ``init_noise_ids`` is then ``[N, k]`` (their x_T
    ids); :meth:`expand` gives the plain request of the ``N·k`` samples, parent-major.

    The schedule metadata stays on the host through :meth:`to` (``host_fields``).
    """

    host_fields: ClassVar[tuple[str, ...]] = (
        "init_noise_ids",
        "sde_indices",
        "sigmas",
        "sample_ids",
    )

    init_noise_ids: torch.Tensor = batch_field("concat")
    sde_indices: torch.Tensor = batch_field("concat")
    sigmas: torch.Tensor = batch_field("shared")
    init_noise_shape: tuple[int, ...] = batch_field("shared")
    sampling_params: DiffusionSamplingParams | None = batch_field("shared", default=None)
    sample_ids: torch.Tensor | None = batch_field("concat", default=None)

    def __post_init__(self) -> None:
        self.init_noise_shape = tuple(int(d) for d in self.init_noise_shape)
        if self.sample_ids is not None:
            if self.sample_ids.ndim != 2 or self.sample_ids.shape[1] < 1:
                raise ValueError(
                    "DiffusionRequest.sample_ids (a fan-out) must be [N, k] with k >= 1, got "
                    f"{tuple(self.sample_ids.shape)}"
                )
            if self.init_noise_ids.shape != self.sample_ids.shape:
                raise ValueError(
                    f"DiffusionRequest.init_noise_ids {tuple(self.init_noise_ids.shape)} must "
                    f"match the fan-out's sample_ids {tuple(self.sample_ids.shape)}"
                )
        elif self.init_noise_ids.ndim != 1:
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

    def own_sampling(self) -> DiffusionSamplingParams:
        """The stage's own sampling parameters (a composed request's image stage); one line
        naming what is missing when the author gave none."""
        if self.sampling_params is None:
            raise ValueError(
                "this DiffusionRequest carries no sampling_params; the author of a composed "
                "request gives the diffusion stage its own DiffusionSamplingParams"
            )
        return self.sampling_params

    @property
    def fan_out(self) -> int:
        """``k``: samples per row (1 without a fan-out)."""
        return 1 if self.sample_ids is None else int(self.sample_ids.shape[1])

    def expand(self) -> DiffusionRequest:
        """The request of the ``N·k`` samples of a fan-out, parent-major (the ``k`` samples of
        row ``i`` are rows ``i·k … i·k+k-1``), its sampling parameters kept; a request
        without a fan-out is returned as it is."""
        if self.sample_ids is None:
            return self
        k = self.fan_out
        return DiffusionRequest(
            init_noise_ids=self.init_noise_ids.reshape(-1).clone(),
            sde_indices=self.sde_indices.repeat_interleave(k, dim=0),
            sigmas=self.sigmas,
            init_noise_shape=self.init_noise_shape,
            sampling_params=self.sampling_params,
        )

    @property
    def num_sde_steps(self) -> int:
        """``S``: stochastic (trained) steps per sample."""
        return int(self.sde_indices.shape[1])

    def initial_noise(self, seed: int) -> torch.Tensor:
        """``x_T[N, *init_noise_shape]`` fp32 on CPU: ``init_noise(init_noise_ids, shape, seed)``."""
        return init_noise(self.init_noise_ids, self.init_noise_shape, seed)


@dataclass(kw_only=True)
class TextRequest(Batch):
    """An autoregressive stage's part of a request, authored by the driver.

    ``seed_ids[N]`` (per sample) name each sample's random stream: :meth:`uniforms` draws the
    uniforms a sampler turns into tokens from ``(seed, seed_id)`` alone, so a sample's draws
    do not depend on which rank or batch it lands in. The generation knobs are shared:
    ``max_new_tokens``, ``temperature`` (0: greedy), ``top_p`` / ``top_k`` (1.0 / -1: off)
    and ``stop`` strings (an end-of-sequence token always stops too).
    """

    host_fields: ClassVar[tuple[str, ...]] = ("seed_ids",)

    seed_ids: torch.Tensor = batch_field("concat")
    max_new_tokens: int = batch_field("shared")
    temperature: float = batch_field("shared", default=1.0)
    top_p: float = batch_field("shared", default=1.0)
    top_k: int = batch_field("shared", default=-1)
    stop: tuple[str, ...] = batch_field("shared", default=())

    def __post_init__(self) -> None:
        self.stop = tuple(str(s) for s in self.stop)
        if self.seed_ids.ndim != 1:
            raise ValueError(f"TextRequest.seed_ids must be [N], got {tuple(self.seed_ids.shape)}")
        if self.max_new_tokens < 1:
            raise ValueError(f"TextRequest.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or (self.top_k != -1 and self.top_k < 1):
            raise ValueError(
                f"TextRequest: temperature={self.temperature} must be >= 0, top_p={self.top_p} "
                f"in (0, 1], top_k={self.top_k} -1 or >= 1"
            )
        self.validate_lengths()

    def uniforms(self, seed: int, steps: int | None = None) -> torch.Tensor:
        """``u[N, steps]`` fp64 in [0, 1) on CPU, one row per ``seed_id`` from its own
        generator (``noise_seed(seed, id, "tokens")``); ``steps`` defaults to
        ``max_new_tokens``. Row ``i`` is a prefix-stable stream: more steps extend it."""
        steps = self.max_new_tokens if steps is None else steps
        out = torch.empty((len(self.seed_ids), steps), dtype=torch.float64)
        gen = torch.Generator(device="cpu")
        for row, seed_id in enumerate(self.seed_ids.tolist()):
            gen.manual_seed(noise_seed(seed, int(seed_id), "tokens"))
            out[row] = torch.rand(steps, generator=gen, dtype=torch.float64)
        return out
