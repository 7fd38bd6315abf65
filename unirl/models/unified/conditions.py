"""What an image of the unified model is conditioned on, and its stage of a request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.types import Conditions, Packed, batch_field


@dataclass(kw_only=True)
class ContextConditions(Conditions):
    """``context``: per sample, the token ids the image attends to (the formatted prompt, then
    the text the model wrote before drawing), packed. The image stage replays from these exact
    ids, never from re-tokenized text."""

    context: Packed = batch_field("packed")

    @classmethod
    def from_rows(cls, rows: list[list[int]] | list[torch.Tensor]) -> ContextConditions:
        return cls(context=Packed.from_list([torch.as_tensor(r, dtype=torch.long) for r in rows]))

    def padded(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids[B, L], mask[B, L])``, left-padded with id 0 and mask 0 (every row's last
        context token sits just before the image tokens)."""
        rows = self.context.to_list()
        longest = max(int(r.numel()) for r in rows)
        ids = torch.zeros((len(rows), longest), dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, r in enumerate(rows):
            n = int(r.numel())
            ids[i, longest - n :] = r.cpu()
            mask[i, longest - n :] = 1
        return ids.to(device), mask.to(device)
