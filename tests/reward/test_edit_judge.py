"""EditJudge on tiny random Qwen2.5-VL models saved to local folders (no download).

Two tokenizers, both byte-level BPE trained on the bundled corpus: one splits numbers into
digits as Qwen does (``10`` = ``1``, ``0``: the rating tree of ``RatingReader``), one has
``10`` as a single token (plain restriction to ten tokens). Each score is compared with a
hand computation in float64 from the logits of the model's own ``forward`` on inputs this
file builds (tolerance 1e-6: the judge pads a batch on the left, the reference runs one
sample unpadded, so float32 GEMM shapes differ).
"""

from __future__ import annotations

import re

import pytest
import torch

from unirl.config import ConfigError
from unirl.reward import EditRewardBackend, RewardError
from unirl.reward.local import EditJudge, RatingReader, RewardWeightsNotFound, judge_messages
from unirl.reward.local.edit_judge import DEFAULT_QUESTION
from unirl.types import Images, RolloutTrack

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tiny_qwen_tokenizer import SPECIALS, qwen_tokenizer  # noqa: E402

# Our own minimal chat template (the Qwen layout: turns in <|im_start|> ... <|im_end|>, an
# image as <|vision_start|><|image_pad|><|vision_end|>).
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INSTRUCTIONS = ["make the sky red", "remove the cat", "turn the red car blue"]
TOL = 1e-6


def _tokenizer(ten_is_one_token: bool):
    return qwen_tokenizer(TEMPLATE, plain=("10",) if ten_is_one_token else ())


def _build(path, ten_is_one_token: bool) -> str:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tok = _tokenizer(ten_is_one_token)
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIALS[3:]]
    config = transformers.Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 2048,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [2, 3, 3],
            },
            "bos_token_id": None,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 32,
            "fullatt_block_indexes": [0],
        },
        vision_start_token_id=ids[0],
        vision_end_token_id=ids[1],
        image_token_id=ids[2],
        video_token_id=ids[3],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    proc = Qwen2VLImageProcessorPil(
        min_pixels=28 * 28, max_pixels=56 * 56, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    head = model.lm_head.weight
    assert head.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    with torch.no_grad():
        head.mul_(40.0)  # a peaked distribution, so differences show
        # Steer the (output-only) head rows so that every branch of the rating tree carries
        # mass on the first test pair: "1" gets the row of the root's favourite token, "0"
        # the row of the favourite token after "1" (so p(10 | 1...) is not negligible).
        digit = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
        results, sources = _pairs(1)
        ids_, vision = _prompt_inputs(tok, proc, model, results[0], sources[0], INSTRUCTIONS[0])
        head[digit[1]] = head[int(_next_token(model, ids_, vision, []).argmax())]
        head[digit[0]] = head[int(_next_token(model, ids_, vision, [digit[1]]).argmax())]
    model.save_pretrained(path)
    tok.save_pretrained(path)
    proc.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("judge_split"), ten_is_one_token=False)


@pytest.fixture(scope="module")
def single_dir(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("judge_single"), ten_is_one_token=True)


