"""``JanusBundle``: Janus-Pro through transformers' ``JanusForConditionalGeneration``.

The text half is the causal-LM contract of ``unirl.models.common_ar`` (prompt formatting, stop
tokens, sampling mode, the four weight sources); ``bundle.model`` is a :class:`JanusPolicy`
(what the backend wraps). The image half is what the image-token stage asks of a family: the
number of image tokens, the ``<begin_of_image>`` / BOS / pad ids, the unconditional context of
classifier-free guidance, and the VQ decode to pixels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from unirl.models.common_ar.bundle import CausalLMBundle
from unirl.models.common_ar.sources import CausalLMSources
from unirl.models.janus.arch import BOI_ID, BOS_ID, arch_config
from unirl.models.janus.config import JanusBundleConfig
from unirl.models.janus.model import JanusPolicy
from unirl.models.janus.presets import SOURCES, tiny_preset_path
from unirl.models.janus.tiny import BOI, TinyJanusSpec, model_config, tiny_tokenizer


class JanusBundle(CausalLMBundle):
    """A Janus-Pro model and tokenizer: ``path`` = ``tiny`` | ``janus-pro-{1b,7b}-arch`` | a
    local folder | a hub id (``deepseek-community/Janus-Pro-7B``, the transformers layout)."""

    config_class: ClassVar[type[JanusBundleConfig]] = JanusBundleConfig  # type: ignore[assignment]
    sources: ClassVar[CausalLMSources] = SOURCES
    block_class_names: ClassVar[tuple[str, ...]] = ("LlamaDecoderLayer",)
    trainable_attr: ClassVar[str] = "model"
    trainable_module_names: ClassVar[tuple[str, ...]] = ("model",)

    config: JanusBundleConfig

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        janus = self.janus
        generation = janus.generation_config
        extra = dict(getattr(generation, "generation_kwargs", None) or {})
        self.boi_token_id = int(extra.get("boi_token_id", self._token_id(BOI, BOI_ID)))
        # the tokenizer's BOS first (an ``*-arch`` preset borrows the tiny tokenizer, whose
        # prompts start with its own BOS), then the generation config's
        bos = self.tokenizer.bos_token_id
        bos = bos if bos is not None else generation.bos_token_id
        self.bos_token_id = int(bos if bos is not None else BOS_ID)
        self.num_image_tokens = int(janus.config.vision_config.num_image_tokens)
        self.codebook_size = int(janus.config.vq_config.num_embeddings)
        vq = janus.model.vqmodel
        vq.to(dtype=self.vq_dtype)

    def _token_id(self, token: str, fallback: int) -> int:
        found = self.tokenizer.convert_tokens_to_ids(token)
        unk = getattr(self.tokenizer, "unk_token_id", None)
        return int(found) if found is not None and found != unk else fallback

    # -- family hooks ----------------------------------------------------------------------------

    @classmethod
    def model_class(cls) -> type[nn.Module]:
        from transformers import JanusForConditionalGeneration

        return JanusForConditionalGeneration

    @classmethod
    def hf_config_class(cls) -> type:
        from transformers import JanusConfig

        return JanusConfig

    @classmethod
    def tiny_folder(cls) -> Path:
        return tiny_preset_path()

    @classmethod
    def arch_config(cls, name: str) -> dict[str, Any]:
        return arch_config(name)

    @classmethod
    def tiny_tokenizer(cls) -> Any:
        return tiny_tokenizer(TinyJanusSpec())

    @classmethod
    def tiny_config(cls) -> dict[str, Any]:
        spec = TinyJanusSpec()
        return model_config(spec, tiny_tokenizer(spec))

    def _load(self) -> tuple[nn.Module, Any]:
        from unirl.config.precision import parse_dtype

        self.vq_dtype = parse_dtype(self.config.vq_dtype, "bundle.vq_dtype")
        janus, tokenizer = super()._load()
        if getattr(janus.generation_config, "pad_token_id", None) is None:
            janus.generation_config.pad_token_id = tokenizer.pad_token_id
        return JanusPolicy(janus), tokenizer

    @classmethod
    def trainable_on_meta(cls, block: dict[str, Any]) -> nn.Module | None:
        """The whole :class:`JanusPolicy` on the meta device (LoRA-target checks)."""
        kind, name = cls.sources.classify(str(block.get("path", "tiny")))
        if kind == "arch":
            config_dict = cls.arch_config(name)
        elif kind == "tiny":
            config_dict = cls.tiny_config()
        else:
            folder = Path(name) if kind == "folder" else cls.sources.cached_snapshot(name)
            found = cls.sources.folder_config(folder) if folder is not None else None
            if found is None:
                return None
            config_dict = found
        hf_config = cls.hf_config_class().from_dict(
            {k: v for k, v in config_dict.items() if k != "architectures"}
        )
        with torch.device("meta"):
            return JanusPolicy(cls.model_class()(hf_config))

    # -- what the rest reads ----------------------------------------------------------------------

    @property
    def janus(self) -> nn.Module:
        """The ``JanusForConditionalGeneration`` inside ``model`` (peft's wrapper removed)."""
        from unirl.models.common_ar.engine.decoder import causal_lm_of

        return causal_lm_of(self.model)

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    # -- the image half ---------------------------------------------------------------------------

    def image_context(self, rows: list[list[int]]) -> list[list[int]]:
        """Each row (prompt, or prompt and written plan) followed by ``<begin_of_image>``."""
        return [[*r, self.boi_token_id] for r in rows]

    def unconditional_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The unconditional branch of ``ids[R, L]``: every token but BOS and
        ``<begin_of_image>`` replaced by pad (transformers' image ``generate`` does the same)."""
        keep = (ids == self.bos_token_id) | (ids == self.boi_token_id)
        return torch.where(keep, ids, torch.full_like(ids, self.pad_token_id))

    @torch.no_grad()
    def decode_image_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``pixels[B, 3, H, W]`` float32 in [0, 1] of ``tokens[B, num_image_tokens]`` through
        the VQ decoder (``decode_chunk_size`` per call); ``x / 2 + 0.5`` of the VQ model's
        [-1, 1] output, as Janus's image processor un-normalises (mean 0.5, std 0.5)."""
        chunk = self.config.decode_chunk_size
        out = []
        for i in range(0, tokens.shape[0], chunk):
            pixels = self.model(decode_tokens=tokens[i : i + chunk].to(self.device))
            out.append((pixels.float() / 2 + 0.5).clamp(0, 1))
        return torch.cat(out)

    # -- export (``FSDPBackend.export_pretrained``) ----------------------------------------------

    def save_pretrained(
        self, path: str | Path, state: dict[str, torch.Tensor], write_pretrained: Any
    ) -> Path:
        """The trained model as one transformers folder that plain
        ``JanusForConditionalGeneration.from_pretrained`` loads (text and image generation,
        the VQ decoder included): ``state`` is the :class:`JanusPolicy`'s (``janus.*``),
        written under the names of ``JanusForConditionalGeneration.state_dict()``."""
        prefix = "janus."
        inner = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        return write_pretrained(Path(path), self.janus, inner, self.tokenizer)
