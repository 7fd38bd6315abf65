"""Trainer-name -> engine-name rewriting (``sync.name_remap``) and wrapper-token cleanup."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unirl.config.require import require

# Tokens that wrappers insert into parameter names; both sides strip them before matching.
_WRAPPER_TOKENS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def canonical_name(name: str) -> str:
    """``name`` without FSDP1 / checkpoint-wrapper / ``torch.compile`` tokens."""
    for token in _WRAPPER_TOKENS:
        name = name.replace(token, "")
    return name


@dataclass(kw_only=True)
class RemapRule:
    """One rewrite: ``prefix`` (replace a leading prefix with ``to``) or ``regex``
    (``re.sub(regex, to, name)``); exactly one of the two."""

    prefix: str | None = None
    regex: str | None = None
    to: str = ""

    def __post_init__(self) -> None:
        require(
            (self.prefix is None) != (self.regex is None),
            f"sync.name_remap rule {self!r}: give exactly one of `prefix` or `regex` (plus `to`)",
        )
        if self.regex is not None:
            try:
                self._pattern = re.compile(self.regex)
            except re.error as exc:
                require(False, f"sync.name_remap: regex {self.regex!r} does not compile ({exc})")

    def apply(self, name: str) -> str:
        if self.prefix is not None:
            return self.to + name[len(self.prefix) :] if name.startswith(self.prefix) else name
        return self._pattern.sub(self.to, name)

    def describe(self) -> str:
        return (
            f"prefix {self.prefix!r} -> {self.to!r}"
            if self.prefix is not None
            else f"regex {self.regex!r} -> {self.to!r}"
        )


class NameRemap:
    """Applies ``rules`` in order to canonical trainer names; identity when empty."""

    def __init__(self, rules: Sequence[RemapRule | Mapping[str, str]] | None = None) -> None:
        parsed = []
        for i, rule in enumerate(rules or []):
            if isinstance(rule, RemapRule):
                parsed.append(rule)
            else:
                require(
                    isinstance(rule, Mapping),
                    f"sync.name_remap[{i}] must be a mapping like {{prefix: 'a.', to: 'b.'}}, got {rule!r}",
                )
                unknown = sorted(set(rule) - {"prefix", "regex", "to"})
                require(
                    not unknown,
                    f"sync.name_remap[{i}]: unknown key(s) {unknown}; use prefix / regex / to",
                )
                parsed.append(RemapRule(**{str(k): v for k, v in rule.items()}))
        self.rules = parsed

    def __call__(self, name: str) -> str:
        name = canonical_name(name)
        for rule in self.rules:
            name = rule.apply(name)
        return name

    def describe(self) -> str:
        return (
            "[" + "; ".join(r.describe() for r in self.rules) + "]"
            if self.rules
            else "[] (identity)"
        )
