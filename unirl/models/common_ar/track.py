"""One text track from prompts and completions, whichever engine sampled them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from unirl.models.common_ar.conditions import PromptConditions
from unirl.models.common_ar.generate import Completion
from unirl.models.common_ar.prompts import PromptFormatter
from unirl.types import Packed, RolloutReq, RolloutTrack, Texts, TextSegment


def text_track(
    req: RolloutReq,
    prompt_ids: Sequence[Sequence[int]],
    completions: Sequence[Completion],
    *,
    formatter: PromptFormatter,
    temperature: float,
) -> RolloutTrack:
    """The track of ``req``'s samples: a ``TextSegment`` packing each sample's prompt then
    completion tokens (``loss_mask`` on the completion, ``log_probs`` 0 on the prompt and the
    recorded fp32 values on the completion), ``PromptConditions`` (prompt lengths, the
    policy's temperature: 1 for a greedy rollout), ``decoded`` texts (``response_prefix`` +
    completion) and metadata with ``response_tokens`` and ``finish_reason``."""
    if len(prompt_ids) != len(completions) or len(completions) != len(req):
        raise ValueError(
            f"{len(req)} samples asked, {len(prompt_ids)} prompts and {len(completions)} "
            "completions came back"
        )
    rows, masks, logps, decoded = [], [], [], []
    metadata = [dict(m) for m in req.metadata]
    for prompt, done, meta in zip(prompt_ids, completions, metadata, strict=True):
        if len(done.log_probs) != len(done.tokens) or not done.tokens:
            raise ValueError(
                f"a completion has {len(done.tokens)} tokens and {len(done.log_probs)} "
                "log-probs; every completion needs one log-prob per token, at least one token"
            )
        rows.append(torch.tensor(list(prompt) + list(done.tokens), dtype=torch.long))
        masks.append(
            torch.cat(
                [
                    torch.zeros(len(prompt), dtype=torch.bool),
                    torch.ones(len(done.tokens), dtype=torch.bool),
                ]
            )
        )
        logps.append(torch.cat([torch.zeros(len(prompt)), done.log_probs.float().cpu()]))
        decoded.append(formatter.response_prefix + formatter.decode(done.tokens))
        meta["response_tokens"] = len(done.tokens)
        meta["finish_reason"] = done.finish_reason
    tokens = Packed.from_list(rows)
    segment = TextSegment(
        tokens=tokens,
        log_probs=Packed(values=torch.cat(logps), offsets=tokens.offsets),
        loss_mask=Packed(values=torch.cat(masks), offsets=tokens.offsets),
    )
    conditions = PromptConditions(
        prompt_lengths=torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
        temperature=temperature if temperature > 0 else 1.0,
    )
    return RolloutTrack(
        sample_ids=req.sample_ids.clone(),
        group_ids=req.group_ids.clone(),
        prompts=list(req.prompts),
        metadata=metadata,
        conditions=conditions,
        segment=segment,
        decoded=Texts(texts=decoded),
    )
