"""Janus-Pro (``unirl.models.janus``) against transformers' own ``JanusForConditionalGeneration``
on the ``tiny`` preset, fp32 on CPU.

- the text stage (the semantic plan) proves the shared text-family contract
  (``text_family_tester.py``; the reference is the wrapped Janus model's ``generate``);
- the image stage: greedy image-token sampling with classifier-free guidance equals
  transformers' ``generate(generation_mode="image")`` token for token; under transformers' own
  seeded sampling (``do_sample=True``), our replay's log-probs of the tokens it drew equal the
  log-softmax of its guided scores (recorded by a logits processor); our recorded log-probs
  equal the replay; a sample alone equals it in a batch; the VQ decode equals transformers'
  ``decode_image_tokens``; the first GRPO update on image tokens has ratio exactly 1;
- think then draw: the image track is conditioned on the exact ids of the written plan, and
  the joint step (``UnifiedTrainStack``: text GRPO + image GRPO, one optimizer step) starts
  with both ratios exactly 1; with ``stack.text.weight: 0`` only the image tokens train.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from text_family_tester import TextFamilyTester

from unirl.models.janus import (
    ImageTokenRequest,
    JanusBundle,
    JanusImagePipeline,
    JanusPipeline,
    JanusTextPipeline,
)
from unirl.types import RolloutReq, TextRequest, Texts

PROMPTS = ("a red cat", "hi", "a photo of a dog on a beach at noon", "x")
LOGP_ATOL = 2e-6
GUIDANCE = 3.0


class TestJanusTextFamily(TextFamilyTester):
    pipeline_class = JanusTextPipeline
    bundle_class = JanusBundle
    bundle_fields: ClassVar[dict[str, Any]] = {}

    def hf_model(self, bundle: Any) -> Any:
        return bundle.janus


@pytest.fixture(scope="module")
def bundle() -> JanusBundle:
    return JanusBundle(path="tiny", dtype="fp32", device="cpu")


def image_request(
    ids: list[int], rows: list[int], *, temperature: float = 1.0, guidance: float = GUIDANCE
) -> RolloutReq:
    seed_ids = torch.tensor(ids)
    return RolloutReq(
        sample_ids=seed_ids,
        group_ids=torch.zeros(len(ids), dtype=torch.long),
        primitives={"text": Texts(texts=[PROMPTS[r] for r in rows])},
        stage_params={
            "image": ImageTokenRequest(
                seed_ids=seed_ids,
                max_new_tokens=16,
                temperature=temperature,
                guidance_scale=guidance,
            )
        },
        seed=0,
    )


def test_greedy_image_tokens_equal_transformers_generate(bundle: JanusBundle) -> None:
    rows = list(range(len(PROMPTS)))
    pipe = JanusImagePipeline(bundle=bundle, forward_batch_size=3)  # two chunks, left padding
    track = pipe.generate(image_request(rows, rows, temperature=0.0)).tracks["image"]
    contexts = bundle.image_context(bundle.encode_prompts(list(PROMPTS)))
    unguided = pipe.generate(image_request(rows, rows, temperature=0.0, guidance=1.0))
    with bundle.sampling_mode():
        for i in (0, 2):  # a short and the longest prompt (both left-padded in our batch)
            ctx = contexts[i]
            x = torch.tensor([ctx])
            theirs = bundle.janus.generate(
                x,
                attention_mask=torch.ones_like(x),
                generation_mode="image",
                do_sample=False,
                guidance_scale=GUIDANCE,
            )
            ours = track.segment.tokens.row(i)
            assert ours[: len(ctx)].tolist() == ctx
            assert ours[len(ctx) :].tolist() == theirs[0].tolist(), i
    # guidance matters here: the unguided tokens differ from the guided ones
    assert not torch.equal(
        unguided.tracks["image"].segment.tokens.values, track.segment.tokens.values
    )


def test_replay_of_transformers_seeded_samples_equals_its_guided_scores(
    bundle: JanusBundle,
) -> None:
    from transformers import LogitsProcessor, LogitsProcessorList
    from transformers.generation.logits_process import ClassifierFreeGuidanceLogitsProcessor

    class Record(LogitsProcessor):
        def __init__(self) -> None:
            self.scores: list[torch.Tensor] = []

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.scores.append(scores.clone())  # [cond; uncond] before the CFG processor
            return scores

    pipe = JanusImagePipeline(bundle=bundle)
    ctx = bundle.image_context(bundle.encode_prompts([PROMPTS[2]]))[0]
    record = Record()
    torch.manual_seed(3)
    x = torch.tensor([ctx])
    with bundle.sampling_mode():
        tokens = bundle.janus.generate(
            x,
            attention_mask=torch.ones_like(x),
            generation_mode="image",
            do_sample=True,
            top_k=0,
            guidance_scale=GUIDANCE,
            logits_processor=LogitsProcessorList([record]),
        )[0]
    assert len(record.scores) == 16 and len(set(tokens.tolist())) > 3  # really sampled
    cfg = ClassifierFreeGuidanceLogitsProcessor(GUIDANCE)  # transformers' own guidance
    theirs = torch.stack(
        [
            torch.log_softmax(cfg(x, s).float(), -1)[0, t]
            for s, t in zip(record.scores, tokens.tolist(), strict=True)
        ]
    )
    from unirl.models.janus.pipeline import image_track

    req = image_request([0], [2])
    track = image_track(
        req, [ctx], tokens[None], torch.zeros(1, 16), torch.zeros(1, 3, 32, 32), 1.0, GUIDANCE
    )
    with torch.no_grad():
        replay = pipe.token_log_probs(track.conditions, track.segment).values
    mask = track.segment.loss_mask.values
    torch.testing.assert_close(replay[mask], theirs, atol=LOGP_ATOL, rtol=0)
    # the guidance scale is part of the replayed policy
    wrong = dataclasses.replace(track.conditions, guidance_scale=1.0)
    with torch.no_grad():
        off = pipe.token_log_probs(wrong, track.segment).values
    assert float((off[mask] - theirs).abs().max()) > 1e-3


def test_recorded_log_probs_equal_the_replay_and_a_sample_alone_equals_it_in_a_batch(
    bundle: JanusBundle,
) -> None:
    rows = list(range(len(PROMPTS)))
    pipe = JanusImagePipeline(bundle=bundle, forward_batch_size=3)
    together = pipe.generate(image_request([10, 11, 12, 13], rows)).tracks["image"]
    seg = together.segment
    with torch.no_grad():
        replay = pipe.token_log_probs(together.conditions, seg).values
    m = seg.loss_mask.values
    assert int(m.sum()) == 4 * bundle.num_image_tokens
    torch.testing.assert_close(seg.log_probs.values[m], replay[m], atol=LOGP_ATOL, rtol=0)
    assert torch.all(replay[~m] == 0) and torch.all(seg.log_probs.values[m] < 0)
    alone = pipe.generate(image_request([12], [2])).tracks["image"]
    assert torch.equal(alone.segment.tokens.row(0), seg.tokens.row(2))
    torch.testing.assert_close(
        alone.segment.log_probs.row(0), seg.log_probs.row(2), atol=LOGP_ATOL, rtol=0
    )
    # the VQ decoder's convolutions batch differently: pixels equal to float rounding
    torch.testing.assert_close(
        alone.decoded.pixels[0], together.decoded.pixels[2], atol=1e-5, rtol=0
    )
    other = pipe.generate(image_request([99], [2])).tracks["image"]  # the seed id matters
    assert not torch.equal(other.segment.tokens.row(0), seg.tokens.row(2))


def test_vq_decode_equals_transformers_decode(bundle: JanusBundle) -> None:
    tokens = torch.randint(
        0,
        bundle.codebook_size,
        (3, bundle.num_image_tokens),
        generator=torch.Generator().manual_seed(0),
    )
    ours = bundle.decode_image_tokens(tokens)
    with torch.no_grad():
        theirs = bundle.janus.decode_image_tokens(tokens).permute(0, 3, 1, 2)
    assert ours.shape == (3, 3, 32, 32)
    assert torch.equal(ours, (theirs.float() / 2 + 0.5).clamp(0, 1))
    assert float((ours[0] - ours[1]).abs().max()) > 1e-2  # the codes decode to different pixels


def _backend(bundle: JanusBundle, lora: bool) -> Any:
    from unirl.train import FSDPBackend, LoraConfig

    return FSDPBackend(
        bundle=bundle,
        lora=LoraConfig(rank=4, alpha=8) if lora else None,
        optimizer={"lr": 1e-2},
        param_dtype="fp32",
        trainable_attr="model",
    )


def test_first_grpo_ratio_on_image_tokens_is_exactly_one() -> None:
    from unirl.algorithms import GRPO
    from unirl.train import TrainStack

    own = JanusBundle(path="tiny", dtype="fp32", device="cpu")
    pipe = JanusImagePipeline(bundle=own)
    backend = _backend(own, lora=True)
    algo = GRPO(policy=pipe, clip_low=0.2, clip_high=0.28, old_logp_source="replay")
    stack = TrainStack(backend=backend, algorithm=algo, num_updates_per_batch=2, micro_batch_size=2)
    rows = list(range(len(PROMPTS)))
    track = pipe.generate(image_request(rows, rows)).tracks["image"]
    out = stack.train_track(
        dataclasses.replace(track, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5])), 0
    )
    first, second = out["steps"]
    assert first["ratio/min"] == 1.0 == first["ratio/max"], first
    assert second["ratio/min"] != 1.0 or second["ratio/max"] != 1.0, second


def think_then_draw_request(ids: list[int]) -> RolloutReq:
    seed_ids = torch.tensor(ids)
    return RolloutReq(
        sample_ids=seed_ids,
        group_ids=torch.zeros(len(ids), dtype=torch.long),
        primitives={"text": Texts(texts=[PROMPTS[i % len(PROMPTS)] for i in ids])},
        stage_params={
            "text": TextRequest(seed_ids=seed_ids, max_new_tokens=6, temperature=1.0),
            "image": ImageTokenRequest(
                seed_ids=seed_ids, max_new_tokens=16, temperature=1.0, guidance_scale=GUIDANCE
            ),
        },
        seed=0,
    )


@pytest.mark.parametrize("text_weight", [0.5, 0.0])
def test_think_then_draw_joint_step_first_ratios_are_one(text_weight: float) -> None:
    from unirl.algorithms import GRPO
    from unirl.train.unified_stack import UnifiedTrainStack

    own = JanusBundle(path="tiny", dtype="fp32", device="cpu")
    text_pipe = JanusTextPipeline(bundle=own, sampler="loop")
    image_pipe = JanusImagePipeline(bundle=own)
    resp = JanusPipeline(text_pipeline=text_pipe, image_pipeline=image_pipe).generate(
        think_then_draw_request([0, 1, 2, 3])
    )
    text, image = resp.tracks["text"], resp.tracks["image"]
    assert torch.equal(image.parent_ids, text.sample_ids) and image.parent_track == "text"
    for i in range(4):  # the image's context is the plan's exact ids, then <begin_of_image>
        ctx_len = int(image.conditions.prompt_lengths[i])
        assert image.segment.tokens.row(i)[:ctx_len].tolist() == [
            *text.segment.tokens.row(i).tolist(),
            own.boi_token_id,
        ]
    backend = _backend(own, lora=False)
    stack = UnifiedTrainStack(
        backend=backend,
        text_algorithm=GRPO(policy=text_pipe, old_logp_source="replay"),
        image_algorithm=GRPO(policy=image_pipe, old_logp_source="replay"),
        text={"weight": text_weight, "max_tokens_per_micro_batch": 256},
        image={"weight": 1.0, "micro_batch_size": 2},
    )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    before = [p.detach().clone() for p in own.janus.model.language_model.parameters()]
    out = stack._train_tracks(
        dataclasses.replace(text, advantages=adv, decoded=None),
        dataclasses.replace(image, advantages=adv, decoded=None),
        0,
    )
    step = out["steps"][0]
    assert step["image/ratio/min"] == 1.0 == step["image/ratio/max"], step
    if text_weight > 0:
        assert step["text/ratio/min"] == 1.0 == step["text/ratio/max"], step
    else:  # image tokens only: the text loss is not computed
        assert "text/ratio/min" not in step and step["text/loss"] == 0.0
    after = list(own.janus.model.language_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
