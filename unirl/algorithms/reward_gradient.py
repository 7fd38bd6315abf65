"""Reward-gradient training (docs/math.md, "Reward-gradient training"): ReFL, DRaFT-K,
DRaFT-LV, AlignProp and DR-Tune.

The reward is a differentiable function of the decoded pixels (``algorithm.reward``, e.g.
``unirl.reward.differentiable.DifferentiableBrightness``); the loss is −reward_scale·mean r(x₀)
and its gradient reaches the weights through the decode and some of the denoising steps. The
rollout runs the deterministic Euler chain (``pipeline.strategy: unirl.sde.ODE``) and stores
the chain's inputs at ``sampling.sde_steps`` (``stores_steps``); a loss restarts the chain
there with autograd. The methods differ only in which steps carry a gradient:

    ReFL       one stored late step j (the schedule draws it): x̂₀ = x_j − σ_j·v_θ(x_j, σ_j)
    DRaFT-K    the last K steps, full backprop (inputs not detached)
    DRaFT-LV   K = 1 on n re-noised copies of x₀: x⁽ⁱ⁾ = (1 − σ)·x₀ + σ·ε_i, x̂₀⁽ⁱ⁾ = x⁽ⁱ⁾ − σ·v_θ
    AlignProp  the last K steps, K ~ U{1 … K_max} per rollout (randomized truncation)
    DR-Tune    all T steps from x_T; the denoiser's input is detached (v_θ(sg(x_j))), and only M
               equally spaced steps (random offset per rollout) carry a weight gradient; the
               Euler skip path x_{j+1} = x_j + Δ_j·v carries dL/dx₀ back to the input noise

Steps with a gradient are gradient-checkpointed (``checkpoint``): their activations are
recomputed in backward, so memory grows with the latents of the chain, not its activations.
The advantage the trainer computes from the scalar reward is logged, not used.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import ClassVar, Protocol

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.algorithms.replay import ReplayPipeline
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat, PositiveInt
from unirl.models.common.denoise import forward_conditions, guided_velocity
from unirl.models.common.protocols import FlowMatchingFamily
from unirl.types import Conditions, LatentSegment, host_to_device


class DifferentiableReward(Protocol):
    """``rewards[N]`` from ``pixels[N, 3, H, W]`` in [0, 1], differentiable in the pixels."""

    def __call__(self, pixels: Tensor) -> Tensor: ...


def euler_chain(
    pipeline: FlowMatchingFamily,
    fwd_conditions: object,
    x: Tensor,
    sigmas: Tensor,
    guidance_scale: float,
    *,
    grad_steps: Collection[int],
    detach_inputs: bool = False,
    checkpoint: bool = True,
) -> Tensor:
    """Euler steps x ← x + (σ_{j+1} − σ_j)·v(x, σ_j) for j = 0 … len(sigmas) − 2, fp32.

    ``grad_steps`` (indices into ``sigmas``) compute v with autograd, through the family's
    guidance with both CFG halves carrying the gradient; the other steps compute v without it
    (x's own graph still runs through them: the skip path). ``detach_inputs``: the denoiser of
    a gradient step sees sg(x) (DR-Tune), so no gradient runs through the network into x.
    ``checkpoint``: recompute each gradient step's activations in backward."""
    n = x.shape[0]
    shape = (-1, *([1] * (x.ndim - 1)))
    x = x.float()

    def velocity(inp: Tensor, sigma: Tensor) -> Tensor:
        return guided_velocity(
            pipeline, inp, sigma, fwd_conditions, guidance_scale, cfg_gradient="both"
        )

    for j in range(sigmas.numel() - 1):
        sigma, delta = sigmas[j].expand(n), sigmas[j + 1] - sigmas[j]
        if j in grad_steps:
            inp = x.detach() if detach_inputs else x
            if checkpoint:
                v = activation_checkpoint(velocity, inp, sigma, use_reentrant=False)
            else:
                v = velocity(inp, sigma)
        else:
            with torch.no_grad():
                v = velocity(x.detach(), sigma)
        x = x + v.float() * delta.view(shape)
    return x


def stored_input(segment: LatentSegment, step: int) -> Tensor:
    """The chain's input of ``step`` for every row (``segment.latents`` at the slot that stores
    it); the recipe's ``sampling.sde_steps`` must store that step for every sample."""
    if segment.latents is None:
        raise ValueError("the rollout stored no chain inputs (segment.latents is None)")
    hits = (segment.sde_indices == step).nonzero()
    rows = hits[:, 0].unique()
    if rows.numel() != segment.sde_indices.shape[0]:
        raise ValueError(
            f"the loss restarts the chain at step {step}, which sampling.sde_steps did not store "
            f"for every sample (stored: {sorted(set(segment.sde_indices.flatten().tolist()))}); "
            "store every step with sde_steps: {_target_: unirl.sde.AllSteps, exclude_last: false}"
        )
    slots = torch.full((segment.sde_indices.shape[0],), -1, dtype=torch.long)
    slots[hits[:, 0]] = hits[:, 1]
    index = host_to_device(slots, segment.latents.device)
    return segment.latents[torch.arange(len(slots), device=index.device), index]


def _generator(seed: int, *parts: int) -> torch.Generator:
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


class RewardGradientLoss(StageAlgorithm[LatentSegment]):
    """The shared part of the reward-gradient losses: restart, decode, reward, backward.

    ``reward``: the differentiable reward (a callable on decoded pixels, e.g.
    ``unirl.reward.differentiable.DifferentiableBrightness``). ``reward_scale``: the loss is
    −reward_scale·mean r. ``checkpoint``: recompute the activations of each step that carries
    a gradient in backward (memory of the chain's latents, not of its activations). ``seed``:
    seeds the method's per-rollout draws (with the rollout index).
    """

    requires_log_prob: ClassVar[bool] = False
    stores_steps: ClassVar[bool] = True
    method: ClassVar[str] = ""

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        reward: DifferentiableReward,
        reward_scale: PositiveFloat = 1.0,
        checkpoint: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(kl=None)
        require(callable(reward), "algorithm.reward must be a differentiable reward callable")
        require(reward_scale > 0, "algorithm.reward_scale must be > 0")
        self.pipeline = pipeline
        self.reward = reward
        self.reward_scale = float(reward_scale)
        self.checkpoint = bool(checkpoint)
        self.seed = int(seed)
        self.rollout_index = 0
        self._calls = 0

    def start_rollout(self, rollout_index: int) -> None:
        self.rollout_index = int(rollout_index)
        self._calls = 0

    def rollout_generator(self) -> torch.Generator:
        """Draws shared by every micro-batch and rank of this rollout."""
        return _generator(self.seed, self.rollout_index)

    def denoised(
        self, conditions: Conditions, segment: LatentSegment
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """*Method*: x̂₀ ``[R, ...]`` with its autograd graph (R = rows, a multiple of the
        micro-batch) and per-micro-batch terms."""
        raise NotImplementedError

    def chain(
        self,
        conditions: Conditions,
        segment: LatentSegment,
        x: Tensor,
        first: int,
        grad_steps: Collection[int],
        *,
        detach_inputs: bool = False,
    ) -> Tensor:
        """Run the Euler chain of ``segment.sigmas`` from ``x`` (the input of step ``first``)
        to σ = 0; ``grad_steps`` are absolute step indices."""
        sigmas = host_to_device(segment.sigmas.float()[first:], x.device)
        fwd = forward_conditions(self.pipeline, conditions, segment.guidance_scale)
        return euler_chain(
            self.pipeline,
            fwd,
            x,
            sigmas,
            segment.guidance_scale,
            grad_steps={j - first for j in grad_steps},
            detach_inputs=detach_inputs,
            checkpoint=self.checkpoint,
        )

    def compute_loss_and_backward(
        self,
        conditions: Conditions,
        segment: LatentSegment,
        advantages: Tensor,
        loss_scale: float,
    ) -> StepResult:
        self._calls += 1
        x0, terms = self.denoised(conditions, segment)
        rewards = self.reward(self.pipeline.decode(x0))
        loss = -self.reward_scale * rewards.float().mean()
        (loss * loss_scale).backward()
        n = len(advantages)
        per_sample = rewards.detach().float().reshape(-1, n).mean(dim=0)  # LV: copies averaged
        out = {"reward_grad/reward": per_sample.cpu(), **terms}
        return StepResult(loss=loss.detach() * loss_scale, terms=out)

    def summarize(self, terms: dict[str, Tensor]) -> dict[str, float]:
        """``policy_loss`` (−reward_scale·mean r of the trained x̂₀), ``reward_grad/reward``
        (mean differentiable reward there) and ``reward_grad/grad_steps`` (steps with a
        gradient, mean over micro-batches)."""
        reward = terms["reward_grad/reward"].float()
        out = {
            "policy_loss": -self.reward_scale * float(reward.mean()),
            "reward_grad/reward": float(reward.mean()),
        }
        if "reward_grad/grad_steps" in terms:
            out["reward_grad/grad_steps"] = float(terms["reward_grad/grad_steps"].float().mean())
        return out


def _steps_term(count: int) -> dict[str, Tensor]:
    return {"reward_grad/grad_steps": torch.tensor([float(count)])}


class ReFL(RewardGradientLoss):
    """ReFL (Xu et al. 2023, ImageReward): one late step with a gradient, from its x₀ prediction.

    The step is drawn by the recipe's ``sampling.sde_steps`` (e.g. ``RandomSubsetSchedule``
    with ``num_steps: 1`` and a late ``fraction``); when it stores several, one of them is
    drawn per rollout. x̂₀ = x_j − σ_j·v_θ(x_j, σ_j): one forward with a gradient, input
    constant (the rollout's no-grad prefix)."""

    method: ClassVar[str] = "refl"

    def denoised(
        self, conditions: Conditions, segment: LatentSegment
    ) -> tuple[Tensor, dict[str, Tensor]]:
        stored = sorted(set(segment.sde_indices.flatten().tolist()))
        require(bool(stored), "ReFL needs a stored step: set sampling.sde_steps")
        pick = int(torch.randint(len(stored), (1,), generator=self.rollout_generator()))
        step = stored[pick]
        x = stored_input(segment, step)
        sigma = host_to_device(segment.sigmas.float()[step : step + 1], x.device)
        sigmas = torch.cat([sigma, torch.zeros_like(sigma)])  # one jump σ_j -> 0
        fwd = forward_conditions(self.pipeline, conditions, segment.guidance_scale)
        x0 = euler_chain(
            self.pipeline,
            fwd,
            x,
            sigmas,
            segment.guidance_scale,
            grad_steps={0},
            checkpoint=self.checkpoint,
        )
        return x0, {**_steps_term(1), "reward_grad/step": torch.tensor([float(step)])}


class DRaFT(RewardGradientLoss):
    """DRaFT (Clark et al. 2023): back-propagation through the last ``k`` steps (DRaFT-K;
    ``k`` = 1 is DRaFT-1), the chain before them without a gradient. ``lv_copies`` n ≥ 1 is
    DRaFT-LV (needs ``k`` = 1): the final sample x₀ (no gradient) is re-noised n times to the
    last step's σ, x⁽ⁱ⁾ = (1 − σ)·x₀ + σ·ε_i, each denoised in one step with a gradient, and
    the n rewards are averaged."""

    method: ClassVar[str] = "draft"

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        reward: DifferentiableReward,
        k: PositiveInt = 1,
        lv_copies: int = 0,
        reward_scale: PositiveFloat = 1.0,
        checkpoint: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(
            pipeline=pipeline,
            reward=reward,
            reward_scale=reward_scale,
            checkpoint=checkpoint,
            seed=seed,
        )
        require(k >= 1, "algorithm.k (steps with a gradient) must be >= 1")
        require(lv_copies >= 0, "algorithm.lv_copies must be >= 0 (0: DRaFT-K, n: DRaFT-LV)")
        require(
            lv_copies == 0 or k == 1,
            f"DRaFT-LV (lv_copies={lv_copies}) re-noises the final sample to the last step: "
            "set algorithm.k=1 or lv_copies=0",
        )
        self.k = int(k)
        self.lv_copies = int(lv_copies)

    def denoised(
        self, conditions: Conditions, segment: LatentSegment
    ) -> tuple[Tensor, dict[str, Tensor]]:
        steps = segment.sigmas.numel() - 1
        require(self.k <= steps, f"algorithm.k={self.k} exceeds the {steps} sampling steps")
        if self.lv_copies:
            return self._low_variance(conditions, segment), _steps_term(self.lv_copies)
        first = steps - self.k
        x = stored_input(segment, first)
        x0 = self.chain(conditions, segment, x, first, range(first, steps))
        return x0, _steps_term(self.k)

    def _low_variance(self, conditions: Conditions, segment: LatentSegment) -> Tensor:
        if segment.final_latents is None:
            raise ValueError("DRaFT-LV needs the rollout's final latents (segment.final_latents)")
        x0 = segment.final_latents.detach().float()  # data: re-noised, no gradient back
        n, copies = x0.shape[0], self.lv_copies
        sigma = float(segment.sigmas[-2])
        gen = _generator(self.seed, self.rollout_index, self._calls)
        eps = torch.randn((copies, *x0.shape), generator=gen).to(x0.device)
        noised = ((1.0 - sigma) * x0.unsqueeze(0) + sigma * eps).reshape(copies * n, *x0.shape[1:])
        cond = type(conditions).concat([conditions] * copies)
        sigmas = torch.tensor([sigma, 0.0], device=x0.device)
        fwd = forward_conditions(self.pipeline, cond, segment.guidance_scale)
        return euler_chain(
            self.pipeline,
            fwd,
            noised,
            sigmas,
            segment.guidance_scale,
            grad_steps={0},
            checkpoint=self.checkpoint,
        )


class AlignProp(RewardGradientLoss):
    """AlignProp (Prabhudesai et al. 2023): back-propagation through the last K steps with
    K ~ U{1 … ``max_steps``} drawn per rollout (randomized truncation; ``max_steps`` null: all
    T steps), every step gradient-checkpointed. Needs every step's input stored
    (``sde_steps: {_target_: unirl.sde.AllSteps, exclude_last: false}``)."""

    method: ClassVar[str] = "alignprop"

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        reward: DifferentiableReward,
        max_steps: PositiveInt | None = None,
        reward_scale: PositiveFloat = 1.0,
        checkpoint: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(
            pipeline=pipeline,
            reward=reward,
            reward_scale=reward_scale,
            checkpoint=checkpoint,
            seed=seed,
        )
        require(max_steps is None or max_steps >= 1, "algorithm.max_steps must be >= 1 or null")
        self.max_steps = max_steps

    def truncation(self, num_steps: int) -> int:
        """K of this rollout: uniform on 1 … min(max_steps, T)."""
        top = min(self.max_steps or num_steps, num_steps)
        return 1 + int(torch.randint(top, (1,), generator=self.rollout_generator()))

    def denoised(
        self, conditions: Conditions, segment: LatentSegment
    ) -> tuple[Tensor, dict[str, Tensor]]:
        steps = segment.sigmas.numel() - 1
        k = self.truncation(steps)
        first = steps - k
        x = stored_input(segment, first)
        return self.chain(conditions, segment, x, first, range(first, steps)), _steps_term(k)


class DRTune(RewardGradientLoss):
    """DR-Tune (Wu et al. 2024, "Deep Reward Supervision for Tuning Text-to-Image Diffusion
    Models"): the whole chain from x_T with a stop-gradient on every denoiser input, and a
    weight gradient at ``num_trained`` equally spaced steps only (stride ⌊T/M⌋, offset drawn
    per rollout). The Euler skip path carries dL/dx₀ unchanged to every trained step and to
    the input noise. Needs x_T stored (step 0; ``AllSteps`` stores it)."""

    method: ClassVar[str] = "drtune"

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        reward: DifferentiableReward,
        num_trained: PositiveInt = 2,
        reward_scale: PositiveFloat = 1.0,
        checkpoint: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(
            pipeline=pipeline,
            reward=reward,
            reward_scale=reward_scale,
            checkpoint=checkpoint,
            seed=seed,
        )
        require(num_trained >= 1, "algorithm.num_trained must be >= 1")
        self.num_trained = int(num_trained)

    def trained_steps(self, num_steps: int) -> list[int]:
        """The M equally spaced steps of this rollout: offset + i·⌊T/M⌋, i < M."""
        require(
            self.num_trained <= num_steps,
            f"algorithm.num_trained={self.num_trained} exceeds the {num_steps} sampling steps",
        )
        stride = num_steps // self.num_trained
        offset = int(torch.randint(stride, (1,), generator=self.rollout_generator()))
        return [offset + i * stride for i in range(self.num_trained)]

    def denoised(
        self, conditions: Conditions, segment: LatentSegment
    ) -> tuple[Tensor, dict[str, Tensor]]:
        steps = segment.sigmas.numel() - 1
        trained = self.trained_steps(steps)
        x_T = stored_input(segment, 0)
        x0 = self.chain(conditions, segment, x_T, 0, trained, detach_inputs=True)
        return x0, _steps_term(len(trained))
