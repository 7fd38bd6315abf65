"""``CausalLMPipeline``: an autoregressive family's sampler and its token policy, written once.

``generate(req)`` samples the request's text stage (``TextRequest`` under the track name)
and returns a track whose ``TextSegment`` packs each sample's prompt and completion tokens,
with the recorded per-token log-probs and the loss mask on the completion.
``token_log_probs(conditions, segment)`` is the policy the losses replay (the
``unirl.algorithms.TokenPolicy`` protocol): one padding-free forward over the packed rows of a
micro-batch (``position_ids`` restart at each row, so rows never attend to each other).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from unirl.config.require import require
from unirl.models.common_ar.conditions import PromptConditions
from unirl.models.common_ar.engine import DecodeEngine, DecodeEngineConfig
from unirl.models.common_ar.generate import (
    Completion,
    StopStrings,
    generate_completions,
    suppress,
)
from unirl.models.common_ar.track import text_track
from unirl.types import Packed, RolloutReq, RolloutResp, TextRequest, TextSegment


def packed_positions(offsets: torch.Tensor) -> torch.Tensor:
    """``position[T]`` of every packed token within its row (0 at each row start)."""
    lengths = offsets[1:] - offsets[:-1]
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=offsets.device), lengths)
    return torch.arange(int(offsets[-1]), device=offsets.device) - offsets[:-1][rows]


class CausalLMPipeline:
    """Sampling and replay for a :class:`~unirl.models.common_ar.bundle.CausalLMBundle`.

    ``forward_batch_size``: sequences sampled at once (None: the whole shard at once); with
    the engine, the slots of its KV cache unless ``engine.max_slots`` says otherwise.
    ``track_name``: the stage this pipeline samples (its ``TextRequest`` key and track name).
    ``sampler``: ``engine`` (default; :class:`DecodeEngine`: continuous batching over a static
    KV cache, CUDA-graph decode steps, settings in ``engine``, a :class:`DecodeEngineConfig`)
    or ``loop``, the reference sampler (:func:`generate_completions`: a dynamic cache, one
    host sync per token). ``value_head``: attach a linear value head (``model.value_head``,
    hidden size -> 1, zero-initialised) to the trained module before the backend wraps it, for
    PPO (:meth:`token_values`); with LoRA, list ``value_head`` in ``backend.lora.targets``.
    """

    def __init__(
        self,
        *,
        bundle: Any,
        forward_batch_size: int | None = None,
        track_name: str = "text",
        engine: DecodeEngineConfig | Mapping[str, Any] | None = None,
        sampler: str = "engine",
        value_head: bool = False,
    ) -> None:
        require(
            forward_batch_size is None or forward_batch_size >= 1,
            "pipeline.forward_batch_size must be >= 1 or null",
        )
        require(
            sampler in ("engine", "loop"),
            f"pipeline.sampler must be 'engine' or 'loop', got {sampler!r}",
        )
        self.bundle = bundle
        self.forward_batch_size = forward_batch_size
        self.track_name = track_name
        if isinstance(engine, Mapping):
            engine = DecodeEngineConfig(**engine)
        self.engine: DecodeEngine | None = (
            DecodeEngine(engine or DecodeEngineConfig()) if sampler == "engine" else None
        )
        self.has_value_head = bool(value_head)
        if value_head:
            self._attach_value_head()

    def sample(
        self,
        prompt_ids: list[list[int]],
        uniforms: torch.Tensor,
        block: TextRequest,
        **inputs: Any,
    ) -> list[Completion]:
        """Completions of ``prompt_ids`` under ``block``'s sampling settings, by the engine
        (``inputs``: ``prefix_keys`` and ``prefill`` for a vision model) or, with
        ``sampler: loop``, by the reference loop in chunks of ``forward_batch_size``
        (``inputs``: ``prefill_inputs_for`` / ``positions_fn_for`` per chunk)."""
        bundle = self.bundle
        common = {
            "max_new_tokens": block.max_new_tokens,
            "temperature": block.temperature,
            "top_p": block.top_p,
            "top_k": block.top_k,
            "stop_token_ids": bundle.stop_token_ids,
            "stop_strings": StopStrings(block.stop, bundle.prompts.decode_raw) or None,
            "pad_token_id": bundle.pad_token_id,
            "suppress_token_ids": bundle.prompts.suppressed_token_ids,
        }
        if self.engine is not None:
            if self.engine.config.max_slots is None and self.forward_batch_size is not None:
                self.engine.config.max_slots = self.forward_batch_size
            return self.engine.generate(
                bundle.model,
                prompt_ids,
                uniforms,
                prefix_keys=inputs.get("prefix_keys"),
                prefill=inputs.get("prefill"),
                **common,
            )
        chunk = self.forward_batch_size or max(len(prompt_ids), 1)
        out: list[Completion] = []
        for start in range(0, len(prompt_ids), chunk):
            rows = list(range(start, min(start + chunk, len(prompt_ids))))
            extra = inputs.get("prefill_inputs_for")
            positions = inputs.get("positions_fn_for")
            out.extend(
                generate_completions(
                    bundle.model,
                    prompt_ids[start : start + chunk],
                    uniforms[start : start + chunk],
                    prefill_inputs=extra(rows) if extra else None,
                    positions_fn=positions(rows) if positions else None,
                    **common,
                )
            )
        return out

    # -- sampling ----------------------------------------------------------------------------------

    def generate(self, req: RolloutReq) -> RolloutResp:
        """This shard's completions as one ``RolloutTrack`` (``track.text_track``; on CPU)."""
        bundle = self.bundle
        block = req.params_for(self.track_name, TextRequest)
        texts = req.prompts
        t0 = time.perf_counter()
        prompt_ids = bundle.encode_prompts(texts)
        t_encode = time.perf_counter() - t0
        uniforms = block.uniforms(req.seed)
        t0 = time.perf_counter()
        with bundle.sampling_mode():
            completions = self.sample(prompt_ids, uniforms, block)
        t_generate = time.perf_counter() - t0
        track = text_track(
            req, prompt_ids, completions, formatter=bundle.prompts, temperature=block.temperature
        )
        return RolloutResp(
            tracks={self.track_name: track},
            timings={"encode": t_encode, "generate": t_generate, **self.engine_timings()},
        )

    def engine_timings(self) -> dict[str, float]:
        """The engine's prefill and decode seconds of the last call (empty for the loop)."""
        if self.engine is None:
            return {}
        return {"prefill": self.engine.stats.prefill_s, "decode": self.engine.stats.decode_s}

    # -- the policy the losses replay -------------------------------------------------------------

    def token_log_probs(self, conditions: PromptConditions, segment: TextSegment) -> Packed:
        """log π(y_t | y_<t) at every loss token of the packed rows (0 elsewhere: prompt
        tokens, each row's first token), fp32, with the segment's offsets; differentiable
        under the caller's grad mode. π is ``softmax(logits / conditions.temperature)``.

        Layout: with ``flash_attention_2`` the rows run packed as one ``[1, T]`` sequence whose
        ``position_ids`` restart at each row (varlen attention, no padding); otherwise as a
        right-padded ``[rows, longest]`` batch with plain causal attention (SDPA's causal
        kernel; a padded tail only follows its row's tokens, so no row sees another or a pad).
        A packed sequence under SDPA would need a dense block-diagonal mask over all ``T``
        tokens: rows x more attention work than the padded batch."""
        bundle = self.bundle
        device = bundle.device
        tokens = segment.tokens.values.to(device)
        offsets = segment.tokens.offsets.to(device)
        positions = packed_positions(offsets)
        if segment.loss_mask is not None:
            wanted = segment.loss_mask.values.to(device).bool() & (positions > 0)
        else:
            wanted = positions > 0
        targets = wanted.nonzero()[:, 0]
        if targets.numel() == 0:
            raise ValueError("token_log_probs: the micro-batch holds no token to score")
        if self._packed_replay():
            with bundle.autocast():
                out = bundle.model(
                    input_ids=tokens[None],
                    position_ids=positions[None],
                    use_cache=False,
                    logits_to_keep=targets - 1,  # the position before each target predicts it
                )
            logits = out.logits[0]
        else:
            lengths = offsets[1:] - offsets[:-1]
            rows = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
            width = int(lengths.max())
            ids = torch.full((len(lengths), width), bundle.pad_token_id, device=device)
            ids[rows, positions] = tokens
            columns = torch.unique(positions[targets] - 1)  # logits only where a row needs one
            with bundle.autocast():
                out = bundle.model(input_ids=ids, use_cache=False, logits_to_keep=columns)
            column_of = torch.full((width,), -1, dtype=torch.long, device=device)
            column_of[columns] = torch.arange(len(columns), device=device)
            logits = out.logits[rows[targets], column_of[positions[targets] - 1]]
        logits = suppress(logits.float(), bundle.prompts.suppressed_token_ids)
        logits = logits / float(conditions.temperature)
        picked = torch.log_softmax(logits, dim=-1).gather(1, tokens[targets][:, None])[:, 0]
        values = torch.zeros(tokens.shape[0], dtype=torch.float32, device=device)
        values = values.index_put((targets,), picked)
        return Packed(values=values, offsets=segment.tokens.offsets)

    def _attach_value_head(self) -> None:
        model = self.bundle.model
        require(
            hasattr(model, "model") and hasattr(model.config, "hidden_size"),
            f"pipeline.value_head needs a causal LM with a backbone (.model) and "
            f"config.hidden_size; {type(model).__name__} has not",
        )
        if getattr(model, "value_head", None) is None:
            anchor = next(model.parameters())
            head = torch.nn.Linear(model.config.hidden_size, 1)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            model.value_head = head.to(device=anchor.device, dtype=anchor.dtype)

    def token_values(self, conditions: PromptConditions, segment: TextSegment) -> Packed:
        """V(s_t) at every loss token (0 elsewhere), fp32: the value head on the backbone's
        last hidden state at the position that predicts token t (the one whose logits
        :meth:`token_log_probs` reads); differentiable under the caller's grad mode. Rows run
        as a right-padded batch (plain causal attention)."""
        require(self.has_value_head, "token_values needs the pipeline built with value_head=true")
        bundle = self.bundle
        device = bundle.device
        tokens = segment.tokens.values.to(device)
        offsets = segment.tokens.offsets.to(device)
        positions = packed_positions(offsets)
        wanted = positions > 0
        if segment.loss_mask is not None:
            wanted = wanted & segment.loss_mask.values.to(device).bool()
        targets = wanted.nonzero()[:, 0]
        lengths = offsets[1:] - offsets[:-1]
        rows = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
        ids = torch.full((len(lengths), int(lengths.max())), bundle.pad_token_id, device=device)
        ids[rows, positions] = tokens
        model = bundle.model
        with bundle.autocast():
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            picked = model.value_head(hidden[rows[targets], positions[targets] - 1])[:, 0]
        values = torch.zeros(tokens.shape[0], dtype=torch.float32, device=device)
        values = values.index_put((targets,), picked.float())
        return Packed(values=values, offsets=segment.tokens.offsets)

    def _packed_replay(self) -> bool:
        """Rows packed into one sequence only where attention is varlen (flash-attention 2)."""
        return getattr(self.bundle.config, "attn_implementation", "sdpa") == "flash_attention_2"
