"""Janus-Pro (``unirl.models.janus``) against transformers' own ``JanusForConditionalGeneration``
on the ``tiny`` preset, fp32 on CPU: seeded sampling and understanding prompts.

- ``JanusImagePipeline(rng="batch")`` draws image tokens in transformers' own order: after
  ``torch.manual_seed(s)``, our tokens equal ``generate(generation_mode="image",
  do_sample=True)`` on the same left-padded batch token for token (several seeds, batch of 4,
  temperature 1, top-k, temperature + top-k + top-p); the log-probs we record equal the
  trainer's replay (``token_log_probs``) within 2e-6; ``generate()`` seeds its own generator
  from the request and draws chunk after chunk as transformers' calls would, leaving the global
  RNG alone. Drawing the rows in another order (a mutation of :func:`draw_batch`) breaks the
  equality.
- An understanding prompt (an image through the SigLIP tower and aligner, transformers' own
  image processor) gives our policy the same next-token logits as an independently loaded
  transformers model (1e-5), and our greedy text (the loop sampler and the decode engine)
  equals its ``generate``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from unirl.models.janus import ImageTokenRequest, JanusBundle, JanusImagePipeline, JanusTextPipeline
from unirl.models.janus import pipeline as janus_pipeline
from unirl.models.janus.pipeline import image_track, left_padded
from unirl.types import RolloutReq, TextRequest, Texts

PROMPTS = ("a red cat", "hi", "a photo of a dog on a beach at noon", "x")  # 4 lengths: left pads
GUIDANCE = 3.0
LOGP_ATOL = 2e-6
LOGITS_ATOL = 1e-5
# (ours: temperature, top_k, top_p) and transformers' generate kwargs for the same policy
SETTINGS = {
    "t1": ((1.0, -1, 1.0), {"temperature": 1.0, "top_k": 0}),
    "t1_topk8": ((1.0, 8, 1.0), {"temperature": 1.0, "top_k": 8}),
    "t07_topk20_topp09": ((0.7, 20, 0.9), {"temperature": 0.7, "top_k": 20, "top_p": 0.9}),
}


@pytest.fixture(scope="module")
def bundle() -> JanusBundle:
    return JanusBundle(path="tiny", dtype="fp32", device="cpu")


def transformers_image_tokens(
    bundle: JanusBundle, contexts: list[list[int]], **kwargs: Any
) -> torch.Tensor:
    ids, mask = left_padded(contexts, bundle.pad_token_id)
    with bundle.sampling_mode():
        return bundle.janus.generate(
            ids,
            attention_mask=mask,
            generation_mode="image",
            do_sample=True,
            guidance_scale=GUIDANCE,
            **kwargs,
        )


def ours_global_rng(
    pipe: JanusImagePipeline, contexts: list[list[int]], ours: tuple[float, int, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    temperature, top_k, top_p = ours
    with pipe.bundle.sampling_mode():
        return pipe.sample_tokens(
            contexts,
            None,  # batch draw from torch's global RNG, as transformers
            guidance_scale=GUIDANCE,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )


def replayed(
    pipe: JanusImagePipeline,
    contexts: list[list[int]],
    tokens: torch.Tensor,
    logps: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(recorded, replayed) log-probs of the image tokens through the track the trainer reads."""
    n = len(contexts)
    req = RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.zeros(n, dtype=torch.long),
        primitives={"text": Texts(texts=list(PROMPTS[:n]))},
        seed=0,
    )
    pixels = torch.zeros(n, 3, 32, 32)
    track = image_track(req, contexts, tokens, logps, pixels, temperature, GUIDANCE)
    with torch.no_grad():
        replay = pipe.token_log_probs(track.conditions, track.segment).values
    mask = track.segment.loss_mask.values
    return track.segment.log_probs.values[mask], replay[mask]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_batch_rng_image_tokens_equal_transformers_seeded_generate(
    bundle: JanusBundle, seed: int, setting: str
) -> None:
    ours_knobs, their_knobs = SETTINGS[setting]
    pipe = JanusImagePipeline(bundle=bundle, rng="batch")
    contexts = bundle.image_context(bundle.encode_prompts(list(PROMPTS)))
    torch.manual_seed(seed)
    theirs = transformers_image_tokens(bundle, contexts, **their_knobs)
    torch.manual_seed(seed)
    tokens, logps = ours_global_rng(pipe, contexts, ours_knobs)
    assert tokens.shape == (4, bundle.num_image_tokens)
    assert torch.equal(tokens, theirs), (tokens, theirs)
    assert len(set(tokens.flatten().tolist())) > 8  # really sampled, not a constant
    recorded, replay = replayed(pipe, contexts, tokens, logps, ours_knobs[0])
    torch.testing.assert_close(recorded, replay, atol=LOGP_ATOL, rtol=0)
    assert torch.all(recorded < 0)


