"""``CausalLMBundle``: the half of every autoregressive family bundle that is not the family's own.

A bundle holds one causal LM (the trainable module) and its tokenizer, and turns prompts into
token ids. This base owns the generic part: the typed config taken whole
(:class:`CausalLMBundleConfig` subclasses), the four weight sources (``tiny``, ``*-arch``,
folder, hub), precision and device, the prompt formatting (``self.prompts``, a
:class:`PromptFormatter`; ``prompt_formatter(block)`` builds one without weights for an
external engine), the stop tokens, the sampling and autocast contexts, and the checks the
validators run before Ray (``check_config``, ``trainable_on_meta``). A family
subclass sets ``config_class``, ``sources``, ``block_class_names`` and implements the hooks
marked *family* below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from unirl.config.precision import parse_dtype
from unirl.config.require import ConfigError, UserFacingError
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.presets import ModelSourceError
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common_ar.config import CausalLMBundleConfig
from unirl.models.common_ar.prompts import PromptFormatter, stop_token_ids
from unirl.models.common_ar.sources import CausalLMSources

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def dtype_keyword() -> str:
    """``dtype`` for transformers >= 4.56 (``torch_dtype`` before)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


LLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class CausalLMBundle:
    """A causal LM and its tokenizer, built from a :class:`CausalLMBundleConfig`.

    ``model`` is the trainable module (``trainable_module``; the backend wraps it in place and
    sets it back as ``bundle.model``); ``tokenizer`` a transformers tokenizer. Family hooks:
    ``model_class()``, ``config_class_hf()``, ``tiny_folder()``, ``arch_config(name)``.
    """

    config_class: ClassVar[type[CausalLMBundleConfig]] = CausalLMBundleConfig
    formatter_class: ClassVar[type[PromptFormatter]] = PromptFormatter
    sources: ClassVar[CausalLMSources]
    block_class_names: ClassVar[tuple[str, ...]] = ()
    lora_default_targets: ClassVar[tuple[str, ...]] = LLM_LORA_TARGETS

    def __init__(self, **knobs: Any) -> None:
        self.config = self.config_class(**knobs)
        self.device = self.config.resolved_device()
        self.dtype = parse_dtype(self.config.dtype, "bundle.dtype")
        self.policy_version: int | None = 0  # the backend publishes its version here
        self.model, self.tokenizer = self._load()
        self.model.requires_grad_(False)  # the backend decides what trains
        # train mode for the loss forwards (gradient checkpointing acts only in train mode);
        # sampling switches to eval mode (``sampling_mode``). Keep dropout at 0 for RL: the
        # anchor and the first loss forward must see the same function.
        self.model.train()
        if self.config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        where = f"bundle.path={self.config.path!r}"
        stops = stop_token_ids(
            self.tokenizer, getattr(self.model, "generation_config", None), where
        )
        self.prompts = self.formatter_class(self.config, self.tokenizer, stops)
        self.stop_token_ids = self.prompts.stop_token_ids
        self.pad_token_id = self.prompts.pad_token_id

    # -- family hooks ----------------------------------------------------------------------------

    @classmethod
    def model_class(cls) -> type[nn.Module]:
        """*family*: the transformers causal-LM class (``Qwen3ForCausalLM``)."""
        raise NotImplementedError

    @classmethod
    def hf_config_class(cls) -> type:
        """*family*: the transformers config class (``Qwen3Config``)."""
        raise NotImplementedError

    @classmethod
    def tiny_folder(cls) -> Path:
        """*family*: the ``tiny`` preset's ``save_pretrained`` folder (built on first use)."""
        raise NotImplementedError

    @classmethod
    def arch_config(cls, name: str) -> ConfigDict:
        """*family*: the transformers config (as a dict) of an ``*-arch`` preset."""
        raise NotImplementedError

    @classmethod
    def tiny_tokenizer(cls) -> PreTrainedTokenizerBase:
        """*family*: the tokenizer the ``*-arch`` presets borrow (built in memory)."""
        raise NotImplementedError

    @classmethod
    def tiny_config(cls) -> ConfigDict:
        """*family*: the ``tiny`` preset's transformers config, without building it (the
        pre-Ray LoRA-target check reads its module names)."""
        raise NotImplementedError

    # -- loading ---------------------------------------------------------------------------------

    @classmethod
    def _source_folder(cls, path: str) -> tuple[str, Path | None, str]:
        """``(kind, folder, name)``: the folder a source loads from (None for an ``*-arch``
        preset, which builds in memory); a name that resolves to nothing is refused."""
        try:
            kind, name = cls.sources.classify(path)
            if kind == "arch":
                return kind, None, name
            if kind == "tiny":
                return kind, cls.tiny_folder(), name
            if kind == "folder":
                return kind, Path(name), name
            return kind, cls.sources.snapshot(name), name
        except ModelSourceError as exc:
            raise UserFacingError(str(exc)) from exc

    @classmethod
    def prompt_formatter(cls, block: Any) -> PromptFormatter:
        """The :class:`PromptFormatter` of a bundle block (its ``path`` and prompt knobs),
        loading the tokenizer and generation config only — what an external engine needs to
        tokenize prompts exactly as this bundle does."""
        from transformers import AutoTokenizer, GenerationConfig

        knobs = {str(k): v for k, v in dict(block).items() if not str(k).startswith("_")}
        config = cls.config_class(**knobs)
        kind, folder, _ = cls._source_folder(config.path)
        tokenizer = (
            AutoTokenizer.from_pretrained(str(folder))
            if folder is not None
            else cls.tiny_tokenizer()
        )
        generation = None
        if folder is not None and (folder / "generation_config.json").is_file():
            generation = GenerationConfig.from_pretrained(str(folder))
        elif kind == "arch":
            generation = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        stops = stop_token_ids(tokenizer, generation, f"bundle.path={config.path!r}")
        return cls.formatter_class(config, tokenizer, stops)

    def _load(self) -> tuple[nn.Module, Any]:
        from transformers import AutoTokenizer

        cfg = self.config
        kind, folder, name = self._source_folder(cfg.path)
        model_cls = self.model_class()
        if kind == "arch":
            # random weights at the real shapes, built straight on the device (seeded); the
            # tiny preset's tokenizer stands in (its ids are far below the real vocabulary)
            hf_config = self.hf_config_class().from_dict(self.arch_config(name))
            hf_config._attn_implementation = cfg.attn_implementation
            with torch.random.fork_rng(devices=[]), torch.device(self.device):
                torch.manual_seed(cfg.seed)
                model = model_cls._from_config(hf_config, **{dtype_keyword(): self.dtype})
            return model.eval(), self.tiny_tokenizer()
        assert folder is not None
        with hf_progress_bars_disabled():
            model = model_cls.from_pretrained(
                str(folder),
                attn_implementation=cfg.attn_implementation,
                **{dtype_keyword(): self.dtype},
            ).to(self.device)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        return model.eval(), tokenizer

    # -- what the backend and the validators read --------------------------------------------

    @property
    def trainable_module(self) -> nn.Module:
        return self.model

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.get_text_config().vocab_size)

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """Before Ray: the path names a preset, a transformers folder or a hub id."""
        path = block.get("path")
        if path is None:
            return
        try:
            cls.sources.classify(str(path))
        except ModelSourceError as exc:
            raise ConfigError(f"bundle.path: {exc}") from exc

    @classmethod
    def trainable_on_meta(cls, block: Mapping[str, object]) -> nn.Module | None:
        """The model on the meta device (no weights), for the LoRA-target check; None for a hub
        checkpoint that is not in the local cache (checked when it loads)."""
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
        config_dict = {k: v for k, v in config_dict.items() if k not in ("architectures",)}
        hf_config = cls.hf_config_class()(**config_dict)
        with torch.device("meta"):
            return cls.model_class()(hf_config)

    # -- prompts (``self.prompts``, a PromptFormatter) -------------------------------------------

    def prompt_text(self, prompt: str) -> str:
        return self.prompts.prompt_text(prompt)

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        return self.prompts.encode_prompts(prompts)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.prompts.decode(tokens)

    # -- contexts ----------------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """bf16 / fp16 autocast on CUDA when the weights are in that precision (the trained
        fp32 master parameters then compute in it too); nothing on CPU."""
        if self.device.type == "cuda" and self.dtype in (torch.bfloat16, torch.float16):
            return torch.autocast("cuda", dtype=self.dtype)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def sampling_mode(self) -> Iterator[None]:
        """The model in eval mode (no dropout, and transformers keeps the KV cache on with
        gradient checkpointing) for sampling; the previous mode comes back after."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self.autocast():
                yield
        finally:
            self.model.train(was_training)
