"""``ZImageCFG``: Z-Image's classifier-free guidance, with the pipeline's two knobs.

``ZImagePipeline`` guides as ``pred = pos + g·(pos − neg)`` on the transformer outputs and
negates the result into the scheduler's velocity. With UniRL's velocity ``v = −output`` and
the project-wide scale ``s`` (``sampling.guidance_scale``, the usual ``v_u + s·(v_c − v_u)``,
1 or 0 = off) this is ``v = v_c + (s − 1)·(v_c − v_u)``, computed in that form so it equals
the pipeline's bit for bit: **diffusers' ``guidance_scale`` is ``s − 1``** (its 0 = off).

- Forwards: the conditional and negative rows run as one batched forward (``[cond; uncond]``,
  the pipeline's order; their captions may differ in length, the transformer pads them and
  masks the padding). ``split_uneven`` (``bundle.cfg_split_uneven``) runs them as two
  forwards instead when their captions pad to different lengths, so neither needs the mask:
  equal up to float rounding (the unmasked attention sums fewer terms), not bit for bit. On
  CUDA a compiled block with the mask was specialized to the caption's length (one H200,
  ``docs/performance.md``, seventeenth session): every new prompt length compiled new
  graphs. The unmasked forwards keep ``compile_dynamic``'s symbolic shapes.
- ``normalization`` k > 0 (the pipeline's ``cfg_normalization``): when a sample's guided
  velocity is longer than k times its conditional velocity (norms over the whole latent), it
  is scaled down to that length.
- ``truncation`` τ < 1 (the pipeline's ``cfg_truncation``): at a step whose ``1 − σ``
  exceeds τ the guidance is off — one conditional forward, ``v = v_c``. Deciding it reads σ
  on the host (one device sync per step, only when τ < 1). Within a replayed micro-batch
  whose rows sit at different steps, truncated rows take ``v_c`` of the guided forward.

Everything else (``cfg_gradient``, a reused ``v_uncond``, ``uncond_out``) follows
:class:`unirl.models.common.guidance.Guidance`, through the same ``guided_branches`` as
``BatchedCFG`` (only the row order of the batched forward differs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from unirl.models.common.guidance import (
    CFGFamily,
    CFGGradient,
    VelocityModel,
    guided,
    guided_branches,
    positive_rows,
    require_paired,
)
from unirl.models.z_image.conditions import ZImageConditions
from unirl.types import Conditions

# ZImagePipeline's timestep scale: the truncation test reads ``(1000 - t) / 1000`` with
# ``t = σ·1000`` (its scheduler's num_train_timesteps, 1000 for every Z-Image checkpoint).
TIMESTEP_SCALE = 1000.0


@dataclass(frozen=True)
class CFGInputs:
    """What the guided forwards consume: the prompt rows, the negative rows, and both in one
    batch (``[cond; uncond]``, built once per loop for the batched forward); ``split``: run
    the two as their own forwards instead of ``both`` (``ZImageCFG.split_uneven``)."""

    cond: Conditions
    uncond: Conditions
    both: Conditions
    split: bool = False


def _uneven(rows: Conditions) -> bool:
    """Whether the captions of ``rows`` pad to different lengths, so that one batched forward
    needs an attention mask (host values only)."""
    padded = cast(ZImageConditions, rows).padded_lengths()
    return bool((padded != padded[0]).any())


def _rows_view(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return rows.to(like.device).view(-1, *([1] * (like.ndim - 1)))


@dataclass(frozen=True)
class ZImageCFG:
    """Z-Image's CFG (see the module docstring); ``normalization`` 0 and ``truncation`` 1 are
    the pipeline's defaults (both off)."""

    normalization: float = 0.0
    truncation: float = 1.0
    split_uneven: bool = False

    def forward_conditions(
        self, family: CFGFamily, conditions: Conditions, scale: float
    ) -> Conditions | CFGInputs:
        if not guided(scale):
            return positive_rows(conditions)
        paired = require_paired("ZImageCFG", conditions)
        cond, uncond = paired.positive(), paired.negative()
        both = type(cond).concat([cond, uncond])
        return CFGInputs(
            cond=cond, uncond=uncond, both=both, split=self.split_uneven and _uneven(both)
        )

    def guided_rows(self, sigma: torch.Tensor) -> torch.Tensor | None:
        """``bool[N]`` (host): the rows guided at ``sigma[N]``; None when every row is (no
        truncation, nothing read). The pipeline's test, in its float32 / float64 order."""
        if self.truncation >= 1.0:
            return None
        t = sigma.detach().to("cpu", torch.float32) * TIMESTEP_SCALE
        t_norm = ((TIMESTEP_SCALE - t) / TIMESTEP_SCALE).tolist()
        return torch.tensor([value <= self.truncation for value in t_norm], dtype=torch.bool)

    def combine(self, v_cond: torch.Tensor, v_uncond: torch.Tensor, scale: float) -> torch.Tensor:
        """``v_c + (s − 1)·(v_c − v_u)``, then the norm cap when ``normalization`` > 0."""
        v = v_cond + (scale - 1.0) * (v_cond - v_uncond)
        if self.normalization > 0.0:
            dims = tuple(range(1, v.ndim))
            cap = torch.linalg.vector_norm(v_cond, dim=dims, keepdim=True) * self.normalization
            norm = torch.linalg.vector_norm(v, dim=dims, keepdim=True)
            v = torch.where(norm > cap, v * (cap / norm), v)
        return v

    def velocity(
        self,
        family: VelocityModel,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        fwd_conditions: object,
        scale: float,
        *,
        cfg_gradient: CFGGradient = "both",
        v_uncond: torch.Tensor | None = None,
        uncond_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if not guided(scale):
            positive = cast(Conditions, fwd_conditions)  # forward_conditions' positive rows
            return family.predict_velocity(latents, sigma, positive).float()
        inputs = cast(CFGInputs, fwd_conditions)  # what forward_conditions returned guided
        rows = self.guided_rows(sigma)
        if rows is not None and not bool(rows.any()):  # truncated: the conditional forward
            v_c = family.predict_velocity(latents, sigma, inputs.cond).float()
            if uncond_out is not None:  # a defined value for the record (never combined)
                uncond_out.append(torch.zeros_like(v_c))
            return v_c
        v_c, v_u = guided_branches(
            family,
            latents,
            sigma,
            halves=lambda: (inputs.cond, inputs.uncond),
            both=inputs.both,
            uncond_first=False,  # the pipeline's [cond; uncond]
            cfg_gradient=cfg_gradient,
            v_uncond=v_uncond,
            uncond_out=uncond_out,
            batched=not inputs.split,
        )
        if rows is None:
            return self.combine(v_c, v_u, scale)
        keep = _rows_view(rows, v_c)  # mixed rows (replay): truncated ones are v_c exactly
        v = self.combine(v_c, torch.where(keep, v_u, v_c), scale)
        return torch.where(keep, v, v_c)
