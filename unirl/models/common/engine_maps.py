"""``EngineMaps``: how one family's data crosses the external serving engines.

SGLang and vLLM-Omni speak their own dialects of a family: SGLang returns the encoded
conditions as the transformer keyword arguments it recorded (``denoising_env``), vLLM-Omni
takes precomputed embeddings under the family's pipeline argument names, and both carry
latents in the layout of the family's diffusers pipeline. What that dialect is belongs to the
family, not to the engine adapter: each family package holds an ``engine_maps.py`` with an
``EngineMaps`` subclass, exposed as the bundle class attribute ``engine_maps``, and an engine
looks it up with :func:`engine_maps_for` from the bundle class it serves (the recipe's
``bundle._target_``). A family without maps for an engine is refused in one line naming both.

The hooks are plain functions of tensors and dicts; nothing here imports a serving stack.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeAlias

import torch

from unirl.config.require import ConfigError
from unirl.models.common.config_dict import JSONDict
from unirl.types import Conditions

Engine = Literal["sglang", "vllm_omni"]
ENGINES: tuple[Engine, ...] = ("sglang", "vllm_omni")


PromptEntry: TypeAlias = torch.Tensor | Mapping[str, "PromptEntry"] | None
"""One entry of a vLLM-Omni prompt: an embedding row, a nested group of them
(``additional_information``), or None for an absent one."""


class EngineMapError(ValueError):
    """An engine's output cannot be mapped into the family's types (a key or shape is off)."""


def sample_tensor(value: object, ndim: int, what: str) -> torch.Tensor:
    """One sample's fp32 tensor from an engine value: a one-element list / tuple is unwrapped
    and leading singleton dims are dropped down to ``ndim`` dims."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    t = torch.as_tensor(value)
    while t.ndim > ndim and t.shape[0] == 1:
        t = t[0]
    if t.ndim != ndim:
        raise EngineMapError(f"{what} has shape {list(t.shape)}, expected {ndim} dims per sample")
    return t.float()


def cond_kwargs(env: Mapping[str, Any] | None, side: str) -> Mapping[str, Any]:
    """``env[side]`` of one SGLang ``denoising_env`` (``pos_cond_kwargs`` / ``neg_cond_kwargs``),
    empty when absent."""
    return (env or {}).get(side) or {}


class EngineMaps:
    """A family's mappers to and from the external engines (see the module docstring).

    ``engines`` lists the engines the family maps; a subclass implements their hooks:

    - SGLang: :meth:`sglang_conditions` (the family's ``Conditions`` from the per-sample
      ``denoising_env`` list) and :meth:`sglang_guidance` (the payload's CFG keys).
    - vLLM-Omni: :meth:`vllm_omni_prompt` (the prompt dict of one row: precomputed embeddings
      under the family pipeline's argument names) and :meth:`vllm_omni_guidance`.
    - both: :meth:`to_engine_latents` / :meth:`from_engine_latents` between our latent layout
      and the engine's (identity unless the family packs latents differently).
    """

    family: ClassVar[str] = "?"
    engines: ClassVar[tuple[Engine, ...]] = ()

    # -- SGLang ----------------------------------------------------------------------------------

    def sglang_conditions(self, envs: Sequence[Mapping[str, Any]]) -> Conditions:
        """The family's conditions (``N`` rows) from SGLang's per-sample ``denoising_env``."""
        raise NotImplementedError(f"{self.family}: no SGLang condition mapper")

    def sglang_guidance(self, scale: float) -> JSONDict:
        """The ``/rollout/generate`` payload keys that set classifier-free guidance."""
        return {"guidance_scale": scale}

    # -- vLLM-Omni -------------------------------------------------------------------------------

    def vllm_omni_prompt(self, conditions: Conditions, row: int) -> dict[str, PromptEntry]:
        """The vLLM-Omni prompt entries (embeddings, no ``prompt`` text) of ``conditions[row]``."""
        raise NotImplementedError(f"{self.family}: no vLLM-Omni prompt mapper")

    def vllm_omni_guidance(self, scale: float) -> JSONDict:
        """The vLLM-Omni sampling keys that set classifier-free guidance."""
        return {"guidance_scale": scale}

    # video families set ``video = True``: the engine is asked for frames and returns videos
    video: ClassVar[bool] = False

    def vllm_omni_video(self, num_frames: int, fps: float) -> JSONDict:
        """The vLLM-Omni sampling keys of a video's length and frame rate; an image family
        takes none and refuses ``num_frames > 1``."""
        if num_frames != 1:
            raise EngineMapError(
                f"{self.family} samples images: sampling.num_frames must be 1, got {num_frames}"
            )
        return {}

    # -- latents (both engines) ----------------------------------------------------------------------

    def to_engine_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents[N, *latent_shape]`` (ours) in the engine's layout (pinned x_T)."""
        return latents

    def from_engine_latents(
        self, latents: torch.Tensor, latent_shape: tuple[int, ...]
    ) -> torch.Tensor:
        """``latents[..., *engine layout]`` in ours, ``[..., *latent_shape]``; a layout this
        family does not know is returned unchanged (the adapter's shape check names it)."""
        return latents


