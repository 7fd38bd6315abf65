"""DiffusionNFT: likelihood-free RL on the forward process (docs/math.md, "DiffusionNFT").

Rollout with a frozen "old" LoRA adapter and the deterministic ODE sampler; keep the clean
latents x₀ and the rewards. Training re-noises x₀ and regresses the x₀-prediction of two
implicit policies built from the trained velocity v_θ and the old one v_old:

    r  = ½ + ½·clip(A / c, −1, 1)                         (c = adv_clip_max)
    x_t = (1 − t)·x₀ + t·ε
    v⁺ = β·v_θ + (1 − β)·v_old,     v⁻ = (1 + β)·v_old − β·v_θ
    x̂₀^± = x_t − t·v^±,             w^± = clamp(mean|x̂₀^± − x₀|, 1e-5)   (no gradient)
    L  = mean_i [ r·‖x̂₀⁺ − x₀‖²/w⁺ + (1 − r)·‖x̂₀⁻ − x₀‖²/w⁻ ] · (c / β)

(‖·‖² is a mean over C·H·W, as every per-sample quantity in this package). After the
optimizer step of a rollout the old adapter moves toward the trained one by an EMA whose
decay follows :class:`OldAdapterEMA`.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

import torch
from torch import Tensor

from unirl.algorithms.base import StageAlgorithm, StepResult, TrainBackend
from unirl.algorithms.kl import KLConfig, kl_metrics
from unirl.algorithms.replay import ReplayPipeline
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat, PositiveInt
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import Conditions, LatentSegment

WEIGHT_FLOOR = 1e-5  # the clamp of the adaptive weights w^±


# --------------------------------------------------------------------------- the pure loss


class NFTTerms(NamedTuple):
    """``loss`` (0-d, with gradient) and per-sample detached terms, all ``[B]``:
    ``positive`` = ‖x̂₀⁺ − x₀‖²/w⁺, ``negative`` = ‖x̂₀⁻ − x₀‖²/w⁻, the weights ``weight_pos``
    and ``weight_neg`` (after the clamp) and the optimality probability ``r``."""

    loss: Tensor
    positive: Tensor
    negative: Tensor
    weight_pos: Tensor
    weight_neg: Tensor
    r: Tensor


def nft_loss(
    v_theta: Tensor,
    v_old: Tensor,
    x_t: Tensor,
    x0: Tensor,
    t: Tensor,
    adv: Tensor,
    beta: float,
    adv_clip_max: float,
) -> NFTTerms:
    """The DiffusionNFT loss of ``B`` samples at one training time each.

    ``v_theta``, ``v_old``, ``x_t``, ``x0``: ``[B, ...]``; ``t``, ``adv``: ``[B]``. Gradient
    flows through ``v_theta`` only (``v_old`` and the weights are detached). Computed in fp32
    (fp64 for fp64 inputs).
    """
    dtype = torch.promote_types(v_theta.dtype, torch.float32)
    v, v_o = v_theta.to(dtype), v_old.to(dtype).detach()
    x_t, x0 = x_t.to(dtype), x0.to(dtype)
    tb = t.to(dtype).reshape(-1, *([1] * (x0.ndim - 1)))
    r = 0.5 + 0.5 * torch.clamp(adv.to(dtype) / adv_clip_max, -1.0, 1.0)

    def weighted_error(velocity: Tensor) -> tuple[Tensor, Tensor]:
        err = (x_t - tb * velocity) - x0  # x̂₀ − x₀
        flat = err.reshape(err.shape[0], -1)
        with torch.no_grad():
            weight = flat.abs().mean(dim=1).clamp(min=WEIGHT_FLOOR)
        return flat.square().mean(dim=1) / weight, weight

    positive, w_pos = weighted_error(beta * v + (1.0 - beta) * v_o)
    negative, w_neg = weighted_error((1.0 + beta) * v_o - beta * v)
    per_sample = r * positive + (1.0 - r) * negative
    loss = per_sample.mean() * (adv_clip_max / beta)
    return NFTTerms(loss, positive.detach(), negative.detach(), w_pos, w_neg, r.detach())


# --------------------------------------------------------------------------- the old adapter


@dataclass(kw_only=True)
class OldAdapterEMA:
    """Decay of ``old ← d·old + (1 − d)·trained`` after rollout ``i`` (``d = 0`` copies).

    - ``copy``: d = 0 every rollout (the old adapter is the policy just trained).
    - ``linear``: d = 0 for ``i < delay_rollouts``, then ramps from ``start`` to ``end`` over
      ``ramp_rollouts`` rollouts and stays at ``end``. The DiffusionNFT code's schedules are
      ``start=0, end=0.5, ramp_rollouts=500`` (its type 1) and ``delay_rollouts=75, start=0,
      end=0.999, ramp_rollouts=133`` (its type 2, used for OCR), counted in optimizer steps
      there and in rollouts here.
    - ``warmup``: d = 0 for ``i < delay_rollouts``, then the constant ``end``.

    ``kind`` picks one of the three.
    """

    kind: Literal["copy", "linear", "warmup"] = "linear"
    start: float = 0.0
    end: float = 0.5
    ramp_rollouts: int = 500
    delay_rollouts: int = 0

    def __post_init__(self) -> None:
        require(
            self.kind in ("copy", "linear", "warmup"),
            f"algorithm.ema.kind must be copy, linear or warmup, got {self.kind!r}",
        )
        require(0.0 <= self.start < 1.0, f"algorithm.ema.start must be in [0, 1), got {self.start}")
        require(0.0 <= self.end < 1.0, f"algorithm.ema.end must be in [0, 1), got {self.end}")
        require(self.ramp_rollouts >= 1, "algorithm.ema.ramp_rollouts must be >= 1")
        require(self.delay_rollouts >= 0, "algorithm.ema.delay_rollouts must be >= 0")

    def decay(self, rollout_index: int) -> float:
        """The decay applied after the optimizer step(s) of rollout ``rollout_index``."""
        if self.kind == "copy" or rollout_index < self.delay_rollouts:
            return 0.0
        if self.kind == "warmup":
            return float(self.end)
        frac = min((rollout_index - self.delay_rollouts) / self.ramp_rollouts, 1.0)
        return float(self.start + (self.end - self.start) * frac)


def _as_ema(value: OldAdapterEMA | Mapping[str, Any] | str) -> OldAdapterEMA:
    if isinstance(value, OldAdapterEMA):
        return value
    if isinstance(value, str):
        return OldAdapterEMA(kind=value)  # type: ignore[arg-type]
    require(
        isinstance(value, Mapping),
        f"algorithm.ema must be an OldAdapterEMA block, a mapping of its fields or a kind name, "
        f"got {type(value).__name__}",
    )
    return OldAdapterEMA(**{str(k): v for k, v in value.items() if k != "_target_"})


# --------------------------------------------------------------------------- seeded draws


def latent_digest(x0: Tensor) -> list[int]:
    """A 64-bit digest of each row of ``x0[B, ...]`` (its fp32 bytes on the host).

    The loss node is handed conditions, segment and advantages, not sample ids; the clean
    latent is a deterministic function of (sample id, seed, old weights, prompt), so its
    digest names the sample independently of shuffling, micro-batching and resume.
    """
    rows = x0.detach().to("cpu", torch.float32).contiguous().reshape(x0.shape[0], -1)
    return [
        int.from_bytes(hashlib.blake2b(row.numpy().tobytes(), digest_size=8).digest(), "little")
        for row in rows
    ]


def draw_training_noise(
    x0: Tensor,
    *,
    seed: int,
    rollout_index: int,
    num_train_timesteps: int,
    num_schedule_steps: int | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(ε[B, K, ...], u[B, K], slots[B, K] | None)`` in fp32 / int64 on the host.

    One generator per sample, seeded by (seed, rollout index, digest of x₀); it draws, in
    this order, ``u ~ U[0, 1)`` (uniform training times), then, when ``num_schedule_steps``
    T is given, ``slots = randperm(T)[:K]`` (K distinct steps of the rollout's schedule),
    then ε ~ N(0, I).
    """
    k = num_train_timesteps
    if num_schedule_steps is not None and k > num_schedule_steps:
        raise ValueError(f"cannot draw {k} distinct steps of a {num_schedule_steps}-step schedule")
    eps, times, slots = [], [], []
    for key in latent_digest(x0):
        packed = struct.pack("<qqQ", int(seed), int(rollout_index), key)
        gen_seed = int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little")
        gen = torch.Generator().manual_seed(gen_seed & ((1 << 63) - 1))
        times.append(torch.rand(k, generator=gen, dtype=torch.float32))
        if num_schedule_steps is not None:
            slots.append(torch.randperm(num_schedule_steps, generator=gen)[:k])
        eps.append(torch.randn((k, *x0.shape[1:]), generator=gen, dtype=torch.float32))
    return torch.stack(eps), torch.stack(times), torch.stack(slots) if slots else None