def _pairs(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    results = torch.randint(0, 256, (n, 3, 40, 48), generator=g).float() / 255.0
    sources = torch.randint(0, 256, (n, 3, 40, 48), generator=g).float() / 255.0
    return results, sources


# -- the hand computation ------------------------------------------------------------------------
def _u8(x: torch.Tensor):
    return x.mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def _prompt_inputs(tok, proc, model, result, source, instruction, low=1, high=10, **kwargs):
    """``input_ids[1, L]`` and the processor output for one pair, built here from the
    documented chat (:func:`judge_messages`) independently of the judge's code."""
    vision = proc(images=[_u8(source), _u8(result)], return_tensors="pt", **kwargs)
    counts = (vision["image_grid_thw"].prod(-1) // 4).tolist()
    text = tok.apply_chat_template(
        judge_messages(instruction, DEFAULT_QUESTION, low, high),
        add_generation_prompt=True,
        tokenize=False,
    )
    before, between, after = text.split("<|image_pad|>")
    text = before + "<|image_pad|>" * counts[0] + between + "<|image_pad|>" * counts[1] + after
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
    assert int((ids == model.config.image_token_id).sum()) == sum(counts)
    return ids, vision


def _next_token(model, ids, vision, extra: list[int]) -> torch.Tensor:
    """``p(next token)`` float64 after ``ids`` plus ``extra``, from ``model.forward``."""
    x = torch.cat([ids, torch.tensor([extra], dtype=torch.long)], dim=1) if extra else ids
    with torch.no_grad():
        logits = model(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            pixel_values=vision["pixel_values"],
            image_grid_thw=vision["image_grid_thw"],
        ).logits
    return torch.softmax(logits[0, -1].double(), dim=-1)


def _reference(folder: str, result, source, instruction: str, low=1, high=10, max_pixels=None):
    """``(E[r], p(r) for r in low..high)`` for one pair, from ``model.forward`` logits."""
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    proc = transformers.AutoImageProcessor.from_pretrained(folder)
    kwargs = {}
    if max_pixels is not None:
        kwargs["size"] = {"shortest_edge": 28 * 28, "longest_edge": max_pixels}
    ids, vision = _prompt_inputs(tok, proc, model, result, source, instruction, low, high, **kwargs)
    digit = {str(d): tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    root = _next_token(model, ids, vision, [])
    ten = tok("10", add_special_tokens=False).input_ids
    ratings = list(range(low, high + 1))
    if len(ten) == 1:  # "10" is one token: restrict the root distribution to the ratings
        ids_r = [tok(str(r), add_special_tokens=False).input_ids[0] for r in ratings]
        p = root[ids_r] / root[ids_r].sum()
    else:  # "10" = "1", "0": split p_root(1) into "1 and the number ends" and "10"
        assert ten == [digit["1"], digit["0"]] and (low, high) == (1, 10)
        after_one = _next_token(model, ids, vision, [digit["1"]])
        end = 1.0 - after_one[list(digit.values())].sum()
        root_norm = sum(root[digit[str(d)]] for d in range(1, 10))
        one_norm = after_one[digit["0"]] + end
        p = torch.stack(
            [root[digit["1"]] / root_norm * end / one_norm]
            + [root[digit[str(d)]] / root_norm for d in range(2, 10)]
            + [root[digit["1"]] / root_norm * after_one[digit["0"]] / one_norm]
        )
    expected = float((p * torch.tensor(ratings, dtype=torch.float64)).sum())
    return expected, p


# -- tests ---------------------------------------------------------------------------------------
def test_rating_reader_on_a_hand_made_table():
    # vocab: ids 0-9 are the digits, 10 is "x"; ratings 1-10 with "10" = (1, 0)
    vocab = [str(d) for d in range(10)] + ["x"]
    tokens = [(r,) for r in range(1, 10)] + [(1, 0)]
    reader = RatingReader.build(list(range(1, 11)), tokens, vocab)
    assert reader.paths == ((1,),) and reader.digit_ids.tolist() == list(range(10))
    root = torch.zeros(1, 11, dtype=torch.float64)
    root[0, [1, 2, 10]] = torch.tensor(
        [0.3, 0.1, 0.6], dtype=torch.float64
    )  # 1 (or 10), 2, a non-rating token
    after_one = torch.zeros(1, 11, dtype=torch.float64)
    after_one[0, [0, 5, 10]] = torch.tensor(
        [0.2, 0.3, 0.5], dtype=torch.float64
    )  # "10", "15" (out of range), end
    expected, mass = reader.expectation({(): root, (1,): after_one})
    # p(1) = 0.3/0.4 · 0.5/0.7, p(10) = 0.3/0.4 · 0.2/0.7, p(2) = 0.1/0.4
    hand = 1 * (0.75 * 5 / 7) + 10 * (0.75 * 2 / 7) + 2 * 0.25
    assert float(expected[0]) == pytest.approx(hand, abs=1e-12)
    assert float(mass[0]) == pytest.approx(0.4, abs=1e-12)
    single = RatingReader.build([1, 2, 3], [(1,), (2,), (3,)], None)
    assert single.paths == ((),) and single.digit_ids is None
    value, _ = single.expectation({(): root})
    assert float(value[0]) == pytest.approx((1 * 0.3 + 2 * 0.1) / 0.4, abs=1e-12)


@pytest.mark.parametrize("variant", ["split", "single"])
def test_score_is_the_expected_rating_from_the_logits(variant, split_dir, single_dir):
    folder = split_dir if variant == "split" else single_dir
    results, sources = _pairs(3)
    judge = EditJudge(path=folder, unit_scale=False, batch_size=2)
    out = judge.score_edit(results, sources, INSTRUCTIONS, [{}] * 3)
    reader = judge._reader
    if variant == "split":
        assert len(reader.tokens[-1]) == 2 and len(reader.paths) == 1 and reader.paths[0]
    else:
        assert all(len(t) == 1 for t in reader.tokens) and reader.paths == ((),)
    for i, instruction in enumerate(INSTRUCTIONS):
        expected, p = _reference(folder, results[i], sources[i], instruction)
        assert float(out.scores["edit_judge"][i]) == pytest.approx(expected, abs=TOL)
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
        assert float(p.max()) > 0.2  # the scaled head makes the rating distribution peaked
        if variant == "split" and i == 0:  # both ways of reading "1" carry weight
            assert float(p[0]) > 0.02 and float(p[-1]) > 0.02, p.tolist()
    assert out.errors["edit_judge"] == [None] * 3
    assert out.metrics["edit_judge/nonfinite"] == 0.0
    assert 0.0 < out.metrics["edit_judge/rating_mass"] <= 1.0
    unit = EditJudge(path=folder, batch_size=3).score_edit(results, sources, INSTRUCTIONS, [{}] * 3)
    rescaled = (out.scores["edit_judge"] - 1.0) / 9.0
    torch.testing.assert_close(unit.scores["edit_judge"], rescaled, rtol=0, atol=TOL)
    assert bool(((unit.scores["edit_judge"] >= 0) & (unit.scores["edit_judge"] <= 1)).all())


def test_a_custom_range_and_max_pixels(single_dir):
    results, sources = _pairs(1, seed=3)
    judge = EditJudge(path=single_dir, min_rating=0, max_rating=5, max_pixels=28 * 28)
    out = judge.score_edit(results, sources, INSTRUCTIONS[:1], [{}])
    expected, _ = _reference(
        single_dir, results[0], sources[0], INSTRUCTIONS[0], low=0, high=5, max_pixels=28 * 28
    )
    assert float(out.scores["edit_judge"][0]) == pytest.approx(expected / 5.0, abs=TOL)


def test_batch_order_does_not_matter(split_dir):
    results, sources = _pairs(4, seed=1)
    prompts = ["a", "make the sky a deep red", "b c", "remove the cat on the left"]
    judge = EditJudge(path=split_dir, batch_size=4)
    first = judge.score_edit(results, sources, prompts, [{}] * 4).scores["edit_judge"]
    order = [2, 0, 3, 1]
    permuted = judge.score_edit(
        results[order], sources[order], [prompts[i] for i in order], [{}] * 4
    ).scores["edit_judge"]
    torch.testing.assert_close(permuted, first[order], rtol=0, atol=TOL)
    one_by_one = EditJudge(path=split_dir, batch_size=1)
    alone = one_by_one.score_edit(results, sources, prompts, [{}] * 4).scores["edit_judge"]
    torch.testing.assert_close(alone, first, rtol=0, atol=TOL)


def test_the_model_sees_source_then_result_and_the_instruction(split_dir):
    results, sources = _pairs(1, seed=2)
    judge = EditJudge(path=split_dir)
    seen: list[dict] = []
    judge.score_edit(results, sources, ["paint it green"], [{}])  # loads the model
    hook = judge._model.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(dict(kwargs)), with_kwargs=True
    )
    forward = judge.score_edit(results, sources, ["paint it green"], [{}])
    swapped = judge.score_edit(sources, results, ["paint it green"], [{}])
    hook.remove()
    proc = transformers.AutoImageProcessor.from_pretrained(split_dir)
    vision = proc(images=[_u8(sources[0]), _u8(results[0])], return_tensors="pt")
    half = vision["pixel_values"].shape[0] // 2
    assert torch.equal(seen[0]["pixel_values"], vision["pixel_values"])  # source first
    assert torch.equal(seen[1]["pixel_values"][:half], vision["pixel_values"][half:])
    assert torch.equal(seen[1]["pixel_values"][half:], vision["pixel_values"][:half])
    text = judge._tokenizer.decode(seen[0]["input_ids"][0])
    assert 'edited by the instruction: "paint it green"' in text and "from 1" in text
    assert text.endswith("<|im_start|>assistant\n1")  # the path appended for rating 10
    a, b = float(forward.scores["edit_judge"][0]), float(swapped.scores["edit_judge"][0])
    assert abs(a - b) > 1e-4, (a, b)  # the answer depends on which image is the source


def test_service_dispatches_edit_tracks_to_the_judge(single_dir):
    from unirl.reward import RewardService

    results, sources = _pairs(2, seed=4)
    judge = EditJudge(path=single_dir)
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 0]),
        decoded=Images(pixels=results),
        prompts=INSTRUCTIONS[:2],
        references=Images(pixels=sources),
    )
    scored, metrics = RewardService(backend=judge).score_track(track)
    direct = judge.score_edit(results, sources, INSTRUCTIONS[:2], [{}, {}]).scores["edit_judge"]
    assert torch.equal(scored.rewards, direct)
    assert "edit_judge/rating_mass" in metrics
    with pytest.raises(RewardError, match="carries none"):
        judge.score(results, INSTRUCTIONS[:2], [{}, {}])


