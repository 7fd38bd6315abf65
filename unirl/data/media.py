"""Reference media of editing prompts: ``MediaRef`` files -> pixel tensors at the sampled size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from unirl.config.require import ConfigError
from unirl.data.prompts import MediaRef, PromptExample

REFERENCE_ROLES = ("reference", "source", "condition")


def reference_of(example: PromptExample) -> MediaRef | None:
    """The one image an example is edited from (role ``reference`` / ``source`` /
    ``condition``), or None; more than one is refused (one reference per edit)."""
    refs = [m for m in example.media_refs if m.modality == "image" and m.role in REFERENCE_ROLES]
    if len(refs) > 1:
        raise ConfigError(
            f"prompt {example.prompt!r} has {len(refs)} reference images; an edit takes one "
            "(give the others another role, e.g. 'mask')"
        )
    return refs[0] if refs else None


def has_references(examples: Sequence[PromptExample]) -> bool:
    """True when the examples are an editing set; a file mixing edits and plain prompts is
    refused (a request is either conditioned on images or not)."""
    with_ref = [reference_of(e) is not None for e in examples]
    if any(with_ref) and not all(with_ref):
        missing = next(e.prompt for e, w in zip(examples, with_ref) if not w)
        raise ConfigError(
            f"the prompt file mixes edits and plain prompts ({sum(with_ref)} of "
            f"{len(with_ref)} have a reference image; {missing!r} has none); give every "
            "line a 'media' reference or none"
        )
    return bool(with_ref) and all(with_ref)


class ReferenceImages:
    """Loads and caches each reference file once, resized to ``height x width`` (bicubic,
    RGB, float32 in [0, 1])."""

    def __init__(self, height: int, width: int) -> None:
        self.height, self.width = int(height), int(width)
        self._cache: dict[str, torch.Tensor] = {}

    def load(self, uri: str) -> torch.Tensor:
        if uri not in self._cache:
            path = Path(uri)
            try:
                with Image.open(path) as img:
                    rgb = img.convert("RGB").resize(
                        (self.width, self.height), Image.Resampling.BICUBIC
                    )
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{path}: cannot read reference image ({exc})") from exc
            array = np.asarray(rgb, dtype=np.float32) / 255.0
            self._cache[uri] = torch.from_numpy(array).permute(2, 0, 1).contiguous()
        return self._cache[uri]

    def pixels(self, examples: Sequence[PromptExample], repeat: int = 1) -> torch.Tensor:
        """``[len(examples) * repeat, 3, H, W]``: each example's reference, repeated in place
        like its prompt."""
        rows = []
        for example in examples:
            ref = reference_of(example)
            if ref is None:
                raise ConfigError(f"prompt {example.prompt!r} has no reference image to edit")
            rows.extend([self.load(ref.uri)] * repeat)
        return torch.stack(rows)
