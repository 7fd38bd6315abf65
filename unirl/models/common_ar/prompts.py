"""``PromptFormatter``: prompts -> token ids and completion tokens -> text, for one tokenizer.

What a sampler needs from a family without its weights: the bundle uses one, and an external
engine (SGLang) builds one from the recipe's bundle block
(``CausalLMBundle.prompt_formatter``) so both tokenize every prompt the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from unirl.config.require import ConfigError, require
from unirl.models.common_ar.config import CausalLMBundleConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def stop_token_ids(
    tokenizer: PreTrainedTokenizerBase, generation_config: object, where: str
) -> list[int]:
    """End-of-sequence ids: the tokenizer's eos and the generation config's (one or a list)."""
    ids: set[int] = set()
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    gen_eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list | tuple):
        ids.update(int(i) for i in gen_eos)
    require(
        bool(ids),
        f"{where}: the tokenizer and generation config name no end-of-sequence token; the "
        "sampler would only stop at max_new_tokens",
    )
    return sorted(ids)


class PromptFormatter:
    """The prompt knobs of a :class:`CausalLMBundleConfig` applied with ``tokenizer``:
    ``prompt_text``, ``encode_prompts`` (cached per prompt, length-checked), ``decode``;
    ``stop_token_ids``, ``pad_token_id`` and ``suppressed_token_ids`` (tokens the policy never
    emits; none for text families) for the sampler and the replay."""

    suppressed_token_ids: tuple[int, ...] = ()

    def __init__(
        self,
        config: CausalLMBundleConfig,
        tokenizer: PreTrainedTokenizerBase,
        stop_ids: Sequence[int],
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.stop_token_ids = sorted(int(i) for i in stop_ids)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.stop_token_ids[0]
        self._cache: dict[str, list[int]] = {}

    @property
    def response_prefix(self) -> str:
        return self.config.response_prefix

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
        return str(text) + cfg.response_prefix

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt (:meth:`prompt_text`, no special tokens added beyond the
        template's); a prompt over ``max_prompt_tokens`` is refused, naming it."""
        out = []
        for prompt in prompts:
            ids = self._cache.get(prompt)
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
                if len(self._cache) < 100_000:
                    self._cache[prompt] = ids
            out.append(list(ids))
        return out

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of generated tokens, special tokens (the stop token) left out."""
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def decode_raw(self, tokens: Sequence[int]) -> str:
        """Text of tokens with special tokens kept (stop-string matching)."""
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=False))
