"""Classifier-free guidance, owned by the family and applied identically in sampling and replay.

A guidance object turns a batch's conditions into what the velocity forwards consume
(:meth:`forward_conditions`, computed once per denoise loop or replayed micro-batch) and
combines the forwards into the one velocity the SDE kernel sees (:meth:`velocity`). Replay
goes through the same object, so whatever the guidance does to the velocity (the norm
rescale of Qwen-Image included) is part of the policy whose log-probs are recorded and
replayed. Three kinds (docs/math.md, *Classifier-free guidance*):

- :class:`BatchedCFG` (the default): ``[uncond; cond]`` rows in one forward,
  ``v = v_u + g·(v_c − v_u)``;
- :class:`SeparateCFG` (true CFG, as the FLUX.2 base pipelines run it): separate conditional
  and negative forwards, ``v = v_u + g·(v_c − v_u)``, no rescale;
- :class:`NormRescaledCFG` (Qwen-Image's "true CFG"): separate conditional and negative
  forwards (their text lengths differ), the same combination ``c``, then rescaled per token
  to the conditional norm, ``v = c·‖v_c‖ / ‖c‖`` with norms over the channel dimension;
- :class:`NoGuidance` (step-distilled models): one conditional forward; a scale above 1 is
  refused, since such a model was trained without an unconditional branch.

Guidance is off (one conditional forward) whenever the scale is at most 1. Every returned
velocity is fp32. ``cfg_gradient`` says which branches carry a gradient when autograd is on
(docs/math.md, *Classifier-free guidance in the training forward*): ``"both"`` (the undetached
form, ∇v = (1 − g)·∇v_u + g·∇v_c; batched CFG keeps its one ``[uncond; cond]`` forward) or
``"cond_only"`` (flow_grpo's form, ∇v = g·∇v_c: the unconditional rows run as their own
forward under ``torch.no_grad()``, so they hold no autograd state). The two differ in batch
geometry, so a replay that must agree bit for bit with another (the π_old anchor and the
trained step) uses the same ``cfg_gradient`` in both. ``v_uncond`` hands in the unconditional
velocity the rollout recorded (``uncond_out`` is how the sampler records it), skipping that
forward; the caller checks that the policy is still the one that computed it.

What ``forward_conditions`` returns is each kind's own form (rows, a ``(cond, uncond)`` pair,
Z-Image's ``CFGInputs``): the denoise loop holds it as an ``object`` and hands it back to the
same kind's ``velocity``, which casts it to that form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast, runtime_checkable

import torch

from unirl.types import Conditions

CFGGradient = Literal["cond_only", "both"]
CFG_GRADIENTS: tuple[CFGGradient, ...] = ("cond_only", "both")


class VelocityModel(Protocol):
    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor: ...


class CFGFamily(VelocityModel, Protocol):
    """A family batched CFG can guide: its velocity and its ``[uncond; cond]`` rows."""

    def cfg_conditions(self, conditions: Conditions) -> Conditions: ...


@runtime_checkable
class PairedConditions(Protocol):
    """Conditions that carry their negative rows beside the prompt rows."""

    def positive(self) -> Conditions: ...

    def negative(self) -> Conditions: ...


@runtime_checkable
class Guidance(Protocol):
    """How one family guides: the forward inputs, then the combined fp32 velocity."""

    def forward_conditions(self, family: CFGFamily, conditions: Conditions, scale: float) -> object:
        """What :meth:`velocity` consumes for ``conditions`` (N rows) at guidance ``scale``: the
        guidance's own form (rows, a ``(cond, uncond)`` pair, ...), which the denoise loop only
        hands back to :meth:`velocity`."""
        ...

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
        """fp32 ``v`` with the shape of ``latents[N, ...]`` at ``sigma[N]``; ``cfg_gradient``:
        which branches carry a gradient (see the module docstring). ``v_uncond[N, ...]``: an
        unconditional velocity to use instead of its forward (the rollout's, reused; implies
        ``cond_only``); ``uncond_out``: a list the computed unconditional velocity (fp32,
        detached) is appended to (the sampler records it)."""
        ...


def guided(scale: float) -> bool:
    """Whether guidance runs at ``scale`` (above 1; 0 and 1 both mean one plain forward)."""
    return scale > 1.0


def positive_rows(conditions: Conditions) -> Conditions:
    """The prompt rows of ``conditions`` (``conditions`` itself when it has no negative rows)."""
    return conditions.positive() if isinstance(conditions, PairedConditions) else conditions


def require_paired(guidance: str, conditions: Conditions) -> PairedConditions:
    """``conditions``, which the guidance named ``guidance`` needs with negative rows."""
    if not isinstance(conditions, PairedConditions):
        raise TypeError(
            f"{guidance} needs conditions with positive() / negative() rows, got "
            f"{type(conditions).__name__}"
        )
    return conditions


def guided_branches(
    family: VelocityModel,
    latents: torch.Tensor,
    sigma: torch.Tensor,
    *,
    halves: Callable[[], tuple[Conditions, Conditions]],
    both: Conditions,
    uncond_first: bool,
    cfg_gradient: CFGGradient,
    v_uncond: torch.Tensor | None,
    uncond_out: list[torch.Tensor] | None,
    batched: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(v_c, v_u)`` fp32 of a guided step whose two branches can run as one forward: ``both``
    holds 2·N rows (unconditional first when ``uncond_first``), ``halves()`` the
    ``(cond, uncond)`` rows apart. ``cond_only`` or a reused ``v_uncond``: the conditional
    forward alone carries a gradient (the unconditional one runs under ``torch.no_grad()``
    or is the rollout's, detached); ``both``: the one batched forward, or with ``batched``
    False the two halves' forwards, both with the gradient. The unconditional velocity is
    appended to ``uncond_out`` when given."""
    if not batched and cfg_gradient == "both" and v_uncond is None:
        cond, uncond = halves()
        v_u = family.predict_velocity(latents, sigma, uncond).float()
        v_c = family.predict_velocity(latents, sigma, cond).float()
    elif cfg_gradient == "cond_only" or v_uncond is not None:
        cond, uncond = halves()
        if v_uncond is None:
            with torch.no_grad():
                v_uncond = family.predict_velocity(latents, sigma, uncond)
        v_u = v_uncond.detach().float()
        v_c = family.predict_velocity(latents, sigma, cond).float()
    else:
        v = family.predict_velocity(torch.cat([latents, latents]), torch.cat([sigma, sigma]), both)
        first, second = v.float().chunk(2)
        v_u, v_c = (first, second) if uncond_first else (second, first)
    if uncond_out is not None:
        uncond_out.append(v_u.detach())
    return v_c, v_u


