"""FLUX.2-Klein's dialect on SGLang (``Flux2KleinBundle.engine_maps``).

SGLang's ``Flux2KleinPipelineConfig`` encodes prompts as diffusers' pipeline does (the chat
template, padding to 512 tokens, hidden states 9 / 18 / 27 stacked per token) and the
denoising stage records the transformer's keyword arguments per sample: the text as
``encoder_hidden_states [L, D]`` under ``pos_cond_kwargs`` (and ``neg_cond_kwargs`` when a
base checkpoint runs CFG); the rotary tables it also records (``freqs_cis``) are recomputed
here from the shapes, as the bundle does. No text mask exists: every prompt has ``L`` tokens.
Latents are carried packed as diffusers does, ``[h·w, 4·C]``: our ``[h, w, 4·C]`` is the same
elements (``reshape``).

Text-to-image only: how SGLang records a reference image's latents for editing is not part of
its published denoising env, so an editing track sampled by SGLang has no references in its
conditions, and :meth:`Flux2KleinEngineMaps.sglang_conditions` cannot supply them (train
editing recipes with the trainside engine). Written against SGLang's published code; no run
of SGLang on FLUX.2-Klein was possible here (tested against fakes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from unirl.models.common.engine_maps import (
    Engine,
    EngineMapError,
    PackedLatentEngineMaps,
    cond_kwargs,
    sample_tensor,
)
from unirl.models.flux2.conditions import Flux2KleinConditions


class Flux2KleinEngineMaps(PackedLatentEngineMaps):
    """SGLang conditions and the packed latent layout of FLUX.2-Klein."""

    family: ClassVar[str] = "unirl.models.flux2.Flux2KleinBundle"
    engines: ClassVar[tuple[Engine, ...]] = ("sglang",)

    def sglang_conditions(self, envs: Sequence[Mapping[str, Any]]) -> Flux2KleinConditions:
        """``Flux2KleinConditions`` from ``encoder_hidden_states [L, D]`` per sample (all of
        one length); negatives only when every sample has them."""

        def stacked(side: str) -> torch.Tensor | None:
            rows = []
            for env in envs:
                kwargs = cond_kwargs(env, side)
                if "encoder_hidden_states" not in kwargs:
                    if side == "neg_cond_kwargs":
                        return None  # a distilled checkpoint: no CFG
                    raise EngineMapError(
                        f"denoising_env.{side} has no 'encoder_hidden_states' (keys: "
                        f"{sorted(kwargs)}); training replay needs the encoded conditions "
                        "(rollout_return_denoising_env=true)"
                    )
                rows.append(sample_tensor(kwargs["encoder_hidden_states"], 2, f"{side} text"))
            lengths = {tuple(r.shape) for r in rows}
            if len(lengths) != 1:
                raise EngineMapError(
                    f"{side} encoder_hidden_states differ in shape across samples "
                    f"({sorted(lengths)}); FLUX.2 pads every prompt to max_sequence_length"
                )
            return torch.stack(rows)

        prompt_embeds = stacked("pos_cond_kwargs")
        assert prompt_embeds is not None
        return Flux2KleinConditions(
            prompt_embeds=prompt_embeds, negative_prompt_embeds=stacked("neg_cond_kwargs")
        )
