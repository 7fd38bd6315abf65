"""The AR decode engine (``models/common_ar/engine``) against the reference loop
(``generate_completions``) on the tiny Qwen3 and Qwen2.5-VL presets, fp32 on CPU.

- tokens equal the loop's token for token (greedy and sampled, every slot count, with stop
  tokens making lengths uneven so slots free up, refill and compact);
- the recorded log-probs equal the trainer's packed replay (``token_log_probs``) within
  2e-6: the engine's decode attends over a static cache row with a mask, the replay runs one
  packed forward; both fp32, so only summation order differs;
- a refilled slot never sees its previous occupant's cache (exact equality with a fresh
  engine, which fails if the mask lets stale keys through);
- merged LoRA samples what fused LoRA samples, the base weights are untouched bit for bit,
  and a change of the adapters is re-merged (checksum).
"""

from __future__ import annotations

import pytest
import torch

from unirl.models.common_ar.engine import DecodeEngine, DecodeEngineConfig, decoder_view
from unirl.models.common_ar.generate import StopStrings, generate_completions
from unirl.models.qwen3 import Qwen3Bundle, Qwen3Pipeline
from unirl.types import RolloutReq, TextRequest, Texts

PROMPTS = [
    "What is 3 + 4?",
    "hi",
    "a photo of a cat sitting on a red chair by the window in the afternoon",
    "What is 9 - 1? Put the answer in a box.",
]


@pytest.fixture(scope="module")
def bundle() -> Qwen3Bundle:
    return Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")


def grouped_prompts(bundle: Qwen3Bundle, per_prompt: int = 3) -> list[list[int]]:
    return [ids for ids in bundle.encode_prompts(PROMPTS) for _ in range(per_prompt)]


