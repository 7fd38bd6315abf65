"""``DecodeEngine``: continuous batching over a static KV cache, with CUDA-graph decode steps.

A generate call admits samples into ``S`` slots. Each distinct prompt is prefilled once by
the model's own forward (left-padded batches of prompts sorted by length, transformers'
fused attention) and its K/V copied into every slot of its samples; the first token is
drawn from the prefill's last logits. Then decode steps run for all slots of the smallest
bucket holding the busy ones (a CUDA graph per bucket on CUDA, eager on CPU), ``check_every``
steps between host checks: the host reads which slots finished (one small copy), harvests
their tokens and log-probs, and gives the free slots to waiting samples. When no sample
waits and the busy slots would fit a smaller bucket, they are moved down (their cache rows
with them), so the tail of a rollout does not run the full batch.

Every sample draws its tokens from its own uniform stream (``TextRequest.uniforms``), so
its completion does not depend on the slot, the bucket or the other samples beyond
kernel rounding — the same contract as :func:`~unirl.models.common_ar.generate.generate_completions`,
which stays the reference sampler (``pipeline.sampler: loop``).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from unirl.config.require import require
from unirl.models.common_ar.engine.decoder import (
    DecoderView,
    SamplingSpec,
    SlotState,
    allocate_slots,
    decode_step,
    decoder_view,
    install_prefix,
    sample_and_record,
)
from unirl.models.common_ar.generate import (
    LENGTH,
    STOP,
    Completion,
    StopStrings,
    cache_keyword,
    check_sampling_inputs,
)

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE


@dataclass(kw_only=True)
class DecodeEngineConfig:
    """``pipeline.engine``: how the AR families sample (see README.md, "Decode engine").

    - ``max_slots``: sequences decoded at once (KV-cache rows); ``null``: every sample of the
      call, up to 512.
    - ``lora``: ``merged`` (default) samples from the engine's own copy of the projections,
      ``W + s·B·A`` merged and q/k/v and gate/up each stacked into one matmul, re-merged when
      the weights' checksum changes (1.5x the decode speed of ``fused`` at Qwen3-4B shapes;
      the copy costs the projections' memory once more, about the model's size);
      ``fused`` runs the model's own (peft) layers as the trainer does (base + B·A·x).
    - ``cuda_graphs``: replay the decode step from a CUDA graph per slot bucket (CUDA only).
    - ``compile``: fuse the step's elementwise pieces (norms, rotary, SwiGLU) with
      ``torch.compile`` (CUDA only; a few seconds of compiling on the first call).
    - ``check_every``: decode steps between host checks (finished slots, refill, stop strings).
    - ``prefill_tokens``: padded tokens per prefill forward.
    """

    max_slots: int | None = None
    lora: Literal["fused", "merged"] = "merged"
    cuda_graphs: bool = True
    compile: bool = True
    check_every: int = 8
    prefill_tokens: int = 16384

    def __post_init__(self) -> None:
        require(
            self.max_slots is None or self.max_slots >= 1,
            f"pipeline.engine.max_slots must be >= 1 or null, got {self.max_slots}",
        )
        require(
            self.lora in ("fused", "merged"),
            f"pipeline.engine.lora must be 'fused' or 'merged', got {self.lora!r}",
        )
        require(
            self.check_every >= 1,
            f"pipeline.engine.check_every must be >= 1, got {self.check_every}",
        )
        require(
            self.prefill_tokens >= 1,
            f"pipeline.engine.prefill_tokens must be >= 1, got {self.prefill_tokens}",
        )


@dataclass
class Prefix:
    """One prompt after its prefill: per layer K/V ``[kv_heads, P, head_dim]``, the logits of
    its last position ``[V]`` (fp32), and the rotary position of the first generated token."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    last_logits: torch.Tensor
    next_rope_pos: int


PrefillFn = Callable[[Sequence[int]], list[Prefix]]


