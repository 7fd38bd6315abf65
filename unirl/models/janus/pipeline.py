"""Sampling and replay of Janus-Pro: the text stage, the image-token stage, and the
think-then-draw sampler that chains them on one worker.

- :class:`JanusTextPipeline`: the shared causal-LM sampler and token policy
  (``CausalLMPipeline``) on Janus's LM head: track ``text`` (the semantic plan).
- :class:`JanusImagePipeline`: image generation as token sampling. Each sample's context
  (prompt, the plan when there is one, ``<begin_of_image>``) and its unconditional copy (every
  token but BOS and ``<begin_of_image>`` padded) run as one ``[cond; uncond]`` batch through a
  KV cache; each step's generation-head logits are guided ``uncond + w·(cond - uncond)``
  (transformers' ``ClassifierFreeGuidanceLogitsProcessor``), a token is drawn from
  ``softmax(guided / T)`` (``top_k`` / ``top_p`` of the request truncate the draw, not the
  recorded policy, as in the text sampler) with the sample's own uniform (inverse CDF;
  ``rng: per_sample``, the default) or, with ``rng: batch``, by ``torch.multinomial`` over the
  whole batch in transformers' own draw order; its fp32 log-prob recorded, and the token's
  generation embedding fed to both branches. The track's
  ``TextSegment`` packs context + image tokens (loss mask on the image tokens);
  :meth:`JanusImagePipeline.token_log_probs` replays that policy in one forward per micro-batch
  (the ``TokenPolicy`` protocol the GRPO loss reads). ``decoded``: the VQ decoder's pixels.
- :class:`JanusPipeline`: think, then draw. ``generate(req)`` samples the ``text`` track (the
  plan), and draws one image per text sample conditioned on the exact packed ids (prompt + plan,
  stop token included) + ``<begin_of_image>``: track ``image``, ``parent_ids`` = the text
  samples.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar, Literal

import torch

from unirl.config.require import require
from unirl.models.common_ar.generate import draw_tokens, policy_log_probs
from unirl.models.common_ar.pipeline import CausalLMPipeline
from unirl.models.janus.conditions import ImageTokenConditions, ImageTokenRequest
from unirl.types import (
    Images,
    Packed,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    TextRequest,
    TextSegment,
)

TEXT_TRACK = "text"
IMAGE_TRACK = "image"
RNG_MODES = ("per_sample", "batch")


class JanusTextPipeline(CausalLMPipeline):
    """:class:`~unirl.models.common_ar.pipeline.CausalLMPipeline` for a ``JanusBundle`` (track
    ``text``; every knob of the shared pipeline)."""


def guided_logits(logits: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """``logits[2R, ...]`` = ``[cond; uncond]`` -> ``uncond + (cond - uncond)·w`` in fp32 (the
    op order of transformers' CFG processor); ``w = 1``: ``cond`` alone."""
    cond, uncond = logits.float().chunk(2, dim=0)
    if guidance_scale == 1.0:
        return cond
    return uncond + (cond - uncond) * guidance_scale


def draw_batch(
    guided: torch.Tensor,
    *,
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``tokens[R]`` from guided logits ``[R, codebook]`` exactly as transformers'
    ``JanusForConditionalGeneration.generate(generation_mode="image")`` draws them: its own
    warpers in its order (temperature, top-k, top-p; after the CFG processor), ``softmax``, then
    one ``torch.multinomial(probs, 1)`` over the whole batch from ``generator`` (None: torch's
    global RNG of the logits' device, what transformers uses). Argmax at temperature 0 (no
    random number drawn). ``top_k = -1`` / ``top_p = 1``: off (transformers' 0 / 1.0)."""
    if temperature == 0:
        return guided.argmax(dim=-1)
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    no_ids: Any = None  # the warpers never read the ids
    scores = guided
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(no_ids, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(no_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(no_ids, scores)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids[R, L], mask[R, L])`` left-padded (every row's last token at the end)."""
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, longest - len(r) :] = torch.as_tensor(r, dtype=torch.long)
        mask[i, longest - len(r) :] = 1
    return ids, mask


class JanusImagePipeline:
    """Janus's image stage (see the module docstring). ``forward_batch_size``: images sampled at
    once (None: the whole shard). ``track_name``: its track and request block (``image``).

    ``rng``: where the random numbers of the image tokens come from.

    - ``per_sample`` (default): each sample draws by inverse CDF from its own uniform stream
      (``ImageTokenRequest.uniforms``, seeded by ``(seed, sample id)``), so a sample's image is
      independent of its batch neighbours, of ``forward_batch_size`` and of the rank it lands
      on: the same sample id gives the same image whatever the data-parallel split.
    - ``batch``: transformers' own draw (:func:`draw_batch`): one ``torch.multinomial`` over the
      batch per step, from one generator seeded by ``ImageTokenRequest.batch_seed`` (the
      request's seed and the shard's first seed id). Given that generator in the state
      ``torch.manual_seed(s)`` leaves the global RNG in, the tokens equal
      ``generate(generation_mode="image", do_sample=True)`` on the same left-padded batch
      token for token (fp32; each ``forward_batch_size`` chunk draws as one ``generate`` call,
      chunk after chunk). A sample's image then depends on its batch: use it to reproduce
      transformers' samples, not for training runs that reshard.

    The recorded log-probs and the replay are the same in both modes (the policy does not
    depend on where the random numbers come from)."""

    image_output: ClassVar[str] = "tokens"  # what the unified trainer authors for this stage

    def __init__(
        self,
        *,
        bundle: Any,
        forward_batch_size: int | None = None,
        track_name: str = IMAGE_TRACK,
        rng: Literal["per_sample", "batch"] = "per_sample",
    ) -> None:
        require(
            forward_batch_size is None or forward_batch_size >= 1,
            "unified.image.pipeline.forward_batch_size must be >= 1 or null",
        )
        require(
            rng in RNG_MODES,
            f"unified.image.pipeline.rng={rng!r} must be 'per_sample' (each sample its own "
            "stream; the default) or 'batch' (transformers' own multinomial draw order)",
        )
        self.bundle = bundle
        self.forward_batch_size = forward_batch_size
        self.track_name = track_name
        self.rng = rng

    # -- sampling ----------------------------------------------------------------------------------

    def _both(self, contexts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[cond; uncond]`` ids, mask and positions ``[2R, L]`` of left-padded contexts."""
        bundle = self.bundle
        ids, mask = left_padded(contexts, bundle.pad_token_id)
        ids = torch.cat([ids, bundle.unconditional_ids(ids)])
        mask = torch.cat([mask, mask])
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        device = bundle.device
        return ids.to(device), mask.to(device), positions.to(device)

    @torch.no_grad()
    def sample_tokens(
        self,
        contexts: list[list[int]],
        uniforms: torch.Tensor | None,
        *,
        guidance_scale: float,
        temperature: float,
        top_k: int = -1,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens[R, N], log_probs[R, N])`` for each context (ending with
        ``<begin_of_image>``), ``N`` the model's image tokens, drawn from
        ``softmax(guided / temperature)`` truncated to ``top_k`` / ``top_p`` (argmax at
        temperature 0): with ``uniforms[R, >= N]`` (inverse CDF, per sample) or, when
        ``uniforms`` is None, by :func:`draw_batch` from ``generator`` (None: torch's global
        RNG). Log-probs are of the untruncated policy (temperature 1 when greedy). KV-cached, in
        chunks of ``forward_batch_size``."""
        from transformers import DynamicCache

        n = self.bundle.num_image_tokens
        require(
            uniforms is None or (uniforms.shape[0] >= len(contexts) and uniforms.shape[1] >= n),
            f"uniforms must be [R={len(contexts)}, >= {n}]",
        )
        chunk = self.forward_batch_size or max(len(contexts), 1)
        tokens, logps = [], []
        for start in range(0, len(contexts), chunk):
            rows = contexts[start : start + chunk]
            u_rows = uniforms[start : start + chunk] if uniforms is not None else None
            ids, mask, positions = self._both(rows)
            cache = DynamicCache()
            model = self.bundle.model
            out = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
                image_head=True,
            )
            picked, chosen_lp = [], []
            for step in range(n):
                logits = guided_logits(out.logits[:, -1], guidance_scale)
                if u_rows is None:
                    chosen = draw_batch(
                        logits,
                        temperature=temperature,
                        top_k=top_k,
                        top_p=top_p,
                        generator=generator,
                    )
                else:
                    u = u_rows[:, step].to(logits.device)
                    chosen = draw_tokens(
                        logits, u, temperature=temperature, top_p=top_p, top_k=top_k
                    )
                lp = policy_log_probs(logits, temperature).gather(1, chosen[:, None])[:, 0]
                picked.append(chosen)
                chosen_lp.append(lp)
                if step == n - 1:
                    break
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                positions = positions[:, -1:] + 1
                out = model(
                    image_tokens=torch.cat([chosen, chosen])[:, None],
                    attention_mask=mask,
                    position_ids=positions,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                    image_head=True,
                )
            tokens.append(torch.stack(picked, dim=1).cpu())
            logps.append(torch.stack(chosen_lp, dim=1).float().cpu())
        return torch.cat(tokens), torch.cat(logps)

    @torch.no_grad()
    def generate(self, req: RolloutReq, context: list[list[int]] | None = None) -> RolloutResp:
        """This shard's images as one track: ``context`` (one row of ids per sample, without
        ``<begin_of_image>``) or, without it, each sample's formatted prompt."""
        bundle = self.bundle
        block = req.params_for(self.track_name, ImageTokenRequest)
        t0 = time.perf_counter()
        rows = context if context is not None else bundle.encode_prompts(req.prompts)
        require(len(rows) == len(req), f"{len(rows)} context rows for {len(req)} image samples")
        contexts = bundle.image_context([list(map(int, r)) for r in rows])
        uniforms, generator = None, None
        if self.rng == "per_sample":
            uniforms = block.uniforms(req.seed, bundle.num_image_tokens)
        else:
            generator = torch.Generator(device=bundle.device)
            generator.manual_seed(block.batch_seed(req.seed))
        t_encode = time.perf_counter() - t0
        t0 = time.perf_counter()
        with bundle.sampling_mode():
            tokens, logps = self.sample_tokens(
                contexts,
                uniforms,
                guidance_scale=float(block.guidance_scale),
                temperature=float(block.temperature),
                top_k=int(block.top_k),
                top_p=float(block.top_p),
                generator=generator,
            )
        t_generate = time.perf_counter() - t0
        t0 = time.perf_counter()
        with bundle.sampling_mode():
            pixels = bundle.decode_image_tokens(tokens).cpu()
        t_decode = time.perf_counter() - t0
        track = image_track(
            req, contexts, tokens, logps, pixels, block.temperature, block.guidance_scale
        )
        return RolloutResp(
            tracks={self.track_name: track},
            timings={"encode": t_encode, "generate": t_generate, "decode": t_decode},
        )

    # -- the policy the losses replay -------------------------------------------------------------

    def token_log_probs(self, conditions: ImageTokenConditions, segment: TextSegment) -> Packed:
        """log π(image token | context, earlier image tokens) at every image token of the packed
        rows (0 on the context), fp32, with the segment's offsets; differentiable under the
        caller's grad mode. One ``[cond; uncond]`` forward per micro-batch: contexts
        left-padded as in sampling, image tokens fed through the generation embedding, the
        generation head's logits guided and scaled as :meth:`sample_tokens` draws."""
        bundle = self.bundle
        device = bundle.device
        rows = segment.tokens.to_list()
        lengths = conditions.prompt_lengths.tolist()
        contexts = [r[: int(k)].tolist() for r, k in zip(rows, lengths, strict=True)]
        images = [r[int(k) :] for r, k in zip(rows, lengths, strict=True)]
        n = {int(x.numel()) for x in images}
        require(len(n) == 1, f"token_log_probs: image rows of unequal lengths {sorted(n)}")
        count = n.pop()
        image = torch.stack(images).to(device)
        ids, mask, positions = self._both(contexts)
        feed = torch.cat([image, image])[:, : count - 1]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], count - 1))], dim=1)
        positions = torch.cat(
            [positions, positions[:, -1:] + torch.arange(1, count, device=device)[None]], dim=1
        )
        with bundle.autocast():
            out = bundle.model(
                input_ids=ids,
                image_tokens=feed if count > 1 else None,
                attention_mask=mask,
                position_ids=positions,
                use_cache=False,
                logits_to_keep=count,
                image_head=True,
            )
        guided = guided_logits(out.logits, float(conditions.guidance_scale))
        picked = torch.log_softmax(guided / float(conditions.temperature), dim=-1)
        picked = picked.gather(2, image[..., None])[..., 0]  # [R, count]
        values = []
        for k, lp in zip(lengths, picked, strict=True):
            values.append(torch.cat([torch.zeros(int(k), device=device), lp]))
        return Packed(values=torch.cat(values), offsets=segment.tokens.offsets)


