"""Pure tensor-level loss functions shared by the algorithm classes (formulas: docs/math.md).

Nothing here knows about pipelines, segments or backward passes: every function maps tensors
to tensors, so each one is tested against an independent float64 implementation. Shapes are
elementwise-broadcast unless stated: a "term" is one (sample, SDE step) of a diffusion
trajectory or one token of a text sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# --------------------------------------------------------------------------- GRPO / PPO clip
def clipped_surrogate(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """PPO's pessimistic surrogate per term: ``max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))``."""
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(-adv * ratio, -adv * clipped)


def grpo_clip_loss(
    log_prob: Tensor, old_log_prob: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """Per-term clipped GRPO loss. ``r = exp(log p − log p_old)``; ``clip_high > clip_low`` is
    DAPO's clip-higher. Returns ``(loss_terms, ratio)``, both shaped like ``log_prob``."""
    ratio = torch.exp(log_prob - old_log_prob)
    return clipped_surrogate(ratio, adv, clip_low, clip_high), ratio


# --------------------------------------------------------------------------- Gaussian step KL
def gaussian_mean_kl(mean_new: Tensor, mean_old: Tensor, std: Tensor) -> Tensor:
    """``D[B] = mean over non-batch elements of (μ_new − μ_old)² / (2σ²)``: the exact KL per
    element between two Gaussians of equal std ``std[B]`` (fp32, or fp64 for fp64 inputs)."""
    dtype = torch.promote_types(mean_new.dtype, torch.float32)
    diff = (mean_new.to(dtype) - mean_old.to(dtype)).reshape(mean_new.shape[0], -1)
    return diff.square().mean(dim=1) / (2.0 * std.to(dtype).square())


# --------------------------------------------------------------------------- Flow-DPPO
class DPPOTerms(NamedTuple):
    """``loss`` (0-d), and per-term ``ratio``, ``kl`` (= D), ``keep`` (bool), ``over``
    (D ≥ τ) and ``directional`` (the ratio moves with the advantage); all detached but ``loss``."""

    loss: Tensor
    ratio: Tensor
    kl: Tensor
    keep: Tensor
    over: Tensor
    directional: Tensor


def flow_dppo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    adv: Tensor,
    mean_new: Tensor,
    mean_old: Tensor,
    std: Tensor,
    threshold: float,
) -> DPPOTerms:
    """Flow-DPPO's KL-masked objective over ``B`` terms (``log_prob[B]``, ``mean_*[B, ...]``,
    ``std[B]`` = σ_t of the step).

    D = mean (μ_new − μ_old)² / (2σ_t²); a term is dropped when D ≥ τ and the ratio moves in
    the advantage's direction ((r > 1 ∧ A > 0) ∨ (r < 1 ∧ A < 0)). The loss is the mean of
    −A·r over the kept terms. Dropped terms pass exactly zero gradient: their log-ratio is
    replaced by 0 *before* the exponential (a ``where`` after ``exp`` would give 0·inf = NaN
    in backward for an overflowing ratio). With every term dropped the loss is a 0 that is
    still connected to the graph (its gradient is zero, ``backward()`` works).
    """
    log_ratio = log_prob - old_log_prob
    adv = adv.to(log_ratio.dtype).expand_as(log_ratio)
    with torch.no_grad():
        kl = gaussian_mean_kl(mean_new, mean_old, std)
        lr = log_ratio.detach()
        directional = ((lr > 0) & (adv > 0)) | ((lr < 0) & (adv < 0))
        over = kl >= threshold
        keep = ~(over & directional)
    safe_log_ratio = torch.where(keep, log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(safe_log_ratio)
    terms = torch.where(keep, -adv * ratio, torch.zeros_like(ratio))
    count = keep.sum().clamp_min(1).to(terms.dtype)
    loss = terms.sum() / count
    return DPPOTerms(
        loss=loss,
        ratio=torch.exp(lr),
        kl=kl,
        keep=keep,
        over=over,
        directional=directional,
    )


# --------------------------------------------------------------------------- GRPO-Guard
def grpo_guard_log_ratio(
    log_prob: Tensor,
    old_log_prob: Tensor,
    mean_new: Tensor,
    mean_old: Tensor,
    std: Tensor,
) -> Tensor:
    """GRPO-Guard's RatioNorm (Wang et al. 2025, arXiv:2510.22319), per term ``[B]``.

    For a Gaussian step x' = μ_old + σ_t·z the mean-form log-ratio is
    ``log r = mean(z·Δμ)/σ_t − D`` with Δμ = μ_θ − μ_old and D = mean Δμ²/(2σ_t²): its mean is
    −D (the left shift) and its spread scales with 1/σ_t (step-inconsistent). RatioNorm
    re-centres and rescales::

        log r̃ = (log r + D) · σ_t        (σ_t = the step std, s·sqrt(−Δ) for FlowSDE)

    D keeps its gradient (it is a function of μ_θ), as in the paper. Needs the normalised
    Gaussian log-prob (the CPS ``reference`` form is in other units).
    """
    bias = gaussian_mean_kl(mean_new, mean_old, std)
    return (log_prob - old_log_prob + bias) * std.to(bias.dtype)


# --------------------------------------------------------------------------- DRPO
def drpo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    adv: Tensor,
    epsilon: float,
    token_adaptive: bool,
) -> tuple[Tensor, Tensor]:
    """DRPO per term: ``L = −A·r + |A|·w·(r − 1)²/(2ε)`` with ``w = p_old = exp(log p_old)``
    (detached) when ``token_adaptive`` else 1. The minimiser over r is r = 1 + ε·sign(A)/w, so
    ε plays PPO's clip range and rare tokens (small p_old) get a wider trust region.
    Returns ``(loss_terms, ratio)``."""
    ratio = torch.exp(log_prob - old_log_prob)
    weight = torch.exp(old_log_prob.detach()) if token_adaptive else torch.ones_like(ratio)
    terms = -adv * ratio + adv.abs() * weight * (ratio - 1.0).square() / (2.0 * epsilon)
    return terms, ratio