def hf_prefill(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    extra_inputs: Callable[[Sequence[int]], Mapping[str, torch.Tensor]] | None = None,
    positions_fn: Callable[[Sequence[int], torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> PrefillFn:
    """A prefill through the model's own forward: ``fn(indices)`` runs the prompts
    ``prompts[i]`` as one left-padded batch with a ``DynamicCache`` and returns their
    :class:`Prefix` es. ``extra_inputs(indices)``: more inputs (a vision model's pixels);
    ``positions_fn(indices, ids, mask)``: the position ids (``[B, L]`` or ``[3, B, L]``)."""
    from transformers import DynamicCache

    keyword = cache_keyword(model)

    def run(indices: Sequence[int]) -> list[Prefix]:
        device = next(model.parameters()).device
        rows = [list(prompts[i]) for i in indices]
        longest = max(len(r) for r in rows)
        ids = torch.full((len(rows), longest), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, longest - len(r) :] = torch.as_tensor(r, dtype=torch.long)
            mask[j, longest - len(r) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        if positions_fn is None:
            positions = (mask.cumsum(-1) - 1).clamp_min(0)
        else:
            positions = positions_fn(indices, ids, mask).to(device)
        cache = DynamicCache()
        extra = {
            k: v.to(device) for k, v in (extra_inputs(indices) if extra_inputs else {}).items()
        }
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{keyword: cache},
            **extra,
        )
        layers = cache.layers
        last = out.logits[:, -1, :].float()
        next_pos = positions[..., -1] if positions.ndim == 2 else positions[..., -1].amax(0)
        next_pos = (next_pos + 1).tolist()
        prefixes = []
        for j, r in enumerate(rows):
            start = longest - len(r)
            prefixes.append(
                Prefix(
                    keys=[layer.keys[j, :, start:] for layer in layers],
                    values=[layer.values[j, :, start:] for layer in layers],
                    last_logits=last[j],
                    next_rope_pos=int(next_pos[j]),
                )
            )
        return prefixes

    return run


def _buckets(num_slots: int) -> list[int]:
    sizes, b = [], 1
    while b < num_slots:
        sizes.append(b)
        b *= 2
    return [*sizes, num_slots]


@dataclass
class EngineStats:
    """What the last generate call did (logged by the pipeline as ``engine/*``)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_prompts: int = 0
    decode_steps: int = 0
    slot_steps: int = 0  # Σ over steps of the bucket size run
    busy_slot_steps: int = 0  # Σ over steps of the slots still generating at the check
    graph_captures: int = 0
    merged_refreshed: int = 0
    compactions: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {
            "engine/prefill_s": self.prefill_s,
            "engine/decode_s": self.decode_s,
            "engine/decode_steps": float(self.decode_steps),
            "engine/slot_use": self.busy_slot_steps / self.slot_steps if self.slot_steps else 0.0,
            "engine/graph_captures": float(self.graph_captures),
        }


@dataclass
class _Graphs:
    """Captured decode steps of one slot state, per bucket."""

    key: tuple[int, int, SamplingSpec, tuple[int, ...]]
    state: SlotState
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)


class DecodeEngine:
    """Samples completions with continuous batching over a static KV cache (module docstring).

    One engine per pipeline: the slot buffers and the captured graphs are kept between calls
    while the shapes, the sampling settings and the weights' storage stay the same."""

    def __init__(self, config: DecodeEngineConfig | Mapping[str, Any] | None = None) -> None:
        if config is None:
            config = DecodeEngineConfig()
        elif isinstance(config, Mapping):
            config = DecodeEngineConfig(**config)
        self.config = config
        self.stats = EngineStats()
        self._view: DecoderView | None = None
        self._view_of: int | None = None
        self._kept: _Graphs | None = None
        self._pool: _POOL_HANDLE | None = None

    # -- the model -----------------------------------------------------------------------------

    def view(self, model: nn.Module) -> DecoderView:
        """The decoder view of ``model`` (rebuilt when the module object changes)."""
        if self._view is None or self._view_of != id(model):
            cuda = next(model.parameters()).device.type == "cuda"
            self._view = decoder_view(
                model, lora=self.config.lora, compiled=self.config.compile and cuda
            )
            self._view_of = id(model)
            self._kept = None
        return self._view

    # -- one call ------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        model: nn.Module,
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
        suppress_token_ids: Sequence[int] = (),
        prefix_keys: Sequence[Hashable] | None = None,
        prefill: PrefillFn | None = None,
    ) -> list[Completion]:
        """One completion per prompt (the contract of ``generate_completions``).

        ``prefix_keys[i]``: samples with equal keys share one prefill (default: the prompt's
        token ids; a vision model adds its image). ``prefill``: the prefill function
        (default :func:`hf_prefill` over ``prompts``)."""
        n = len(prompts)
        if n == 0:
            return []
        check_sampling_inputs(prompts, uniforms, max_new_tokens)
        self.stats = stats = EngineStats()
        view = self.view(model)
        stats.merged_refreshed = view.refresh_merged()
        spec = SamplingSpec(
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=int(top_k),
            max_new_tokens=int(max_new_tokens),
            stop_token_ids=tuple(sorted(set(stop_token_ids))),
            suppress_token_ids=tuple(sorted(set(suppress_token_ids))),
        )
        num_slots = min(self.config.max_slots or min(n, 512), n)
        longest = max(len(p) for p in prompts)
        cache_len = -(-(longest + max_new_tokens) // 16) * 16
        kept = self._slots(view, spec, num_slots, cache_len)
        state = kept.state
        state.active.zero_()
        keys = list(prefix_keys) if prefix_keys is not None else [tuple(p) for p in prompts]
        run_prefill = prefill or hf_prefill(model, prompts, pad_token_id=pad_token_id)
        device = view.device
        autocast = self._autocast(view)

        pending = deque(range(n))
        waiting_for: dict[Hashable, int] = {}
        for k in keys:
            waiting_for[k] = waiting_for.get(k, 0) + 1
        prefixes: dict[Hashable, Prefix] = {}
        slot_sample = [-1] * num_slots  # slot -> sample, -1 when free
        ran = [0] * num_slots  # decode steps run since the slot's sample came in
        checked = [0] * num_slots  # tokens already scanned for stop strings
        results: list[Completion | None] = [None] * n
        uniforms = uniforms[:, :max_new_tokens].to(torch.float64)
        t_start = time.perf_counter()
        while pending or any(s >= 0 for s in slot_sample):
            free = [i for i, s in enumerate(slot_sample) if s < 0]
            if pending and free:
                take = [pending.popleft() for _ in range(min(len(free), len(pending)))]
                t0 = time.perf_counter()
                with autocast:
                    self._prefill(run_prefill, take, keys, prefixes, prompts)
                stats.prefill_s += time.perf_counter() - t0
                slots = free[: len(take)]
                self._admit(state, spec, take, slots, keys, prefixes, uniforms, prompts)
                for slot, sample in zip(slots, take, strict=True):
                    slot_sample[slot], checked[slot], ran[slot] = sample, 0, 0
                    waiting_for[keys[sample]] -= 1
                    if waiting_for[keys[sample]] == 0:
                        del prefixes[keys[sample]]  # every sample of that prompt is in
            elif not pending:
                self._compact(state, slot_sample, checked, ran)
            busy = [i for i, s in enumerate(slot_sample) if s >= 0]
            bucket = next(b for b in _buckets(num_slots) if b > busy[-1])
            # no step past the longest possible remainder (the first token came from prefill)
            steps = max(
                1, min(self.config.check_every, max_new_tokens - 1 - min(ran[i] for i in busy))
            )
            t0 = time.perf_counter()
            with autocast:
                for _ in range(steps):
                    self._step(kept, view, spec, bucket)
            active = state.active.tolist()  # the one host sync per check
            for i in busy:
                ran[i] += steps
            stats.decode_s += time.perf_counter() - t0
            stats.decode_steps += steps
            stats.slot_steps += bucket * steps
            stats.busy_slot_steps += sum(active[:bucket]) * steps
            self._harvest(state, spec, slot_sample, checked, active, stop_strings, results)
        stats.decode_s = time.perf_counter() - t_start - stats.prefill_s
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return [r for r in results if r is not None]

    # -- pieces ---------------------------------------------------------------------------------

    def _autocast(self, view: DecoderView) -> contextlib.AbstractContextManager[None]:
        if view.device.type == "cuda" and view.dtype in (torch.bfloat16, torch.float16):
            # no weight-cast cache: a captured graph must not read a cache entry freed later
            return torch.autocast("cuda", dtype=view.dtype, cache_enabled=False)
        return contextlib.nullcontext()

    def _slots(
        self, view: DecoderView, spec: SamplingSpec, num_slots: int, cache_len: int
    ) -> _Graphs:
        key = (num_slots, cache_len, spec, view.weight_pointers())
        kept = self._kept
        if kept is not None and kept.key == key:
            return kept
        self._kept = None  # free the old cache before the new one is allocated
        state = allocate_slots(view, num_slots=num_slots, cache_len=cache_len, spec=spec)
        self._kept = _Graphs(key=key, state=state)
        return self._kept

    def _prefill(
        self,
        run: PrefillFn,
        take: Sequence[int],
        keys: Sequence[Hashable],
        prefixes: dict[Hashable, Prefix],
        prompts: Sequence[Sequence[int]],
    ) -> None:
        """Prefill the distinct prompts of ``take`` not prefilled yet, shortest first, in
        batches of at most ``prefill_tokens`` padded tokens."""
        first_of: dict[Hashable, int] = {}
        for i in take:
            if keys[i] not in prefixes and keys[i] not in first_of:
                first_of[keys[i]] = i
        todo = sorted(first_of.values(), key=lambda i: len(prompts[i]))
        start = 0
        while start < len(todo):
            end = start + 1
            while (
                end < len(todo)
                and len(prompts[todo[end]]) * (end - start + 1) <= self.config.prefill_tokens
            ):
                end += 1
            for i, prefix in zip(todo[start:end], run(todo[start:end]), strict=True):
                prefixes[keys[i]] = prefix
            self.stats.prefill_prompts += end - start
            start = end

    def _admit(
        self,
        state: SlotState,
        spec: SamplingSpec,
        take: Sequence[int],
        slots: Sequence[int],
        keys: Sequence[Hashable],
        prefixes: Mapping[Hashable, Prefix],
        uniforms: torch.Tensor,
        prompts: Sequence[Sequence[int]],
    ) -> None:
        """Put samples ``take`` into ``slots``: their prompt's K/V, positions, uniforms, and
        their first token drawn from the prefill's last logits."""
        device = state.last_token.device
        by_key: dict[Hashable, list[int]] = {}
        for slot, sample in zip(slots, take, strict=True):
            by_key.setdefault(keys[sample], []).append(slot)
        for key, key_slots in by_key.items():
            install_prefix(state, key_slots, prefixes[key].keys, prefixes[key].values)
        index = torch.as_tensor(list(slots), dtype=torch.long, device=device)
        state.cache_pos[index] = torch.as_tensor([len(prompts[i]) for i in take], device=device)
        state.rope_pos[index] = torch.as_tensor(
            [prefixes[keys[i]].next_rope_pos for i in take], device=device
        )
        state.step[index] = 0
        state.active[index] = True
        state.uniforms[index] = uniforms[list(take)].to(device)
        logits = torch.stack([prefixes[keys[i]].last_logits for i in take])
        sample_and_record(logits, state, spec, index)

    def _step(self, kept: _Graphs, view: DecoderView, spec: SamplingSpec, bucket: int) -> None:
        state = kept.state
        if not (self.config.cuda_graphs and view.device.type == "cuda"):
            decode_step(view, state, spec, bucket)
            return
        graph = kept.graphs.get(bucket)
        if graph is None:
            graph = self._capture(view, state, spec, bucket)
            kept.graphs[bucket] = graph
        graph.replay()

    def _capture(
        self, view: DecoderView, state: SlotState, spec: SamplingSpec, bucket: int
    ) -> torch.cuda.CUDAGraph:
        """Capture one decode step over slots ``0 .. bucket-1``; the warm-up steps run on
        a copy of the slot bookkeeping, so capturing changes no slot."""
        saved = {
            name: getattr(state, name).clone()
            for name in SlotState.BOOKKEEPING
            if name != "uniforms"
        }
        saved_cache = [
            (k[:bucket].clone(), v[:bucket].clone())
            for k, v in zip(state.k_cache, state.v_cache, strict=True)
        ]
        stream = torch.cuda.Stream(view.device)
        stream.wait_stream(torch.cuda.current_stream(view.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                decode_step(view, state, spec, bucket)
        torch.cuda.current_stream(view.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            decode_step(view, state, spec, bucket)
        for name, value in saved.items():
            getattr(state, name).copy_(value)
        for (k, v), (k0, v0) in zip(
            zip(state.k_cache, state.v_cache, strict=True), saved_cache, strict=True
        ):
            k[:bucket].copy_(k0)
            v[:bucket].copy_(v0)
        self.stats.graph_captures += 1
        return graph

    def _compact(
        self, state: SlotState, slot_sample: list[int], checked: list[int], ran: list[int]
    ) -> None:
        """Move the busy slots into the lowest indices when that shrinks their bucket."""
        busy = [i for i, s in enumerate(slot_sample) if s >= 0]
        if not busy:
            return
        top = busy[-1] + 1
        buckets = _buckets(len(slot_sample))
        if next(b for b in buckets if b >= len(busy)) == next(b for b in buckets if b >= top):
            return
        free_low = [i for i in range(len(busy)) if slot_sample[i] < 0]
        movers = [i for i in busy if i >= len(busy)]
        src = torch.as_tensor(movers, dtype=torch.long, device=state.last_token.device)
        dst = torch.as_tensor(free_low, dtype=torch.long, device=state.last_token.device)
        for cache in (*state.k_cache, *state.v_cache):
            cache[dst] = cache[src]
        for name in SlotState.BOOKKEEPING:
            buf = getattr(state, name)
            buf[dst] = buf[src]
        state.active[src] = False
        for s, d in zip(movers, free_low, strict=True):
            slot_sample[d], checked[d], ran[d] = slot_sample[s], checked[s], ran[s]
            slot_sample[s], checked[s], ran[s] = -1, 0, 0
        self.stats.compactions += 1

    def _harvest(
        self,
        state: SlotState,
        spec: SamplingSpec,
        slot_sample: list[int],
        checked: list[int],
        active: list[bool],
        stop_strings: StopStrings | None,
        results: list[Completion | None],
    ) -> None:
        """Collect the finished slots (and those a stop string ended) and free them."""
        busy = [i for i, s in enumerate(slot_sample) if s >= 0]
        if not busy:
            return
        scan = busy if stop_strings else [i for i in busy if not active[i]]
        if not scan:
            return
        index = torch.as_tensor(scan, dtype=torch.long, device=state.last_token.device)
        steps = state.step[index].tolist()
        tokens = state.out_tokens[index].tolist()
        logps = state.out_log_probs[index].cpu()
        ended: list[int] = []
        for row, slot in enumerate(scan):
            count = steps[row]
            ended_on_stop = count > 0 and tokens[row][count - 1] in spec.stop_token_ids
            finish = None if active[slot] else (STOP if ended_on_stop else LENGTH)
            if stop_strings:
                for k in range(checked[slot] + 1, count + 1):
                    if stop_strings.hit(tokens[row][:k]):
                        count, finish = k, STOP
                        break
                checked[slot] = count
            if finish is None:
                continue
            results[slot_sample[slot]] = Completion(
                tokens=tokens[row][:count],
                log_probs=logps[row, :count].clone(),
                finish_reason=finish,
            )
            ended.append(slot)
        if ended:
            state.active[
                torch.as_tensor(ended, dtype=torch.long, device=state.last_token.device)
            ] = False
            for slot in ended:
                slot_sample[slot] = -1