def image_track(
    req: RolloutReq,
    contexts: list[list[int]],
    tokens: torch.Tensor,
    logps: torch.Tensor,
    pixels: torch.Tensor,
    temperature: float,
    guidance_scale: float,
) -> RolloutTrack:
    """The image track: a ``TextSegment`` packing context then image tokens per sample
    (``loss_mask`` and recorded log-probs on the image tokens), ``ImageTokenConditions``,
    ``decoded`` pixels; metadata with ``image_tokens``."""
    rows, masks, lps = [], [], []
    for ctx, tok, lp in zip(contexts, tokens, logps, strict=True):
        rows.append(torch.cat([torch.tensor(ctx, dtype=torch.long), tok.long()]))
        masks.append(
            torch.cat(
                [torch.zeros(len(ctx), dtype=torch.bool), torch.ones(len(tok), dtype=torch.bool)]
            )
        )
        lps.append(torch.cat([torch.zeros(len(ctx)), lp.float()]))
    packed = Packed.from_list(rows)
    segment = TextSegment(
        tokens=packed,
        log_probs=Packed(values=torch.cat(lps), offsets=packed.offsets),
        loss_mask=Packed(values=torch.cat(masks), offsets=packed.offsets),
    )
    conditions = ImageTokenConditions(
        prompt_lengths=torch.tensor([len(c) for c in contexts], dtype=torch.long),
        temperature=temperature if temperature > 0 else 1.0,
        guidance_scale=float(guidance_scale),
    )
    metadata = [{**m, "image_tokens": int(tokens.shape[1])} for m in req.metadata]
    return RolloutTrack(
        sample_ids=req.sample_ids.clone(),
        group_ids=req.group_ids.clone(),
        prompts=list(req.prompts),
        metadata=metadata,
        conditions=conditions,
        segment=segment,
        decoded=Images(pixels=pixels),
    )