def test_missing_model_raises_one_line_naming_path_and_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    results, sources = _pairs(1)
    missing = tmp_path / "no_judge"
    judge = EditJudge(path=str(missing))
    with pytest.raises(RewardWeightsNotFound) as info:
        judge.score_edit(results, sources, ["x"], [{}])
    message = str(info.value)
    assert "\n" not in message and str(missing) in message
    assert "no such folder; set path=/path/to/local/folder" in message
    assert not judge.loaded
    hub = EditJudge(path="nobody/no-judge")
    with pytest.raises(RewardWeightsNotFound, match="HF_HUB_OFFLINE=1 and it is not in the local"):
        hub.score_edit(results, sources, ["x"], [{}])


def test_config_refusals_and_laziness(split_dir):
    from omegaconf import OmegaConf

    judge = EditJudge(path="/nowhere/judge", dtype="bfloat16", device="cuda:1", max_rating=7)
    assert not judge.loaded and judge.dtype == "bf16" and judge.needs_references
    assert isinstance(judge, EditRewardBackend) and judge.names == ("edit_judge",)
    rebuilt = OmegaConf.to_object(OmegaConf.create({"r": judge}).r)
    assert type(rebuilt) is EditJudge and rebuilt == judge and not rebuilt.loaded
    for kwargs, field in [
        ({"min_rating": 5, "max_rating": 5}, "min_rating=5 must be below"),
        ({"min_rating": -1}, "min_rating=-1"),
        ({"question": "rate it"}, "must contain '{instruction}'"),
        ({"question": "{instruction} {score}"}, "not a valid format string"),
        ({"max_pixels": 0}, "max_pixels=0"),
        ({"batch_size": 0}, "batch_size"),
    ]:
        with pytest.raises(ConfigError, match=field):
            EditJudge(path=split_dir, **kwargs)
    results, sources = _pairs(2)
    with pytest.raises(RewardError, match=r"sources\) expects images of shape \[N=2"):
        EditJudge(path=split_dir).score_edit(results, sources[:1], ["a", "b"], [{}, {}])
    plain = EditJudge(path=split_dir, chat_template="{{ messages[0].content[4].text }}")
    with pytest.raises(RewardError, match=re.escape("rendered 0 '<|image_pad|>' placeholders")):
        plain.score_edit(results, sources, ["a", "b"], [{}, {}])


