"""The autoregressive sampling loop, written once for every causal-LM family.

``generate_completions`` runs a batch of prompts through a transformers causal LM with a KV
cache: the prompts are left-padded into one prefill, then one token per step for the rows
still running; a row stops at a stop token (end of sequence), at a stop string, or after
``max_new_tokens``, and finished rows leave the batch (their cache rows are dropped).

Every token is drawn by inverse-CDF sampling from ``u[i, step]``, the sample's own uniform
stream (``TextRequest.uniforms``): a sample's draws depend only on ``(seed, sample id)`` and
its own logits, never on the rank or the batch it lands in. The log-probability recorded for
each sampled token is the policy's, ``log softmax(logits / temperature)`` in fp32, without the
top-p / top-k truncation (the trainer replays that policy; see README.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

STOP = "stop"
LENGTH = "length"
_U_MAX = 1.0 - 2.0**-40  # u < 1 strictly, so u * total never reaches the last cumulative mass


@dataclass
class Completion:
    """One sample's generated tokens (stop token included), their fp32 log-probs and why it
    ended: ``stop`` (stop token or stop string) or ``length`` (``max_new_tokens``)."""

    tokens: list[int]
    log_probs: torch.Tensor
    finish_reason: str


def suppress(logits: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
    """``logits`` with the given token ids at -inf (out of the policy's support)."""
    if not token_ids:
        return logits
    out = logits.clone()
    out[..., list(token_ids)] = float("-inf")
    return out


def policy_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log softmax(logits / temperature)`` in fp32 (temperature 0 means greedy sampling
    from the temperature-1 policy)."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def draw_tokens(
    logits: torch.Tensor,
    u: torch.Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
) -> torch.Tensor:
    """``tokens[B]`` drawn from ``logits[B, V]``: argmax at temperature 0, else the token
    where ``u[B]`` falls in the cumulative distribution of ``softmax(logits / temperature)``
    truncated to the ``top_k`` most likely tokens and the smallest set holding ``top_p`` of
    the mass (both off by default). The cumulative sums are fp64."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    vocab = probs.shape[-1]
    order: torch.Tensor | None = None
    if (0 < top_k < vocab) or top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        if 0 < top_k < vocab:
            probs[:, top_k:] = 0.0
        if top_p < 1.0:
            before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
            probs = torch.where(before >= top_p, torch.zeros_like(probs), probs)
    cumulative = probs.double().cumsum(dim=-1)
    target = u.to(cumulative).clamp(0.0, _U_MAX) * cumulative[:, -1]
    pick = torch.searchsorted(cumulative, target[:, None], right=True).clamp_max(vocab - 1)
    if order is not None:
        pick = order.gather(1, pick)
    return pick[:, 0]


class StopStrings:
    """Whether a completion has produced one of ``stops``: decodes only the tail of the
    completion (enough tokens to hold the longest stop string) after every step."""

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.decode = decode
        self.window = max((len(s) for s in self.stops), default=0) + 4

    def __bool__(self) -> bool:
        return bool(self.stops)

    def hit(self, tokens: list[int]) -> bool:
        text = self.decode(tokens[-self.window :])
        return any(s in text for s in self.stops)


def check_sampling_inputs(
    prompts: Sequence[Sequence[int]], uniforms: torch.Tensor, max_new_tokens: int
) -> None:
    """Every prompt has a token and every sample a stream of ``>= max_new_tokens`` uniforms."""
    b = len(prompts)
    if uniforms.shape[0] != b or uniforms.shape[1] < max_new_tokens:
        raise ValueError(
            f"uniforms must be [B={b}, >= {max_new_tokens}], got {tuple(uniforms.shape)}"
        )
    if min(len(p) for p in prompts) == 0:
        raise ValueError("every prompt needs at least one token")


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword the model's ``forward`` takes its KV cache under (transformers renamed
    ``past_key_values`` to ``cache`` in its 5.x line)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.no_grad()
def generate_completions(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    uniforms: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    stop_token_ids: Sequence[int] = (),
    stop_strings: StopStrings | None = None,
    pad_token_id: int = 0,
    prefill_inputs: Mapping[str, torch.Tensor] | None = None,
    positions_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    suppress_token_ids: Sequence[int] = (),
) -> list[Completion]:
    """Sample one completion per prompt with a KV cache (see the module docstring).

    ``prompts``: token ids per sample (non-empty). ``uniforms[B, >= max_new_tokens]``: each
    sample's stream. ``model``: a transformers causal LM (any wrapper that keeps its call
    signature: peft-injected, FSDP2-sharded). ``prefill_inputs``: extra model inputs of the
    prefill only (a vision-language model's ``pixel_values``, ``image_grid_thw``).
    ``positions_fn(input_ids[B, L], attention[B, L])``: the prefill's ``position_ids`` of the
    left-padded batch (``[B, L]``, or ``[3, B, L]`` for multimodal RoPE); default: the
    attention mask's running count. Every generated token advances every position axis by 1.
    ``suppress_token_ids``: tokens the policy never emits (a vision model's image
    placeholders): their logits are -inf for sampling and for the recorded log-probs alike
    (:func:`suppress`; the replay applies the same).
    """
    from transformers import DynamicCache

    b = len(prompts)
    if b == 0:
        return []
    check_sampling_inputs(prompts, uniforms, max_new_tokens)
    device = next(model.parameters()).device
    longest = max(len(p) for p in prompts)
    input_ids = torch.full((b, longest), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, longest), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: every row's next token sits at the end
        input_ids[i, longest - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        attention[i, longest - len(p) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    if positions_fn is None:
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
    else:
        positions = positions_fn(input_ids, attention).to(device)
    stops = torch.tensor(sorted(set(stop_token_ids)), dtype=torch.long, device=device)

    tokens: list[list[int]] = [[] for _ in range(b)]
    logps: list[list[torch.Tensor]] = [[] for _ in range(b)]
    finish = [LENGTH] * b
    rows = torch.arange(b)  # batch row -> sample, for the rows still running
    cache = DynamicCache()
    with_cache = {cache_keyword(model): cache}
    out = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **with_cache,
        **{k: v.to(device) for k, v in (prefill_inputs or {}).items()},
    )
    for step in range(max_new_tokens):
        logits = suppress(out.logits[:, -1, :].float(), suppress_token_ids)
        u = uniforms[rows, step].to(device)
        chosen = draw_tokens(logits, u, temperature=temperature, top_p=top_p, top_k=top_k)
        chosen_logp = policy_log_probs(logits, temperature).gather(1, chosen[:, None])[:, 0]
        done = (
            torch.isin(chosen, stops)
            if stops.numel()
            else torch.zeros_like(chosen, dtype=torch.bool)
        )
        chosen_host, logp_host, done_host = chosen.tolist(), chosen_logp.cpu(), done.tolist()
        keep: list[int] = []
        for row, sample in enumerate(rows.tolist()):
            tokens[sample].append(chosen_host[row])
            logps[sample].append(logp_host[row])
            if done_host[row] or (stop_strings and stop_strings.hit(tokens[sample])):
                finish[sample] = STOP
            else:
                keep.append(row)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(rows):  # finished rows leave the batch and the cache
            index = torch.tensor(keep, dtype=torch.long, device=device)
            cache.batch_select_indices(index)
            attention, chosen = attention[index], chosen[index]
            positions = positions.index_select(positions.ndim - 2, index)  # [B, L] or [3, B, L]
            rows = rows[torch.tensor(keep, dtype=torch.long)]
        attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=1)
        positions = positions[..., -1:] + 1
        out = model(
            input_ids=chosen[:, None],
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **with_cache,
        )
    return [
        Completion(tokens=t, log_probs=torch.stack(lp).float(), finish_reason=f)
        for t, lp, f in zip(tokens, logps, finish, strict=True)
    ]