# --------------------------------------------------------------------------- KL to reference (AR)
def k3_kl(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(π_θ ‖ π_ref) per token: ``exp(q − p) − (q − p) − 1`` with
    p = log π_θ, q = log π_ref. Non-negative, unbiased for samples from π_θ."""
    delta = ref_log_prob - log_prob
    return torch.exp(delta) - delta - 1.0


# --------------------------------------------------------------------------- aggregation
def aggregate(
    loss_terms: Tensor, mask: Tensor, mode: str, *, norm_length: int | None = None
) -> Tensor:
    """Reduce ``loss_terms[B, L]`` over the tokens where ``mask[B, L]`` is true to a 0-d loss.

    - ``token-mean``: Σ m·ℓ / Σ m (every token of the batch weighs the same; DAPO).
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (GRPO).
      Sequences without a loss token are left out of the sequence mean.
    - ``seq-mean-token-sum-norm``: mean over sequences of Σ_t m·ℓ / ``norm_length``
      (Dr. GRPO: a constant divisor, e.g. the generation budget ``max_new_tokens``, so no
      length bias). ``norm_length`` is required for this mode.

    Masked positions pass zero gradient (selected with ``where``), and an all-empty mask gives
    a 0 that is still connected to the graph.
    """
    if loss_terms.shape != mask.shape or loss_terms.ndim != 2:
        raise ValueError(
            f"aggregate needs loss_terms and mask of the same [B, L] shape; got "
            f"{tuple(loss_terms.shape)} and {tuple(mask.shape)}"
        )
    m = mask.bool()
    masked = torch.where(m, loss_terms, torch.zeros_like(loss_terms))
    mf = m.to(loss_terms.dtype)
    if mode == "token-mean":
        return masked.sum() / mf.sum().clamp_min(1.0)
    if mode == "seq-mean-token-mean":
        counts = mf.sum(dim=1)
        per_seq = masked.sum(dim=1) / counts.clamp_min(1.0)
        present = (counts > 0).to(loss_terms.dtype)
        return (per_seq * present).sum() / present.sum().clamp_min(1.0)
    if mode == "seq-mean-token-sum-norm":
        if norm_length is None or norm_length <= 0:
            raise ValueError(
                "aggregate mode 'seq-mean-token-sum-norm' needs norm_length > 0 "
                "(the constant divisor, e.g. max_new_tokens)"
            )
        return (masked.sum(dim=1) / float(norm_length)).mean() if len(masked) else masked.sum()
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {list(LOSS_AGG_MODES)}")


def pad_packed(values: Tensor, offsets: Tensor, fill: float | bool = 0.0) -> Tensor:
    """``[T, ...]`` packed rows (``offsets[N + 1]``) to a padded ``[N, L_max, ...]`` tensor."""
    lengths = (offsets[1:] - offsets[:-1]).tolist()
    n, width = len(lengths), max(lengths, default=0)
    out = torch.full((n, width, *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
    if n and width:
        rows = torch.repeat_interleave(
            torch.arange(n, device=values.device), torch.as_tensor(lengths, device=values.device)
        )
        starts = offsets[:-1].to(values.device)
        cols = torch.arange(values.shape[0], device=values.device) - starts[rows]
        out[rows, cols] = values
    return out