class PackedLatentEngineMaps(EngineMaps):
    """Maps of a family carrying packed latents ``[N, h, w, 4·C]`` (``geometry``'s
    ``PackedLatentGeometry``) where the engines hold diffusers' packed sequence
    ``[N, h·w, 4·C]`` (Qwen-Image, FLUX.2)."""

    def to_engine_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """``[N, h, w, 4·C]`` -> diffusers' packed ``[N, h·w, 4·C]``."""
        n, grid_h, grid_w, channels = latents.shape
        return latents.reshape(n, grid_h * grid_w, channels)

    def from_engine_latents(
        self, latents: torch.Tensor, latent_shape: tuple[int, ...]
    ) -> torch.Tensor:
        """Packed ``[..., h·w, 4·C]`` -> ``[..., h, w, 4·C]``; ours passes unchanged."""
        grid_h, grid_w, channels = latent_shape
        if tuple(latents.shape[-2:]) == (grid_h * grid_w, channels):
            return latents.reshape(*latents.shape[:-2], grid_h, grid_w, channels)
        return latents


class VideoEngineMaps(EngineMaps):
    """Maps of a video family whose latents are the pipeline's ``[N, C, F, h, w]`` (Wan,
    HunyuanVideo 1.5): vLLM-Omni takes the frame count and rate under ``frames_key`` /
    ``fps_key`` (``fps_key = None`` drops the rate) and the CFG scale under ``guidance_key``;
    latents cross both ways as they are, and pinned latents of another rank are refused."""

    video: ClassVar[bool] = True
    frames_key: ClassVar[str] = "num_frames"
    fps_key: ClassVar[str | None] = "fps"
    guidance_key: ClassVar[str] = "guidance_scale"

    def vllm_omni_guidance(self, scale: float) -> JSONDict:
        return {self.guidance_key: scale}

    def vllm_omni_video(self, num_frames: int, fps: float) -> JSONDict:
        """``{num_frames: n, fps: r}`` under ``frames_key`` / ``fps_key``."""
        keys: JSONDict = {self.frames_key: int(num_frames)}
        if self.fps_key is not None:
            keys[self.fps_key] = float(fps)
        return keys

    def to_engine_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """``[N, C, F, h, w]`` as is (the pipeline's layout); other ranks are refused."""
        if latents.ndim != 5:
            raise EngineMapError(
                f"{self.family}: pinned latents must be [N, C, F, h, w], got {list(latents.shape)}"
            )
        return latents


def _family_class(family: type | str) -> type:
    if isinstance(family, type):
        return family
    module_name, _, attr = str(family).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr) if module_name else None
    except ImportError as exc:
        raise ConfigError(f"rollout: cannot import the family {family!r} ({exc})") from exc
    if not isinstance(cls, type):
        raise ConfigError(
            f"rollout: the family {family!r} is not a bundle class (give the recipe's "
            "bundle._target_, e.g. unirl.models.sd3.SD3Bundle)"
        )
    return cls


def family_name(family: type | str) -> str:
    """``module.Class`` of a family given as a class or a ``_target_`` string."""
    if isinstance(family, type):
        return f"{family.__module__}.{family.__qualname__}"
    return str(family)


def engine_maps_for(family: type | str, engine: Engine) -> EngineMaps:
    """The maps ``engine`` uses for ``family`` (a bundle class or its ``_target_``), read from
    the class attribute ``engine_maps``; raises ``ConfigError`` in one line naming the family
    and the engine when the family has none for that engine."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    cls = _family_class(family)
    maps = getattr(cls, "engine_maps", None)
    if not isinstance(maps, EngineMaps) or engine not in maps.engines:
        raise ConfigError(
            f"rollout: the {engine} engine has no mapper for family {family_name(cls)}; give "
            f"the family an engine_maps with {engine!r} in its engines (like "
            "unirl/models/sd3/engine_maps.py) or sample with a trainside / dedicated engine"
        )
    return maps