def uniforms(n: int, steps: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, steps, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def frequent_token(bundle: Qwen3Bundle, prompts: list[list[int]]) -> int:
    """A token the tiny model emits often: as a stop token it makes lengths uneven."""
    with bundle.sampling_mode():
        out = generate_completions(
            bundle.model, prompts, uniforms(len(prompts), 24), max_new_tokens=24, temperature=1.0
        )
    counts = torch.bincount(torch.tensor([t for c in out for t in c.tokens]))
    return int(counts.argmax())


def both(bundle: Qwen3Bundle, prompts, u, config: DecodeEngineConfig, **knobs):
    with bundle.sampling_mode():
        ref = generate_completions(bundle.model, prompts, u, pad_token_id=0, **knobs)
        engine = DecodeEngine(config)
        out = engine.generate(bundle.model, prompts, u, pad_token_id=0, **knobs)
    return ref, out, engine


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("max_slots", [None, 1, 5])
def test_tokens_equal_the_reference_loop(bundle, temperature, max_slots) -> None:
    prompts = grouped_prompts(bundle)
    stop = frequent_token(bundle, prompts)
    ref, out, engine = both(
        bundle,
        prompts,
        uniforms(len(prompts), 24),
        DecodeEngineConfig(max_slots=max_slots, check_every=3),
        max_new_tokens=24,
        temperature=temperature,
        stop_token_ids=[stop],
    )
    assert [c.tokens for c in out] == [c.tokens for c in ref]
    assert [c.finish_reason for c in out] == [c.finish_reason for c in ref]
    if temperature > 0:  # the draws made lengths uneven, so slots freed up and refilled
        assert len({len(c.tokens) for c in ref}) > 1
        assert {c.finish_reason for c in ref} == {"stop", "length"}
    for a, r in zip(out, ref, strict=True):
        torch.testing.assert_close(a.log_probs, r.log_probs, atol=2e-6, rtol=0)
    assert engine.stats.prefill_prompts == len(PROMPTS)  # one prefill per distinct prompt


def test_top_p_top_k_and_stop_strings_match_the_loop(bundle) -> None:
    prompts = grouped_prompts(bundle, 2)
    stops = StopStrings(["e", "7"], bundle.prompts.decode_raw)
    ref, out, _ = both(
        bundle,
        prompts,
        uniforms(len(prompts), 20, seed=3),
        DecodeEngineConfig(max_slots=3, check_every=4),
        max_new_tokens=20,
        temperature=0.8,
        top_p=0.9,
        top_k=50,
        stop_strings=stops,
    )
    assert [c.tokens for c in out] == [c.tokens for c in ref]
    assert [c.finish_reason for c in out] == [c.finish_reason for c in ref]
    assert any(c.finish_reason == "stop" for c in ref)


def test_recorded_log_probs_equal_the_trainer_replay(bundle) -> None:
    pipe = Qwen3Pipeline(bundle=bundle, engine={"max_slots": 4, "check_every": 2})
    n = 8
    ids = torch.arange(n)
    req = RolloutReq(
        sample_ids=ids,
        group_ids=ids // 2,
        primitives={"text": Texts(texts=[PROMPTS[i // 2] for i in range(n)])},
        stage_params={"text": TextRequest(seed_ids=ids, max_new_tokens=16, temperature=1.0)},
    )
    resp = pipe.generate(req)
    assert {"prefill", "decode"} <= set(resp.timings)
    track = resp.tracks["text"]
    replay = pipe.token_log_probs(track.conditions, track.segment).values
    mask = track.segment.loss_mask.values
    recorded = track.segment.log_probs.values
    torch.testing.assert_close(recorded[mask], replay[mask], atol=2e-6, rtol=0)
    assert recorded[mask].abs().min() > 0  # every completion token has its own log-prob


def test_a_refilled_slot_never_sees_the_previous_sequence(bundle) -> None:
    long_prompt, short_prompt = bundle.encode_prompts([PROMPTS[2], PROMPTS[1]])
    u = uniforms(2, 12, seed=7)
    knobs = {"max_new_tokens": 12, "temperature": 1.0, "pad_token_id": 0}
    with bundle.sampling_mode():
        # one slot: the short prompt takes the slot the long one left (its rows past the
        # short prompt's length still hold the long sequence's keys and values)
        shared = DecodeEngine(DecodeEngineConfig(max_slots=1, check_every=2))
        both_out = shared.generate(bundle.model, [long_prompt, short_prompt], u, **knobs)
        fresh = DecodeEngine(DecodeEngineConfig(max_slots=1, check_every=2))
        alone = fresh.generate(bundle.model, [short_prompt], u[1:], **knobs)
    assert both_out[1].tokens == alone[0].tokens
    assert torch.equal(both_out[1].log_probs, alone[0].log_probs)
    # the slot really was reused with stale rows beyond the short prompt
    state = shared._kept.state
    assert len(long_prompt) > len(short_prompt) + 2
    assert state.k_cache[0][0, :, len(short_prompt) + 12 : len(long_prompt)].abs().sum() > 0


def _with_lora(seed: int = 0) -> Qwen3Bundle:
    from unirl.train.lora import LoraConfig, inject_lora

    own = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    inject_lora(own.model, LoraConfig(rank=4, alpha=8), targets, seed=seed)
    with torch.no_grad():
        for name, p in own.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(1))
    return own


def test_merged_lora_samples_what_fused_lora_samples_and_leaves_the_base_alone() -> None:
    own = _with_lora()
    base = {n: p.detach().clone() for n, p in own.model.named_parameters() if "lora" not in n}
    prompts = grouped_prompts(own, 2)
    u = uniforms(len(prompts), 16, seed=2)
    knobs = {"max_new_tokens": 16, "temperature": 1.0, "pad_token_id": 0}
    with own.sampling_mode():
        fused = DecodeEngine(DecodeEngineConfig(lora="fused")).generate(
            own.model, prompts, u, **knobs
        )
        merged_engine = DecodeEngine(DecodeEngineConfig(lora="merged"))
        merged = merged_engine.generate(own.model, prompts, u, **knobs)
        ref = generate_completions(own.model, prompts, u, **knobs)
    # per layer: q/k/v as one matmul, o, gate/up as one matmul, down
    assert len(merged_engine.view(own.model).merged) == 4 * 2
    assert [c.tokens for c in merged] == [c.tokens for c in fused] == [c.tokens for c in ref]
    for m, f in zip(merged, fused, strict=True):  # W + s·B·A rounds once in fp32: 1e-6 relative
        torch.testing.assert_close(m.log_probs, f.log_probs, atol=0, rtol=1e-6)
    for n, p in own.model.named_parameters():  # unmerging is exact: the base never changed
        if "lora" not in n:
            assert torch.equal(p, base[n]), n

    # an optimizer step on the adapters: the next call re-merges (checksum), and only then
    with torch.no_grad():
        for name, p in own.model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
    view = merged_engine.view(own.model)
    assert view.refresh_merged() == 8
    assert view.refresh_merged() == 0
    with own.sampling_mode():
        again = merged_engine.generate(own.model, prompts, u, **knobs)
        ref = generate_completions(own.model, prompts, u, **knobs)
    assert [c.tokens for c in again] == [c.tokens for c in ref]


def test_the_view_refuses_what_it_cannot_run() -> None:
    class NotALM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match=r"pipeline\.sampler=loop"):
        decoder_view(NotALM())
    with pytest.raises(ValueError, match="max_slots must be >= 1"):
        DecodeEngineConfig(max_slots=0)
    with pytest.raises(ValueError, match="lora must be 'fused' or 'merged'"):
        DecodeEngineConfig(lora="both")  # type: ignore[arg-type]


def vision_request(texts: list[str], *, max_new_tokens: int) -> RolloutReq:
    """Two samples per prompt, each prompt with its own random 56² image (a group shares it)."""
    from unirl.types import Images

    n = 2 * len(texts)
    ids = torch.arange(n)
    pixels = torch.rand(len(texts), 3, 56, 56, generator=torch.Generator().manual_seed(0))
    return RolloutReq(
        sample_ids=ids,
        group_ids=ids // 2,
        primitives={
            "text": Texts(texts=[texts[i // 2] for i in range(n)]),
            "image": Images(pixels=pixels[ids // 2]),
        },
        stage_params={
            "text": TextRequest(seed_ids=ids, max_new_tokens=max_new_tokens, temperature=1.0)
        },
    )


def test_the_vision_language_engine_equals_the_loop() -> None:
    from unirl.models.qwen_vl import QwenVLBundle, QwenVLPipeline

    vl = QwenVLBundle(path="tiny", dtype="fp32", device="cpu", image_size=56)
    req = vision_request(["Find x.", "Which?", "Find the area of it."], max_new_tokens=12)
    engine_pipe = QwenVLPipeline(bundle=vl, engine={"max_slots": 4, "check_every": 3})
    loop_pipe = QwenVLPipeline(bundle=vl, sampler="loop")
    a = engine_pipe.generate(req).tracks["text"]
    b = loop_pipe.generate(req).tracks["text"]
    assert torch.equal(a.segment.tokens.values, b.segment.tokens.values)
    torch.testing.assert_close(
        a.segment.log_probs.values, b.segment.log_probs.values, atol=2e-6, rtol=0
    )
    assert engine_pipe.engine.stats.prefill_prompts == 3  # one per (prompt, image)
    replay = engine_pipe.token_log_probs(a.conditions, a.segment).values
    mask = a.segment.loss_mask.values
    torch.testing.assert_close(a.segment.log_probs.values[mask], replay[mask], atol=2e-6, rtol=0)


def test_a_full_fine_tune_step_reaches_the_merged_copy_biases_included() -> None:
    """Full fine-tuning changes every weight in place, Qwen2's q/k/v biases included: the
    engine's merged copy follows them (the bias copy once went stale, and the VLM quick
    start's rollout-vs-replay gap rose from 1e-7 to 0.1)."""
    from unirl.models.qwen_vl import QwenVLBundle, QwenVLPipeline

    vl = QwenVLBundle(path="tiny", dtype="fp32", device="cpu", image_size=56)
    assert vl.model.get_decoder().layers[0].self_attn.q_proj.bias is not None
    req = vision_request(["Find x.", "Which?"], max_new_tokens=8)
    pipe = QwenVLPipeline(bundle=vl)  # the default engine: merged copies
    pipe.generate(req)  # the copy is made here
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # an "optimizer step" on every weight, in place
        for p in vl.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    track = pipe.generate(req).tracks["text"]
    replay = pipe.token_log_probs(track.conditions, track.segment).values
    mask = track.segment.loss_mask.values
    torch.testing.assert_close(
        track.segment.log_probs.values[mask], replay[mask], atol=2e-6, rtol=0
    )


def test_merged_copy_follows_adapters_being_disabled_and_enabled() -> None:
    """Sampling under ``adapter_disabled()`` (the base policy) must sample the base: the
    merged copy's checksum includes which adapters are active."""
    from unirl.train.lora import tuner_layers

    own = _with_lora()
    prompts = grouped_prompts(own, 1)
    u = uniforms(len(prompts), 12, seed=4)
    knobs = {"max_new_tokens": 12, "temperature": 1.0, "pad_token_id": 0}
    engine = DecodeEngine(DecodeEngineConfig(lora="merged"))
    with own.sampling_mode():
        adapted = engine.generate(own.model, prompts, u, **knobs)
        for layer in tuner_layers(own.model):
            layer.enable_adapters(False)
        base = engine.generate(own.model, prompts, u, **knobs)
        base_ref = generate_completions(own.model, prompts, u, **knobs)
        for layer in tuner_layers(own.model):
            layer.enable_adapters(True)
        again = engine.generate(own.model, prompts, u, **knobs)
    assert [c.tokens for c in base] == [c.tokens for c in base_ref]
    assert [c.tokens for c in base] != [c.tokens for c in adapted]
    assert [c.tokens for c in again] == [c.tokens for c in adapted]