def test_a_prefix_that_merges_with_the_rating_is_refused(single_dir):
    # "10" is one token here: after answer_prefix "... 1", rating 0 would read as "10"
    results, sources = _pairs(1)
    judge = EditJudge(path=single_dir, min_rating=0, max_rating=9, answer_prefix="Score: 1")
    with pytest.raises(RewardError, match="rating 0 does not tokenise on its own"):
        judge.score_edit(results, sources, ["a"], [{}])


def test_offload_onload_and_bf16(single_dir):
    results, sources = _pairs(2, seed=5)
    judge = EditJudge(path=single_dir)
    first = judge.score_edit(results, sources, INSTRUCTIONS[:2], [{}, {}]).scores["edit_judge"]
    judge.offload()
    assert judge._offloaded
    again = judge.score_edit(results, sources, INSTRUCTIONS[:2], [{}, {}]).scores["edit_judge"]
    assert not judge._offloaded and torch.equal(first, again)
    half = EditJudge(path=single_dir, dtype="bf16")
    low = half.score_edit(results, sources, INSTRUCTIONS[:2], [{}, {}]).scores["edit_judge"]
    assert half._model.dtype == torch.bfloat16 and low.dtype == torch.float32
    assert bool(torch.isfinite(low).all()) and float((low - first).abs().max()) < 0.2