# --------------------------------------------------------------------------- the loss node


class DiffusionNFT(StageAlgorithm[LatentSegment]):
    """DiffusionNFT with a trained LoRA adapter and a frozen "old" copy on the same module.

    Train rollouts sample with ``old_adapter`` (:meth:`sampling_adapter`; the trainer's
    ``TrainOps`` switches it in around sampling); eval rollouts use the trained adapter (or
    its EMA). The backend must
    hold the old adapter (``backend.lora.extra_adapters=[old]``), and the pipeline's strategy
    must be ``unirl.sde.ODE``: the trainer records no SDE steps for a likelihood-free loss.

    Training times (K = ``num_train_timesteps`` per sample): ``timestep_sampling="schedule"``
    takes K distinct σ of the rollout's own schedule, a random subset per sample (the
    DiffusionNFT code permutes the T sampler timesteps per sample and trains the first
    K = int(0.99·T)); ``"uniform"`` draws K times from U(t_min, t_max). ε and the times are
    seeded by (``seed``, rollout index, digest of x₀: :func:`latent_digest`), so shuffling,
    micro-batching and resuming do not change them. One forward + backward per training
    time keeps memory flat.

    Guidance: the loss trains the *conditional* velocity only (the track's prompt rows, no
    CFG), as DiffusionNFT does — its models sample CFG-free (guidance 1). A rollout with
    guidance > 1 still works (x₀ then comes from CFG sampling) but is not the paper's setup.

    ``beta``: β of the implicit policies v± (module docstring; the loss is scaled by c / β);
    ``adv_clip_max``: c, the advantage at which the positive weight r saturates at 1;
    ``t_min`` / ``t_max``: the range of ``timestep_sampling="uniform"``; ``ema``: how the old
    adapter follows the trained one after each rollout (an :class:`OldAdapterEMA` block or
    just its ``kind``).

    ``kl.beta > 0`` (``kl``: a :class:`~unirl.algorithms.kl.KLConfig`) adds
    ``β · mean ‖v_θ − v_ref‖²`` (v_ref: the base model, all adapters disabled, no gradient);
    β is fixed (``kl.control="fixed"``, β = ``kl.beta``) or starts at ``kl.beta`` and follows
    ``kl.target`` (``"adaptive"``, see :mod:`unirl.algorithms.kl`; the target is in the units
    of that velocity distance, not of a Gaussian KL).
    """

    supports_multi_update: ClassVar[bool] = False
    requires_log_prob: ClassVar[bool] = False
    requires_ema_rollout: ClassVar[bool] = True

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        beta: PositiveFloat = 1.0,
        adv_clip_max: PositiveFloat = 5.0,
        num_train_timesteps: PositiveInt = 9,
        timestep_sampling: Literal["schedule", "uniform"] = "schedule",
        t_min: float = 0.0,
        t_max: float = 1.0,
        old_adapter: str = "old",
        ema: OldAdapterEMA | Mapping[str, object] | str = "linear",
        kl: KLConfig | Mapping[str, object] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(kl=kl)
        require(beta > 0, f"algorithm.beta must be > 0 (the loss is scaled by c/β), got {beta}")
        require(adv_clip_max > 0, f"algorithm.adv_clip_max must be > 0, got {adv_clip_max}")
        require(num_train_timesteps >= 1, "algorithm.num_train_timesteps must be >= 1")
        require(
            timestep_sampling in ("schedule", "uniform"),
            f"algorithm.timestep_sampling must be 'schedule' or 'uniform', got {timestep_sampling!r}",
        )
        require(
            0.0 <= t_min < t_max <= 1.0,
            f"algorithm.t_min/t_max must satisfy 0 <= t_min < t_max <= 1, got {t_min}, {t_max}",
        )
        require(bool(old_adapter), "algorithm.old_adapter must name the frozen adapter (e.g. old)")
        strategy = getattr(pipeline, "strategy", None)
        require(
            getattr(strategy, "name", None) == "ode",
            f"DiffusionNFT rolls out with the deterministic ODE sampler, but pipeline.strategy is "
            f"{type(strategy).__name__}; set pipeline.strategy._target_=unirl.sde.ODE",
        )
        self.pipeline = pipeline
        self.beta = float(beta)
        self.adv_clip_max = float(adv_clip_max)
        self.num_train_timesteps = int(num_train_timesteps)
        self.timestep_sampling = timestep_sampling
        self.t_min, self.t_max = float(t_min), float(t_max)
        self.old_adapter = old_adapter
        self.ema = _as_ema(ema)
        self.seed = int(seed)
        self.trained_adapter = "default"
        self.rollout_index: int | None = None

    # -- wiring ---------------------------------------------------------------------------------

    def bind_backend(self, backend: TrainBackend) -> None:
        """Check the backend holds the trained and the old adapter; bind the reference."""
        require(
            getattr(backend, "has_lora", False),
            "DiffusionNFT needs LoRA: a trained adapter and a frozen 'old' copy on one module; "
            f"set backend.lora and backend.lora.extra_adapters=[{self.old_adapter}]",
        )
        super().bind_backend(backend)
        lora = backend.lora
        assert lora is not None  # has_lora, required above
        self.trained_adapter = str(lora.adapter_name)
        present = list(backend.adapters)
        require(
            self.old_adapter != self.trained_adapter,
            f"algorithm.old_adapter={self.old_adapter!r} is the trained adapter; name the frozen copy",
        )
        require(
            self.old_adapter in present,
            f"DiffusionNFT rolls out with the frozen adapter {self.old_adapter!r}, which the backend "
            f"does not have (adapters: {present}); set backend.lora.extra_adapters=[{self.old_adapter}]",
        )

    def _require_backend(self) -> TrainBackend:
        if self.backend is None:
            raise RuntimeError(
                "DiffusionNFT has no backend; the train stack binds it (bind_backend) before use"
            )
        return self.backend

    def _adapter(self, name: str) -> AbstractContextManager[None]:
        return self._require_backend().set_active_adapter(name)

    # -- loop hooks -----------------------------------------------------------------------------

    def sampling_adapter(self, mode: str) -> str | None:
        """Train rollouts sample with the old adapter; eval ones with the trained one."""
        return self.old_adapter if mode == "train" else None

    def start_rollout(self, rollout_index: int) -> None:
        self.rollout_index = int(rollout_index)

    @distributed(dispatch=Dispatch.BROADCAST)  # see base.py
    def after_train(self, rollout_index: int) -> dict[str, float]:
        """``old ← d·old + (1 − d)·trained`` with d from the EMA schedule; then the KL
        controller's rollout update (:meth:`StageAlgorithm.kl_after_train`)."""
        decay = self.ema.decay(int(rollout_index))
        self._require_backend().sync_adapter(
            self.old_adapter, src=self.trained_adapter, decay=decay
        )
        return {"nft/old_decay": decay, **self.kl_after_train()}

    # -- the loss -------------------------------------------------------------------------------

    def training_times(self, segment: LatentSegment) -> tuple[Tensor, Tensor]:
        """``(t[B, K], ε[B, K, ...])`` (fp32, host) for this micro-batch."""
        if segment.final_latents is None:
            raise ValueError("DiffusionNFT needs segment.final_latents (the rollout's clean x₀)")
        if self.rollout_index is None:
            raise RuntimeError(
                "DiffusionNFT: no rollout index; the train stack calls "
                "algorithm.start_rollout(index) before training (it seeds the noise)"
            )
        schedule = self.timestep_sampling == "schedule"
        steps = segment.sigmas.numel() - 1
        if schedule and self.num_train_timesteps > steps:
            raise ValueError(
                f"algorithm.num_train_timesteps={self.num_train_timesteps} exceeds the rollout's "
                f"{steps} steps (timestep_sampling=schedule); lower it or use uniform"
            )
        eps, u, slots = draw_training_noise(
            segment.final_latents,
            seed=self.seed,
            rollout_index=self.rollout_index,
            num_train_timesteps=self.num_train_timesteps,
            num_schedule_steps=steps if schedule else None,
        )
        if slots is not None:
            return segment.sigmas.float().cpu()[slots], eps
        return self.t_min + (self.t_max - self.t_min) * u, eps

    def compute_loss_and_backward(
        self,
        conditions: Conditions,
        segment: LatentSegment,
        advantages: Tensor,
        loss_scale: float,
    ) -> StepResult:
        times, noise = self.training_times(segment)
        assert segment.final_latents is not None
        x0 = segment.final_latents.float()
        device = x0.device
        adv = advantages.float().to(device)
        k_total = self.num_train_timesteps
        parts: dict[str, list[Tensor]] = {
            k: []
            for k in (
                "positive",
                "negative",
                "weight_pos",
                "weight_neg",
                "r",
                "t",
                "policy_loss",
                "kl",
            )
        }
        total: Tensor | float = 0.0
        control = self.kl_controller
        for k in range(k_total):
            t = times[:, k].to(device)
            tb = t.view(-1, *([1] * (x0.ndim - 1)))
            x_t = (1.0 - tb) * x0 + tb * noise[:, k].to(device)
            with torch.no_grad(), self._adapter(self.old_adapter):
                v_old = self.pipeline.predict_velocity(x_t, t, conditions).float()
            if control.enabled:
                with torch.no_grad(), self.reference():
                    v_ref = self.pipeline.predict_velocity(x_t, t, conditions).float()
            with self._adapter(self.trained_adapter):  # backward inside: recompute sees it too
                v_theta = self.pipeline.predict_velocity(x_t, t, conditions).float()
                out = nft_loss(v_theta, v_old, x_t, x0, t, adv, self.beta, self.adv_clip_max)
                loss = out.loss
                if control.enabled:
                    kl = (v_theta - v_ref).square().reshape(len(x0), -1).mean(dim=1)
                    loss = loss + control.beta * kl.mean()
                    parts["kl"].append(kl.detach())
                    control.observe(kl)
                (loss * (loss_scale / k_total)).backward()
            total = total + loss.detach() / k_total
            parts["positive"].append(out.positive)
            parts["negative"].append(out.negative)
            parts["weight_pos"].append(out.weight_pos)
            parts["weight_neg"].append(out.weight_neg)
            parts["r"].append(out.r)
            parts["t"].append(t.detach().float())
            parts["policy_loss"].append(out.loss.detach().reshape(1))
        terms = {k: torch.cat(v) for k, v in parts.items() if v}
        if parts["kl"]:
            terms["kl_steps"] = torch.stack(parts["kl"], dim=1)  # [B, K]: per training time
        return StepResult(loss=total * loss_scale, terms=terms)

    def summarize(self, terms: dict[str, Tensor]) -> dict[str, float]:
        """``policy_loss``; ``nft/positive_loss``, ``nft/negative_loss`` (means of
        ‖x̂₀^± − x₀‖²/w^±); ``nft/weight_{pos,neg}/{mean,min,max}`` and
        ``nft/weight_clamped`` (fraction of weights held at the 1e-5 floor); ``nft/r_mean``,
        ``nft/t_mean``; with ``kl.beta > 0``: ``kl_loss``, ``kl/max``, ``kl/step_<k>`` (k: the
        k-th training time of each sample, a random σ, not a fixed schedule step), ``kl/beta``."""
        out = {
            "policy_loss": float(terms["policy_loss"].float().mean()),
            "nft/positive_loss": float(terms["positive"].float().mean()),
            "nft/negative_loss": float(terms["negative"].float().mean()),
            "nft/r_mean": float(terms["r"].float().mean()),
            "nft/t_mean": float(terms["t"].float().mean()),
        }
        clamped = []
        for side in ("pos", "neg"):
            w = terms[f"weight_{side}"].float()
            out[f"nft/weight_{side}/mean"] = float(w.mean())
            out[f"nft/weight_{side}/min"] = float(w.min())
            out[f"nft/weight_{side}/max"] = float(w.max())
            clamped.append(w <= WEIGHT_FLOOR)
        out["nft/weight_clamped"] = float(torch.cat(clamped).float().mean())
        out.update(kl_metrics(terms, self.kl_controller.beta))
        return out
