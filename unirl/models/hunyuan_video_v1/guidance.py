"""``EmbeddedGuidance``: HunyuanVideo 1.0's guidance-distilled conditioning.

HunyuanVideo 1.0 (as FLUX.1-dev) was distilled from classifier-free guidance: the guidance
scale is an input the transformer embeds beside the timestep (``guidance = g · 1000``), and
one conditional forward gives the guided velocity. So ``sampling.guidance_scale`` is that
embedded scale (diffusers' ``guidance_scale``, 6.0 by default), not a CFG combination; no
unconditional forward runs at any scale, in sampling or replay, so ``cfg_gradient`` has
nothing to choose (diffusers' optional ``true_cfg_scale`` on top is not offered).
"""

from __future__ import annotations

from dataclasses import dataclass

from unirl.models.common.guidance import CFGFamily, NoGuidance
from unirl.types import Conditions


@dataclass(frozen=True)
class EmbeddedGuidance(NoGuidance):
    """One conditional forward with the guidance scale written into the conditions (their
    ``with_guidance(scale)``), whatever the scale; the velocity call is ``NoGuidance``'s."""

    def forward_conditions(
        self, family: CFGFamily, conditions: Conditions, scale: float
    ) -> Conditions:
        return conditions.with_guidance(scale)  # type: ignore[attr-defined]
