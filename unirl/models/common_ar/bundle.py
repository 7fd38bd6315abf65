"""``CausalLMBundle``: the half of every autoregressive family bundle that is not the family's own.

A bundle holds one causal LM (the trainable module) and its tokenizer, and turns prompts into
token ids. This base owns the generic part: the typed config taken whole
(:class:`CausalLMBundleConfig` subclasses), the four weight sources (``tiny``, ``*-arch``,
folder, hub), precision and device, the prompt formatting (chat template, system prompt,
response prefix, length check), the stop tokens, the sampling and autocast contexts, and the
checks the validators run before Ray (``check_config``, ``trainable_on_meta``). A family
subclass sets ``config_class``, ``sources``, ``block_class_names`` and implements the hooks
marked *family* below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from unirl.config.precision import parse_dtype
from unirl.config.require import ConfigError, UserFacingError, require
from unirl.models.common.presets import ModelSourceError
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common_ar.config import CausalLMBundleConfig
from unirl.models.common_ar.sources import CausalLMSources

LLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class CausalLMBundle:
    """A causal LM and its tokenizer, built from a :class:`CausalLMBundleConfig`.

    ``model`` is the trainable module (``trainable_module``; the backend wraps it in place and
    sets it back as ``bundle.model``); ``tokenizer`` a transformers tokenizer. Family hooks:
    ``model_class()``, ``config_class_hf()``, ``tiny_folder()``, ``arch_config(name)``.
    """

    config_class: ClassVar[type[CausalLMBundleConfig]] = CausalLMBundleConfig
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
        self.stop_token_ids = self._stop_token_ids()
        self.pad_token_id = self._pad_token_id()
        self._prompt_cache: dict[str, list[int]] = {}

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
    def arch_config(cls, name: str) -> dict[str, Any]:
        """*family*: the transformers config (as a dict) of an ``*-arch`` preset."""
        raise NotImplementedError

    @classmethod
    def tiny_config(cls) -> dict[str, Any]:
        """*family*: the ``tiny`` preset's transformers config, without building it (the
        pre-Ray LoRA-target check reads its module names)."""
        raise NotImplementedError

    # -- loading ---------------------------------------------------------------------------------

    def _load(self) -> tuple[nn.Module, Any]:
        from transformers import AutoTokenizer

        cfg = self.config
        try:
            kind, name = self.sources.classify(cfg.path)
        except ModelSourceError as exc:
            raise UserFacingError(str(exc)) from exc
        model_cls = self.model_class()
        if kind == "arch":
            # random weights at the real shapes, built straight on the device (seeded); the
            # tiny preset's tokenizer stands in (its ids are far below the real vocabulary)
            hf_config = self.hf_config_class()(**self.arch_config(name))
            hf_config._attn_implementation = cfg.attn_implementation
            with torch.random.fork_rng(devices=[]), torch.device(self.device):
                torch.manual_seed(cfg.seed)
                model = model_cls._from_config(hf_config, dtype=self.dtype)
            tokenizer = AutoTokenizer.from_pretrained(str(self.tiny_folder()))
            return model.eval(), tokenizer
        if kind == "tiny":
            folder = self.tiny_folder()
        elif kind == "folder":
            folder = Path(name)
        else:
            try:
                folder = self.sources.snapshot(name)
            except ModelSourceError as exc:
                raise UserFacingError(str(exc)) from exc
        with hf_progress_bars_disabled():
            model = model_cls.from_pretrained(
                str(folder), dtype=self.dtype, attn_implementation=cfg.attn_implementation
            ).to(self.device)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        return model.eval(), tokenizer

    def _stop_token_ids(self) -> list[int]:
        """End-of-sequence ids: the tokenizer's eos, the generation config's eos (one or a
        list) and, with the chat template, the token that ends a turn."""
        ids: set[int] = set()
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        if tok_eos is not None:
            ids.add(int(tok_eos))
        gen = getattr(self.model, "generation_config", None)
        gen_eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, list | tuple):
            ids.update(int(i) for i in gen_eos)
        require(
            bool(ids),
            f"bundle.path={self.config.path!r}: the tokenizer and generation config name no "
            "end-of-sequence token; the sampler would only stop at max_new_tokens",
        )
        return sorted(ids)

    def _pad_token_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else self.stop_token_ids[0]

    # -- what the backend and the validators read --------------------------------------------

    @property
    def trainable_module(self) -> nn.Module:
        return self.model

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @classmethod
    def check_config(cls, block: dict[str, Any], recipe: Any) -> None:
        """Before Ray: the path names a preset, a transformers folder or a hub id."""
        path = block.get("path")
        if path is None:
            return
        try:
            cls.sources.classify(str(path))
        except ModelSourceError as exc:
            raise ConfigError(f"bundle.path: {exc}") from exc

    @classmethod
    def trainable_on_meta(cls, block: dict[str, Any]) -> nn.Module | None:
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

    # -- prompts ---------------------------------------------------------------------------------

    def prompt_text(self, prompt: str) -> str:
        """What the model reads: the chat turn (with the generation prompt) or the prompt as
        it is, then ``response_prefix``."""
        cfg = self.config
        if cfg.chat_template:
            if getattr(self.tokenizer, "chat_template", None) is None:
                raise ConfigError(
                    f"bundle.chat_template=true but the tokenizer of {cfg.path!r} has no chat "
                    "template; set bundle.chat_template=false for a base model"
                )
            messages = [{"role": "user", "content": prompt}]
            if cfg.system_prompt:
                messages.insert(0, {"role": "system", "content": cfg.system_prompt})
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        else:
            text = prompt
        return text + cfg.response_prefix

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt (:meth:`prompt_text`, no special tokens added beyond the
        template's); a prompt over ``max_prompt_tokens`` is refused, naming it."""
        out = []
        for prompt in prompts:
            ids = self._prompt_cache.get(prompt)
            if ids is None:
                ids = list(
                    self.tokenizer(self.prompt_text(prompt), add_special_tokens=False).input_ids
                )
                if not ids:
                    raise ValueError(f"prompt {prompt!r} tokenizes to nothing")
                if len(ids) > self.config.max_prompt_tokens:
                    raise ValueError(
                        f"prompt {prompt[:80]!r}... is {len(ids)} tokens, over "
                        f"bundle.max_prompt_tokens={self.config.max_prompt_tokens}; raise it or "
                        "shorten the prompt"
                    )
                if len(self._prompt_cache) < 100_000:
                    self._prompt_cache[prompt] = ids
            out.append(list(ids))
        return out

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of generated tokens, special tokens (the stop token) left out."""
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def decode_raw(self, tokens: Sequence[int]) -> str:
        """Text of tokens with special tokens kept (stop-string matching)."""
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=False))

    # -- contexts ----------------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
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