def test_the_seed_matters_and_per_sample_streams_differ_from_transformers(
    bundle: JanusBundle,
) -> None:
    contexts = bundle.image_context(bundle.encode_prompts(list(PROMPTS)))
    pipe = JanusImagePipeline(bundle=bundle, rng="batch")
    torch.manual_seed(0)
    first, _ = ours_global_rng(pipe, contexts, SETTINGS["t1"][0])
    torch.manual_seed(1)
    second, _ = ours_global_rng(pipe, contexts, SETTINGS["t1"][0])
    assert not torch.equal(first, second)
    # the default per-sample streams are not transformers' draw order
    own = JanusImagePipeline(bundle=bundle)
    uniforms = torch.rand(4, bundle.num_image_tokens, generator=torch.Generator().manual_seed(0))
    with bundle.sampling_mode():
        per_sample, _ = own.sample_tokens(
            contexts, uniforms.double(), guidance_scale=GUIDANCE, temperature=1.0
        )
    assert not torch.equal(per_sample, first)


def test_drawing_rows_in_another_order_breaks_the_equality(
    bundle: JanusBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation the equality test must catch: the same multinomial, rows reversed."""
    draw = janus_pipeline.draw_batch

    def reversed_rows(guided: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return draw(guided.flip(0), **kwargs).flip(0)

    contexts = bundle.image_context(bundle.encode_prompts(list(PROMPTS)))
    torch.manual_seed(0)
    theirs = transformers_image_tokens(bundle, contexts, top_k=0)
    monkeypatch.setattr(janus_pipeline, "draw_batch", reversed_rows)
    torch.manual_seed(0)
    mutated, _ = ours_global_rng(
        JanusImagePipeline(bundle=bundle, rng="batch"), contexts, SETTINGS["t1"][0]
    )
    assert not torch.equal(mutated, theirs)


def test_batch_rng_generate_seeds_its_own_generator_and_draws_chunk_after_chunk(
    bundle: JanusBundle,
) -> None:
    ids = torch.tensor([5, 6, 7, 8])
    block = ImageTokenRequest(
        seed_ids=ids, max_new_tokens=16, temperature=1.0, top_k=8, guidance_scale=GUIDANCE
    )
    req = RolloutReq(
        sample_ids=ids,
        group_ids=torch.zeros(4, dtype=torch.long),
        primitives={"text": Texts(texts=list(PROMPTS))},
        stage_params={"image": block},
        seed=3,
    )
    pipe = JanusImagePipeline(bundle=bundle, rng="batch", forward_batch_size=2)
    state = torch.get_rng_state()
    track = pipe.generate(req).tracks["image"]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    contexts = bundle.image_context(bundle.encode_prompts(list(PROMPTS)))
    torch.manual_seed(block.batch_seed(3))  # transformers, one call per chunk
    theirs = torch.cat(
        [transformers_image_tokens(bundle, contexts[i : i + 2], top_k=8) for i in (0, 2)]
    )
    for i in range(4):
        ctx_len = len(contexts[i])
        assert track.segment.tokens.row(i)[ctx_len:].tolist() == theirs[i].tolist(), i
    again = pipe.generate(req).tracks["image"]  # the request's seed fixes the draws
    assert torch.equal(again.segment.tokens.values, track.segment.tokens.values)
    shifted = ImageTokenRequest(
        seed_ids=ids + 10, max_new_tokens=16, temperature=1.0, guidance_scale=GUIDANCE
    )
    assert shifted.batch_seed(3) != block.batch_seed(3)  # another shard, another stream


def test_rng_mode_is_checked_with_one_clear_line(bundle: JanusBundle) -> None:
    with pytest.raises(ValueError, match=r"unified\.image\.pipeline\.rng='global'"):
        JanusImagePipeline(bundle=bundle, rng="global")  # type: ignore[arg-type]


# -- understanding prompts: an image through SigLIP and the aligner --------------------------------


def understanding_inputs(bundle: JanusBundle) -> tuple[list[list[int]], torch.Tensor]:
    """Two chat prompts of different lengths, each with one image's placeholders, and their
    ``pixel_values`` from transformers' own Janus image processor (random RGB images)."""
    from transformers import JanusImageProcessorPil

    from unirl.models.janus.tiny import BOI, EOI, IMAGE_PLACEHOLDER

    n = bundle.num_image_tokens
    texts = [
        f"{BOI}{IMAGE_PLACEHOLDER * n}{EOI} what is in the picture?",
        f"{BOI}{IMAGE_PLACEHOLDER * n}{EOI} hi",
    ]
    ids = bundle.encode_prompts(texts)
    placeholder = int(bundle.janus.config.image_token_id)
    assert [row.count(placeholder) for row in ids] == [n, n]
    size = int(bundle.janus.config.vision_config.image_size)
    gen = torch.Generator().manual_seed(0)
    images = [
        torch.randint(0, 256, (size, size, 3), generator=gen, dtype=torch.uint8).numpy()
        for _ in texts
    ]
    processor = JanusImageProcessorPil(size={"height": size, "width": size})
    pixels = processor(images, return_tensors="pt")["pixel_values"]
    return ids, pixels


@pytest.fixture(scope="module")
def reference_janus() -> Any:
    """An independently loaded transformers model of the same tiny weights."""
    from transformers import JanusForConditionalGeneration

    from unirl.models.janus.presets import tiny_preset_path

    model = JanusForConditionalGeneration.from_pretrained(
        str(tiny_preset_path()), dtype=torch.float32
    )
    return model.eval()


def test_understanding_prompt_logits_equal_transformers_forward(
    bundle: JanusBundle, reference_janus: Any
) -> None:
    ids, pixels = understanding_inputs(bundle)
    x, mask = left_padded(ids, bundle.pad_token_id)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        theirs = reference_janus(input_ids=x, attention_mask=mask, pixel_values=pixels).logits
        ours = bundle.model(
            input_ids=x, attention_mask=mask, position_ids=positions, pixel_values=pixels
        ).logits
        blank = bundle.model(
            input_ids=x,
            attention_mask=mask,
            position_ids=positions,
            pixel_values=torch.zeros_like(pixels),
        ).logits
    torch.testing.assert_close(ours[:, -1], theirs[:, -1], atol=LOGITS_ATOL, rtol=0)
    # the image reaches the logits: another image moves them far beyond the tolerance
    assert float((blank[:, -1] - theirs[:, -1]).abs().max()) > 1e-2


@pytest.mark.parametrize("sampler", ["loop", "engine"])
def test_understanding_prompt_greedy_text_equals_transformers_generate(
    bundle: JanusBundle, reference_janus: Any, sampler: str
) -> None:
    from unirl.models.common_ar.engine import hf_prefill

    ids, pixels = understanding_inputs(bundle)
    steps = 8
    x, mask = left_padded(ids, bundle.pad_token_id)
    with torch.no_grad():
        theirs = reference_janus.generate(
            x, attention_mask=mask, pixel_values=pixels, do_sample=False, max_new_tokens=steps
        )[:, x.shape[1] :]
    pipe = JanusTextPipeline(bundle=bundle, sampler=sampler)
    block = TextRequest(seed_ids=torch.arange(2), max_new_tokens=steps, temperature=0.0)
    uniforms = torch.zeros(2, steps, dtype=torch.float64)

    def image_of(rows: Any) -> dict[str, torch.Tensor]:
        return {"pixel_values": pixels[list(rows)]}

    with bundle.sampling_mode():
        if sampler == "engine":  # the default sampler: a prefill through Janus's own forward
            prefill = hf_prefill(
                bundle.model, ids, pad_token_id=bundle.pad_token_id, extra_inputs=image_of
            )
            keys = [(tuple(r), i) for i, r in enumerate(ids)]
            completions = pipe.sample(ids, uniforms, block, prefix_keys=keys, prefill=prefill)
        else:
            completions = pipe.sample(ids, uniforms, block, prefill_inputs_for=image_of)
    for i, completion in enumerate(completions):
        want = theirs[i].tolist()
        if set(want) & set(bundle.stop_token_ids):
            cut = min(want.index(t) for t in bundle.stop_token_ids if t in want)
            want = want[: cut + 1]  # ours stops at the stop token
        assert completion.tokens == want, i


# -- the *-arch presets against the public configs (sources: unirl/models/janus/arch.py) -----------

# released / converted config.json values, as the public copies state them
PUBLIC = {
    "janus-pro-7b-arch": {
        "text": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 30},
        "heads": 32,
    },
    "janus-pro-1b-arch": {
        "text": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24},
        "heads": 16,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_arch_presets_match_the_public_configs(name: str) -> None:
    from transformers import JanusConfig

    from unirl.models.janus.arch import arch_config

    config = JanusConfig.from_dict(arch_config(name))
    text, vision, vq = config.text_config, config.vision_config, config.vq_config
    public = PUBLIC[name]
    width = public["text"]["hidden_size"]
    for key, value in public["text"].items():
        assert getattr(text, key) == value, key
    assert text.num_attention_heads == text.num_key_value_heads == public["heads"]
    assert (text.vocab_size, text.max_position_embeddings, text.rms_norm_eps) == (
        102400,
        16384,
        1e-6,
    )
    assert text.rope_parameters["rope_theta"] == 10_000.0
    assert (text.bos_token_id, text.eos_token_id, text.pad_token_id) == (100000, 100001, 100002)
    assert config.image_token_id == 100581 and not config.tie_word_embeddings
    assert (vision.hidden_size, vision.num_hidden_layers, vision.num_attention_heads) == (
        1024,
        24,
        16,
    )
    assert (vision.image_size, vision.patch_size, vision.num_image_tokens) == (384, 16, 576)
    assert (vision.projection_dim, vision.depth, vision.mlp_ratio) == (width, 2, 4.0)
    assert (vq.embed_dim, vq.num_embeddings) == (8, 16384)
    assert (vq.projection_dim, vq.image_token_embed_dim, vq.num_hidden_layers) == (width, width, 2)