class JanusPipeline:
    """Think, then draw, on one worker: ``generate(req)`` returns the ``text`` track (the plan;
    the parent) and the ``image`` track (one image per text sample; ``parent_ids`` = the text
    sample ids). The request carries a ``TextRequest`` under ``text`` and an
    :class:`ImageTokenRequest` under ``image``, both authored by the driver."""

    track_name = TEXT_TRACK

    def __init__(self, *, text_pipeline: Any, image_pipeline: Any) -> None:
        self.text_pipeline = text_pipeline
        self.image_pipeline = image_pipeline

    @property
    def bundle(self) -> Any:
        return self.image_pipeline.bundle

    @property
    def forward_batch_size(self) -> int | None:
        return self.image_pipeline.forward_batch_size

    @forward_batch_size.setter
    def forward_batch_size(self, value: int | None) -> None:
        self.text_pipeline.forward_batch_size = value
        self.image_pipeline.forward_batch_size = value

    def generate(self, req: RolloutReq) -> RolloutResp:
        text_req = dataclasses.replace(
            req, stage_params={TEXT_TRACK: req.params_for(TEXT_TRACK, TextRequest)}
        )
        text_resp = self.text_pipeline.generate(text_req)
        text = text_resp.tracks[TEXT_TRACK]
        assert text.segment is not None
        context = [r.tolist() for r in text.segment.tokens.to_list()]  # prompt + plan, exact ids
        stage = req.params_for(IMAGE_TRACK, ImageTokenRequest)
        name = self.image_pipeline.track_name
        image_req = dataclasses.replace(req, stage_params={name: stage})
        image = self.image_pipeline.generate(image_req, context=context).tracks[name]
        plans = text.decoded.texts if text.decoded is not None else [""] * len(text)
        image = dataclasses.replace(
            image,
            parent_ids=text.sample_ids.clone(),
            parent_track=TEXT_TRACK,
            metadata=[{**m, "thought": t} for m, t in zip(image.metadata, plans, strict=True)],
        )
        timings = {f"{TEXT_TRACK}/{k}": v for k, v in text_resp.timings.items()}
        return RolloutResp(tracks={TEXT_TRACK: text, IMAGE_TRACK: image}, timings=timings)