@dataclass(frozen=True)
class BatchedCFG:
    """``[uncond; cond]`` (2·N rows, built by ``family.cfg_conditions``) in one forward."""

    def forward_conditions(
        self, family: CFGFamily, conditions: Conditions, scale: float
    ) -> Conditions:
        return family.cfg_conditions(conditions) if guided(scale) else conditions

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
        rows = cast(Conditions, fwd_conditions)  # what forward_conditions returned
        if not guided(scale):
            return family.predict_velocity(latents, sigma, rows).float()
        n = latents.shape[0]

        def halves() -> tuple[Conditions, Conditions]:
            uncond, cond = rows.split([n, n])
            return cond, uncond

        v_c, v_u = guided_branches(
            family,
            latents,
            sigma,
            halves=halves,
            both=rows,
            uncond_first=True,
            cfg_gradient=cfg_gradient,
            v_uncond=v_uncond,
            uncond_out=uncond_out,
        )
        return v_u + scale * (v_c - v_u)


@dataclass(frozen=True)
class SeparateCFG:
    """True CFG: the conditional and the negative rows in two forwards (each with the row's
    own conditions, e.g. reference tokens), ``v = v_u + g·(v_c − v_u)`` (:meth:`combine`), no
    rescale: the FLUX.2 base pipelines' guidance. Its conditions must carry negative rows even
    when guidance is off (one conditional forward at a scale of at most 1)."""

    def forward_conditions(
        self, family: CFGFamily, conditions: Conditions, scale: float
    ) -> Conditions | tuple[Conditions, Conditions]:
        paired = require_paired(type(self).__name__, conditions)
        if not guided(scale):
            return paired.positive()
        return paired.positive(), paired.negative()

    def combine(self, v_cond: torch.Tensor, v_uncond: torch.Tensor, scale: float) -> torch.Tensor:
        """The guided velocity of the two fp32 forwards."""
        return v_uncond + scale * (v_cond - v_uncond)

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
            rows = cast(Conditions, fwd_conditions)  # forward_conditions' positive rows
            return family.predict_velocity(latents, sigma, rows).float()
        cond, uncond = cast(tuple[Conditions, Conditions], fwd_conditions)
        v_cond = family.predict_velocity(latents, sigma, cond).float()
        if v_uncond is None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and cfg_gradient == "both"):
                v_uncond = family.predict_velocity(latents, sigma, uncond)
        else:  # the rollout's, reused: no gradient through it
            v_uncond = v_uncond.detach()
        v_u = v_uncond.float()
        if uncond_out is not None:
            uncond_out.append(v_u.detach())
        return self.combine(v_cond, v_u, scale)


@dataclass(frozen=True)
class NormRescaledCFG(SeparateCFG):
    """:class:`SeparateCFG`'s two forwards and combination, then the per-token norm rescale.

    ``channel_dim`` is the dimension of the velocity holding one token's channels (the last
    one for packed latents ``[N, h, w, C·p²]``): the guided velocity of every token is scaled
    to the norm of its conditional velocity. Unlike :class:`SeparateCFG`, conditions without
    negative rows are accepted while guidance is off.
    """

    channel_dim: int = -1

    def forward_conditions(
        self, family: CFGFamily, conditions: Conditions, scale: float
    ) -> Conditions | tuple[Conditions, Conditions]:
        if not guided(scale):
            return positive_rows(conditions)
        return super().forward_conditions(family, conditions, scale)

    def combine(self, v_cond: torch.Tensor, v_uncond: torch.Tensor, scale: float) -> torch.Tensor:
        combined = super().combine(v_cond, v_uncond, scale)
        cond_norm = torch.norm(v_cond, dim=self.channel_dim, keepdim=True)
        combined_norm = torch.norm(combined, dim=self.channel_dim, keepdim=True)
        return combined * (cond_norm / combined_norm)


@dataclass(frozen=True)
class NoGuidance:
    """One conditional forward: for step-distilled models, which have no unconditional branch."""

    def forward_conditions(
        self, family: CFGFamily, conditions: Conditions, scale: float
    ) -> Conditions:
        if guided(scale):
            raise ValueError(
                f"sampling.guidance_scale={scale} but this model is distilled without "
                "classifier-free guidance; set sampling.guidance_scale=1"
            )
        return positive_rows(conditions)

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
        rows = cast(Conditions, fwd_conditions)  # what forward_conditions returned
        return family.predict_velocity(latents, sigma, rows).float()


DEFAULT_GUIDANCE = BatchedCFG()


def guidance_of(family: object) -> Guidance:
    """The family's guidance (its ``guidance`` attribute), :class:`BatchedCFG` by default."""
    guidance = getattr(family, "guidance", None)
    return DEFAULT_GUIDANCE if guidance is None else guidance
