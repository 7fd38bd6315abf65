"""The VLM rewards (HPSv3, VideoAlign, EditReward, UnifiedReward, WISE judge) on tiny
random-weight Qwen2-VL / Qwen2.5-VL models saved to folders and loaded through the same path
as released checkpoints (nothing is downloaded).

Head models are compared with an independent float64 computation: this file renders the chat
itself, expands the pads in the text before tokenising it whole, builds the embeddings, runs
``language_model`` with sequential positions and applies the head by hand (tolerance 1e-5:
fp32 GEMMs of different shapes). Batches of 3 equal three singles to 1e-5 (head models, right
padding) or exactly (judges: the decoded answers are compared). The judges' verdicts are
checked on models whose embedding and output rows are steered so that greedy decoding writes a
fixed answer ("Final Score: 4", WISE's three lines); an unsteered model writes noise, which
must score NaN with an error rather than 0.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch

from unirl.reward import RewardError, RewardService
from unirl.reward.local import EditReward, HPSv3, UnifiedReward, VideoAlign, WISEJudge
from unirl.reward.local.vlm import engine as vlm_engine
from unirl.reward.local.vlm import templates as T
from unirl.reward.local.vlm.edit_reward import edit_reward_text
from unirl.reward.local.vlm.hpsv3 import hpsv3_text
from unirl.reward.local.vlm.judges import Unparsed, parse_final_score, parse_wise, wiscore
from unirl.reward.local.vlm.videoalign import videoalign_text
from unirl.types import Images, RolloutTrack, Videos

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from tiny_qwen_tokenizer import QWEN_STYLE_TEMPLATE, SPECIALS, qwen_tokenizer  # noqa: E402

TEMPLATE = QWEN_STYLE_TEMPLATE  # our own Qwen-style chat template
PROMPTS = ["a red cube on a table", "two cats", "a lighthouse at night"]
PIX = {"min_pixels": 28 * 28, "max_pixels": 56 * 56}  # small images: 1-4 merged patches
TOL = 1e-5
UR_ANSWER = "Final Score: 4"
WISE_ANSWER = ["Consistency: 2\n", "Realism: 1\n", "Aesthetic Quality: 0"]


# -- tiny folders -------------------------------------------------------------------------------
def _tokenizer(special=(), plain=()):
    return qwen_tokenizer(TEMPLATE, tuple(special), tuple(plain))


def _config(kind: str, tok):
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIALS[3:]]
    text = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
        "bos_token_id": None,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    common = {
        "vision_start_token_id": ids[0],
        "vision_end_token_id": ids[1],
        "image_token_id": ids[2],
        "video_token_id": ids[3],
        "tie_word_embeddings": False,
    }
    if kind == "qwen2_vl":
        vision = {"depth": 1, "embed_dim": 16, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2}
        return transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **common)
    vision = {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "out_hidden_size": 32,
        "fullatt_block_indexes": [0],
    }
    return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)


def _save(path, kind, tok, head: dict | None = None, steer: list[str] | None = None) -> str:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    torch.manual_seed(0)
    config = _config(kind, tok)
    cls = (
        transformers.Qwen2VLForConditionalGeneration
        if kind == "qwen2_vl"
        else transformers.Qwen2_5_VLForConditionalGeneration
    )
    model = cls(config).eval()
    if steer is not None:
        _steer(model, tok, steer)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    proc = Qwen2VLImageProcessorPil(
        min_pixels=28 * 28, max_pixels=56 * 56, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    proc.save_pretrained(path)
    if head is not None:
        g = torch.Generator().manual_seed(1)
        state = {k: torch.randn(shape, generator=g) * 0.5 for k, shape in head.items()}
        safetensors_torch.save_file(state, str(path / vlm_engine.HEAD_FILE))
    return str(path)


def _steer(model, tok, answer: list[str]) -> None:
    """Greedy decoding after the generation prompt writes ``answer`` then ``<|im_end|>``: the
    fed tokens' embeddings dominate the residual stream and each one's output row points at
    the next token (a chain keyed by the current token)."""
    start = tok("<|im_start|>assistant\n", add_special_tokens=False).input_ids[-1]
    chain = [start, *(tok.convert_tokens_to_ids(a) for a in answer), tok.eos_token_id]
    emb = model.get_input_embeddings().weight
    head = model.lm_head.weight
    with torch.no_grad():
        for cur, nxt in itertools.pairwise(chain):
            emb[cur] *= 60.0
            head[nxt] = 60.0 * emb[cur] / emb[cur].norm()


def _ranknet_shapes(prefix: str, hidden: int = 32, out: int = 2) -> dict:
    return {
        f"{prefix}.0.weight": (1024, hidden),
        f"{prefix}.0.bias": (1024,),
        f"{prefix}.3.weight": (16, 1024),
        f"{prefix}.3.bias": (16,),
        f"{prefix}.5.weight": (out, 16),
        f"{prefix}.5.bias": (out,),
    }


@pytest.fixture(scope="module")
def hps_dir(tmp_path_factory):
    tok = _tokenizer(special=[T.HPSV3_REWARD_TOKEN])
    return _save(tmp_path_factory.mktemp("hpsv3"), "qwen2_vl", tok, _ranknet_shapes("rm_head"))


@pytest.fixture(scope="module")
def va_dir(tmp_path_factory):
    tok = _tokenizer(special=list(T.VIDEOALIGN_TOKENS))
    return _save(
        tmp_path_factory.mktemp("videoalign"), "qwen2_vl", tok, {"rm_head.weight": (1, 32)}
    )


@pytest.fixture(scope="module")
def er_dir(tmp_path_factory):
    tok = _tokenizer(special=[T.HPSV3_REWARD_TOKEN])
    shapes = {**_ranknet_shapes("rm_heads.head_0"), **_ranknet_shapes("rm_heads.head_1")}
    return _save(tmp_path_factory.mktemp("editreward"), "qwen2_5_vl", tok, shapes)


@pytest.fixture(scope="module")
def ur_dir(tmp_path_factory):
    tok = _tokenizer(plain=[UR_ANSWER])
    return _save(tmp_path_factory.mktemp("unified"), "qwen2_5_vl", tok, steer=[UR_ANSWER])


@pytest.fixture(scope="module")
def wise_dir(tmp_path_factory):
    tok = _tokenizer(plain=WISE_ANSWER)
    return _save(tmp_path_factory.mktemp("wise"), "qwen2_5_vl", tok, steer=WISE_ANSWER)


@pytest.fixture(scope="module")
def noise_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("noise"), "qwen2_5_vl", _tokenizer())


def _images(n: int, seed: int = 0, h: int = 40, w: int = 48) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), generator=g).float() / 255.0


def _videos(n: int, t: int = 5, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, t, 3, 56, 56), generator=g).float() / 255.0


# -- the independent reference ------------------------------------------------------------------
def _u8(image: torch.Tensor) -> np.ndarray:
    return image.mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()


@functools.cache
def _load(folder):
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    proc = transformers.AutoImageProcessor.from_pretrained(folder)
    return model, tok, proc


def _ref_video_patches(frames_u8: np.ndarray, proc) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL's video layout written out from raw frames (no resize: 56x56 frames)."""
    x = torch.tensor(frames_u8, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0
    x = (x - 0.5) / 0.5
    if x.shape[0] % 2:
        x = torch.cat([x, x[-1:]])
    t, c, h, w = x.shape
    p, m, tp = 14, 2, 2
    gt, gh, gw = t // tp, h // p, w // p
    x = x.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p), torch.tensor([[gt, gh, gw]])


def _ref_hidden(folder, chat, visuals, tokens, **pixels) -> torch.Tensor:
    """Hidden states ``[len(tokens), H]`` float64 of one sample, built here."""
    model, tok, proc = _load(folder)
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    size = {"shortest_edge": pixels["min_pixels"], "longest_edge": pixels["max_pixels"]}
    emb_parts = []
    for kind, array in visuals:
        if kind == "image":
            vision = proc(images=[array], return_tensors="pt", size=size)
            pv, grid = vision["pixel_values"], vision["image_grid_thw"]
            feats = torch.cat(model.model.get_image_features(pv, grid).pooler_output)
            pad = "<|image_pad|>"
        else:
            pv, grid = _ref_video_patches(array, proc)
            feats = torch.cat(model.model.get_video_features(pv, grid).pooler_output)
            pad = "<|video_pad|>"
        count = int(grid.prod()) // 4
        head, _, tail = text.partition(pad)
        text = head + "\x00" * count + tail  # placeholder so later pads stay unexpanded
        emb_parts.append((pad, count, feats))
    for pad, count, _ in emb_parts:
        text = text.replace("\x00" * count, pad * count, 1)
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        for pad in {p for p, _, _ in emb_parts}:
            feats = torch.cat([f for p, _, f in emb_parts if p == pad])  # in text order
            mask = ids[0] == tok.convert_tokens_to_ids(pad)
            embeds[0, mask] = feats.to(embeds.dtype)
        out = model.model.language_model(
            inputs_embeds=embeds, position_ids=torch.arange(ids.shape[1])[None]
        )
    hidden = out.last_hidden_state[0].double()
    rows = [int((ids[0] == tok.convert_tokens_to_ids(t)).nonzero()[0, 0]) for t in tokens]
    assert all(int((ids[0] == tok.convert_tokens_to_ids(t)).sum()) == 1 for t in tokens)
    return hidden[rows]


def _ranknet(state: dict, prefix: str, h: torch.Tensor) -> torch.Tensor:
    w = {k[len(prefix) + 1 :]: v.double() for k, v in state.items() if k.startswith(prefix + ".")}
    x = torch.relu(h @ w["0.weight"].T + w["0.bias"])
    x = torch.relu(x @ w["3.weight"].T + w["3.bias"])
    return x @ w["5.weight"].T + w["5.bias"]


def _head_state(folder) -> dict:
    return safetensors_torch.load_file(f"{folder}/{vlm_engine.HEAD_FILE}")


# -- templates ----------------------------------------------------------------------------------
def test_templates_keep_the_released_wording_and_whitespace():
    # distinctive features of each released text (typos and double-space line ends included)
    assert T.HPSV3_INSTRUCTION.startswith(
        "\nYou are tasked with evaluating a generated image based on Visual Quality and Text "
        "Alignment and give a overall score to estimate the human preference."
    )
    assert "the best. \n\n**Visual Quality:**  \nEvaluate" in T.HPSV3_INSTRUCTION
    assert T.HPSV3_INSTRUCTION.endswith(
        "original description.\nTextual prompt - {text_prompt}\n\n\n"
    )
    assert (
        T.HPSV3_SUFFIX == "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"
    )
    for token in T.VIDEOALIGN_TOKENS:
        assert T.VIDEOALIGN_PROMPT.count(token) == 1
        assert f": {token}\nEND\n" in T.VIDEOALIGN_PROMPT
    assert T.VIDEOALIGN_PROMPT.index("<|VQ_reward|>") < T.VIDEOALIGN_PROMPT.index("<|MQ_reward|>")
    assert "Textual prompt - {text_prompt}\nPlease provide the ratings of Text Alignment" in (
        T.VIDEOALIGN_PROMPT
    )
    assert "assigning a score from 1 to 4" in T.EDITREWARD_FOLLOWING
    assert "**Instruction Following & Semantic Fidelity**" in T.EDITREWARD_FOLLOWING
    assert "**Visual Quality & Realism**" in T.EDITREWARD_QUALITY
    assert T.EDITREWARD_QUALITY.endswith("Text instruction - {text_prompt}\n")
    assert "assign a score from 1 to 5 after 'Final Score:'" in T.UNIFIEDREWARD_IMAGE
    assert T.UNIFIEDREWARD_IMAGE.endswith("Text Caption: [{prompt}]")
    assert "assign a score from 1 to 10 after 'Final Score:'" in T.UNIFIEDREWARD_VIDEO
    assert "**Consistency (0-2):**" in T.WISE_PROMPT and "**Realism (0-2):**" in T.WISE_PROMPT
    assert "**Aesthetic Quality (0-2):**" in T.WISE_PROMPT
    assert 'PROMPT: "{prompt}"\nEXPLANATION: "{explanation}"\n' in T.WISE_PROMPT
    assert T.WISE_SYSTEM.startswith("You are a professional Vincennes image quality audit expert")


def test_rendered_chats_hold_the_released_text(hps_dir, va_dir, er_dir, ur_dir, wise_dir):
    hps = HPSv3(path=hps_dir, **PIX)
    hps._ensure_ready()
    text = hps.render(vlm_engine.image_chat(hpsv3_text("a dog")))
    body = T.HPSV3_INSTRUCTION.format(text_prompt="a dog") + T.HPSV3_SUFFIX
    assert "<|vision_start|><|image_pad|><|vision_end|>" + body + "<|im_end|>" in text
    va = VideoAlign(path=va_dir, max_pixels=56 * 56)
    va._ensure_ready()
    text = va.render(vlm_engine.video_chat(videoalign_text("a dog runs")))
    assert (
        "<|video_pad|><|vision_end|>" + T.VIDEOALIGN_PROMPT.format(text_prompt="a dog runs") in text
    )
    er = EditReward(path=er_dir, **PIX)
    er._ensure_ready()
    for k, template in enumerate((T.EDITREWARD_FOLLOWING, T.EDITREWARD_QUALITY)):
        chat = vlm_engine.image_chat(edit_reward_text("add a hat", k), before=2)
        body = template.format(text_prompt="add a hat") + T.EDITREWARD_SUFFIX
        assert "<|vision_start|><|image_pad|><|vision_end|>" * 2 + body in er.render(chat)
    ur = UnifiedReward(path=ur_dir, **PIX)
    ur._ensure_ready()
    chat = vlm_engine.image_chat(T.UNIFIEDREWARD_IMAGE.format(prompt="a dog"))
    assert "<|image_pad|><|vision_end|>" + T.UNIFIEDREWARD_IMAGE.format(
        prompt="a dog"
    ) in ur.render(chat)
    wise = WISEJudge(path=wise_dir, **PIX)
    wise._ensure_ready()
    text = wise.render(wise.chat("the flower of Japan", {"explanation": "cherry blossoms"}))
    expected = T.WISE_PROMPT.format(prompt="the flower of Japan", explanation="cherry blossoms")
    assert text.startswith("<|im_start|>system\n" + T.WISE_SYSTEM + "<|im_end|>\n")
    assert expected + "<|vision_start|><|image_pad|>" in text  # WISE puts the image last


# -- head models --------------------------------------------------------------------------------
def test_hpsv3_equals_the_reference_and_is_batch_invariant(hps_dir):
    images = _images(3)
    scorer = HPSv3(path=hps_dir, batch_size=3, **PIX)
    result = scorer.score(images, PROMPTS, [{}] * 3)
    scores = result.scores["hpsv3"]
    state = _head_state(hps_dir)
    refs, us = [], []
    for i in range(3):
        h = _ref_hidden(
            hps_dir,
            vlm_engine.image_chat(hpsv3_text(PROMPTS[i])),
            [("image", _u8(images[i]))],
            [T.HPSV3_REWARD_TOKEN],
            **PIX,
        )
        mu, u = _ranknet(state, "rm_head", h)[0]
        refs.append(float(mu))
        us.append(float(u))
    assert torch.allclose(scores.double(), torch.tensor(refs, dtype=torch.float64), atol=TOL)
    assert len(set(refs)) == 3  # the prompts and images move the score
    assert result.metrics["hpsv3/uncertainty"] == pytest.approx(sum(us) / 3, abs=TOL)
    single = HPSv3(path=hps_dir, batch_size=1, **PIX)
    singles = single.score(images, PROMPTS, [{}] * 3).scores["hpsv3"]
    assert torch.allclose(singles, scores, atol=TOL)
    assert torch.equal(scorer.score(images, PROMPTS, [{}] * 3).scores["hpsv3"], scores)
    assert result.errors["hpsv3"] == [None] * 3


def test_video_patches_follow_the_qwen_video_layout(va_dir):
    scorer = VideoAlign(path=va_dir, max_pixels=56 * 56)
    scorer._ensure_ready()
    frames = _videos(1, t=3)[0]
    u8 = frames.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    vision, counts = scorer._vision([[("video", u8)]])
    ref, grid = _ref_video_patches(u8, scorer._processor)
    assert vision["video_grid_thw"].tolist() == grid.tolist() == [[2, 4, 4]]
    assert counts == [[8]]
    assert torch.allclose(vision["pixel_values_videos"], ref, atol=1e-6)


def test_videoalign_equals_the_reference_and_is_batch_invariant(va_dir):
    videos = _videos(3, t=5)
    weights = {"VQ": 1.0, "MQ": 0.5, "TA": 2.0}
    scorer = VideoAlign(path=va_dir, batch_size=3, max_pixels=56 * 56, weights=weights)
    result = scorer.score_video(videos, 4.0, PROMPTS, [{}] * 3)  # 4 fps -> frames 0, 2, 4
    scores = result.scores["videoalign"]
    w = _head_state(va_dir)["rm_head.weight"].double()[0]
    refs, raw_vq = [], []
    for i in range(3):
        u8 = videos[i, [0, 2, 4]].mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        h = _ref_hidden(
            va_dir,
            vlm_engine.video_chat(videoalign_text(PROMPTS[i])),
            [("video", u8)],
            list(T.VIDEOALIGN_TOKENS),
            min_pixels=28 * 28,
            max_pixels=56 * 56,
        )
        raw = h @ w
        raw_vq.append(float(raw[0]))
        norm = [(raw[j] - scorer.mean[d]) / scorer.std[d] for j, d in enumerate(("VQ", "MQ", "TA"))]
        refs.append(float(norm[0] * 1.0 + norm[1] * 0.5 + norm[2] * 2.0))
    assert torch.allclose(scores.double(), torch.tensor(refs, dtype=torch.float64), atol=TOL)
    single = VideoAlign(path=va_dir, batch_size=1, max_pixels=56 * 56, weights=weights)
    assert torch.allclose(
        single.score_video(videos, 4.0, PROMPTS, [{}] * 3).scores["videoalign"], scores, atol=TOL
    )
    raw_scorer = VideoAlign(path=va_dir, max_pixels=56 * 56, normalize=False)
    raw = raw_scorer.score_video(videos[:1], 4.0, PROMPTS[:1], [{}])
    assert raw.metrics["videoalign/VQ"] == pytest.approx(raw_vq[0], abs=TOL)
    with pytest.raises(RewardError, match="scores videos"):
        scorer.score(videos[:, 0], PROMPTS, [{}] * 3)


def test_edit_reward_equals_the_reference_and_is_batch_invariant(er_dir):
    results, sources = _images(3, seed=1), _images(3, seed=2, h=56, w=28)
    scorer = EditReward(path=er_dir, batch_size=3, **PIX)
    result = scorer.score_edit(results, sources, PROMPTS, [{}] * 3)
    state = _head_state(er_dir)
    refs, follow = [], []
    for i in range(3):
        mus = []
        for k in range(2):
            h = _ref_hidden(
                er_dir,
                vlm_engine.image_chat(edit_reward_text(PROMPTS[i], k), before=2),
                [("image", _u8(sources[i])), ("image", _u8(results[i]))],
                [T.HPSV3_REWARD_TOKEN],
                **PIX,
            )
            mus.append(float(_ranknet(state, f"rm_heads.head_{k}", h)[0, 0]))
        refs.append((mus[0] + mus[1]) / 2)
        follow.append(mus[0])
    scores = result.scores["edit_reward"]
    assert torch.allclose(scores.double(), torch.tensor(refs, dtype=torch.float64), atol=TOL)
    assert result.metrics["edit_reward/following"] == pytest.approx(sum(follow) / 3, abs=TOL)
    single = EditReward(path=er_dir, batch_size=1, **PIX)
    assert torch.allclose(
        single.score_edit(results, sources, PROMPTS, [{}] * 3).scores["edit_reward"],
        scores,
        atol=TOL,
    )
    swapped = scorer.score_edit(sources, results, PROMPTS, [{}] * 3).scores["edit_reward"]
    assert not torch.allclose(swapped, scores, atol=1e-3)  # source and result are told apart
    with pytest.raises(RewardError, match="carries none"):
        scorer.score(results, PROMPTS, [{}] * 3)


# -- judges -------------------------------------------------------------------------------------
def test_parsers_read_the_verdicts_and_refuse_the_rest():
    assert parse_final_score("elements...\nFinal Score: 4", 1, 5) == 4.0
    assert parse_final_score("**Final Score:** 3.5 and Final Score: 1", 1, 5) == 3.5
    for bad, why in (("Score: 4", "no 'Final Score"), ("Final Score: 7", "outside"), ("", "no")):
        with pytest.raises(Unparsed, match=why):
            parse_final_score(bad, 1, 5)
    assert parse_wise("Consistency: 2\nRealism: 1\nAesthetic Quality: 0") == (2.0, 1.0, 0.0)
    assert parse_wise("**Consistency**: 1\n**realism** 2\nAESTHETIC QUALITY：2") == (1.0, 2.0, 2.0)
    assert parse_wise("2\n0\n1\n") == (2.0, 0.0, 1.0)
    with pytest.raises(Unparsed, match="aesthetic_quality"):
        parse_wise("Consistency: 2\nRealism: 1")
    with pytest.raises(Unparsed, match="realism=3 outside 0-2"):
        parse_wise("Consistency: 2\nRealism: 3\nAesthetic Quality: 1")
    assert wiscore(2, 2, 2) == pytest.approx(1.0, abs=1e-12) and wiscore(0, 0, 0) == 0.0
    assert wiscore(2, 1, 0) == pytest.approx((0.7 * 2 + 0.2 * 1) / 2)


def test_unified_reward_reads_the_final_score_of_images_and_videos(ur_dir):
    images = _images(3, seed=3)
    judge = UnifiedReward(path=ur_dir, batch_size=3, max_new_tokens=8, **PIX)
    result = judge.score(images, PROMPTS, [{}] * 3)
    assert result.scores["unified_reward"].tolist() == [4.0, 4.0, 4.0]
    assert result.errors["unified_reward"] == [None] * 3
    assert result.metrics["unified_reward/unparsed"] == 0.0
    scaled = UnifiedReward(path=ur_dir, unit_scale=True, max_new_tokens=8, **PIX)
    assert scaled.score(images[:1], PROMPTS[:1], [{}]).scores["unified_reward"].tolist() == [0.75]
    video = UnifiedReward(path=ur_dir, unit_scale=True, max_new_tokens=8, max_frame_pixels=56 * 56)
    out = video.score_video(_videos(2, t=4), 8.0, PROMPTS[:2], [{}] * 2)
    assert out.scores["unified_reward"].tolist() == pytest.approx([3 / 9, 3 / 9])  # 1-10 scale


def test_wise_judge_scores_the_wiscore(wise_dir):
    judge = WISEJudge(path=wise_dir, batch_size=2, max_new_tokens=8, **PIX)
    meta = [{"explanation": "cherry blossoms"}, {}, {"explanation": "a sundial at noon"}]
    result = judge.score(_images(3, seed=5), PROMPTS, meta)
    assert result.scores["wise"].tolist() == pytest.approx([0.8] * 3)
    assert result.metrics["wise/consistency"] == 2.0
    assert result.metrics["wise/realism"] == 1.0
    assert result.metrics["wise/aesthetic_quality"] == 0.0


def test_judge_generation_is_batch_invariant_and_equals_hf_generate(noise_dir):
    images = _images(3, seed=6)
    judge = UnifiedReward(path=noise_dir, batch_size=3, max_new_tokens=6, **PIX)
    judge._ensure_ready()
    chats = [vlm_engine.image_chat(T.UNIFIEDREWARD_IMAGE.format(prompt=p)) for p in PROMPTS]
    visuals = [[("image", _u8(im))] for im in images]
    _, _, _, batched = judge.judge(chats, visuals, 0)
    singles = [judge.judge(chats[i : i + 1], visuals[i : i + 1], i)[3][0] for i in range(3)]
    assert batched == singles
    model, tok, proc = _load(noise_dir)
    size = {"shortest_edge": PIX["min_pixels"], "longest_edge": PIX["max_pixels"]}
    for i in range(3):
        vision = proc(images=[visuals[i][0][1]], return_tensors="pt", size=size)
        text = tok.apply_chat_template(chats[i], add_generation_prompt=True, tokenize=False)
        count = int(vision["image_grid_thw"].prod()) // 4
        ids = torch.tensor([tok(text.replace("<|image_pad|>", "<|image_pad|>" * count)).input_ids])
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=6,
            pixel_values=vision["pixel_values"],
            image_grid_thw=vision["image_grid_thw"],
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        assert tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True) == batched[i]


def test_an_unreadable_answer_is_nan_with_an_error_never_zero(noise_dir):
    judge = UnifiedReward(path=noise_dir, max_new_tokens=4, **PIX)
    result = judge.score(_images(2, seed=7), PROMPTS[:2], [{}] * 2)
    scores = result.scores["unified_reward"]
    assert torch.isnan(scores).all()
    for i, error in enumerate(result.errors["unified_reward"]):
        assert error.startswith(
            f"UnifiedReward: sample {i}: no 'Final Score: <number>' in the answer"
        )
    assert result.metrics["unified_reward/unparsed"] == 2.0
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 0]),
        decoded=Images(pixels=_images(2, seed=7)),
        prompts=PROMPTS[:2],
    )
    with pytest.raises(RewardError, match="sample 0"):
        RewardService(backend=judge).score_track(track)


# -- inside the trainer's RewardService ---------------------------------------------------------
def test_reward_service_scores_tracks_with_the_vlm_rewards(hps_dir, va_dir):
    images = _images(2, seed=8)
    hps = HPSv3(path=hps_dir, **PIX)
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 0]),
        decoded=Images(pixels=images),
        prompts=PROMPTS[:2],
    )
    scored, metrics = RewardService(backend=hps).score_track(track)
    assert torch.equal(scored.rewards, hps.score(images, PROMPTS[:2], [{}] * 2).scores["hpsv3"])
    assert "hpsv3/uncertainty" in metrics
    videos = _videos(2, t=4, seed=9)
    va = VideoAlign(path=va_dir, max_pixels=56 * 56)
    vtrack = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 0]),
        decoded=Videos(frames=videos, fps=8.0),
        prompts=PROMPTS[:2],
    )
    scored, _ = RewardService(backend=va).score_track(vtrack)
    direct = va.score_video(videos, 8.0, PROMPTS[:2], [{}] * 2).scores["videoalign"]
    assert torch.equal(scored.rewards, direct)


def test_reward_service_scores_edit_and_judge_tracks(er_dir, ur_dir, wise_dir):
    results, sources = _images(2, seed=14), _images(2, seed=15)
    er = EditReward(path=er_dir, **PIX)
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 0]),
        decoded=Images(pixels=results),
        prompts=PROMPTS[:2],
        references=Images(pixels=sources),
    )
    scored, metrics = RewardService(backend=er).score_track(track)
    direct = er.score_edit(results, sources, PROMPTS[:2], [{}] * 2).scores["edit_reward"]
    assert torch.equal(scored.rewards, direct)
    assert "edit_reward/quality" in metrics
    plain = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 0]),
        decoded=Images(pixels=results),
        prompts=PROMPTS[:2],
        metadata=[{"explanation": "x"}, {"explanation": "y"}],
    )
    judge = UnifiedReward(path=ur_dir, max_new_tokens=8, **PIX)
    scored, _ = RewardService(backend=judge).score_track(plain)
    assert scored.rewards.tolist() == [4.0, 4.0]
    wise = WISEJudge(path=wise_dir, max_new_tokens=8, **PIX)
    scored, metrics = RewardService(backend=wise).score_track(plain)
    assert scored.rewards.tolist() == pytest.approx([0.8, 0.8])
    assert metrics["wise/unparsed"] == 0.0


# -- loading errors -----------------------------------------------------------------------------
def test_missing_head_or_reward_token_is_one_line_naming_the_fix(tmp_path, hps_dir, noise_dir):
    import shutil

    headless = shutil.copytree(hps_dir, tmp_path / "headless")
    (headless / vlm_engine.HEAD_FILE).unlink()
    with pytest.raises(Exception, match=r"has no reward_head\.safetensors") as info:
        HPSv3(path=str(headless), **PIX).score(_images(1), ["x"], [{}])
    assert "\n" not in str(info.value) and "vlm.convert" in str(info.value)
    with pytest.raises(RewardError, match=r"lacks the reward token\(s\) <\|VQ_reward\|>") as info:
        VideoAlign(path=hps_dir).score_video(_videos(1), 8.0, ["x"], [{}])
    assert "\n" not in str(info.value)
    with pytest.raises(RewardError, match=r"lacks the reward token\(s\) <\|Reward\|>") as info:
        HPSv3(path=noise_dir, **PIX).score(_images(1), ["x"], [{}])
    assert "\n" not in str(info.value)
    with pytest.raises(RewardError, match=r"sample 0 holds 2 '<\|Reward\|>'"):
        HPSv3(path=hps_dir, **PIX).score(_images(1), ["a <|Reward|> b"], [{}])
    with pytest.raises(Exception, match="min_pixels=9 is above max_pixels=4"):
        HPSv3(path=hps_dir, min_pixels=9, max_pixels=4)
    with pytest.raises(Exception, match="max_frames=0: use a positive integer"):
        UnifiedReward(path=hps_dir, max_frames=0)
    assert vlm_engine.sample_frames(81, 16.0, 2.0, 32) == list(range(0, 81, 8))
    assert vlm_engine.sample_frames(81, 16.0, 16.0, 3) == [0, 40, 80]
    assert vlm_engine.sample_frames(9, 16.0, 2.0, 1) == [0]
    with pytest.raises(Exception, match="must have exactly the keys VQ, MQ, TA"):
        VideoAlign(path=hps_dir, weights={"VQ": 1.0})


# -- behind the standalone reward service -------------------------------------------------------
def test_the_reward_service_serves_the_vlm_rewards_over_http(
    hps_dir, er_dir, va_dir, ur_dir, wise_dir, noise_dir
):
    """A real ``unirl-reward-service`` on loopback: PNG images / frames survive the trip bit for
    bit, so the remote scores equal the in-process ones exactly."""
    service = pytest.importorskip("unirl_reward_service")
    from unirl_reward_service.testing import serve_in_thread

    from unirl.reward import RemoteRewardBackend

    config = {
        "server": {"require_auth": False, "batch_wait_ms": 2},
        "rewards": {
            "hpsv3": {"_target_": "unirl.reward.local.HPSv3", "path": hps_dir, **PIX},
            "edit": {"_target_": "unirl.reward.local.EditReward", "path": er_dir, **PIX},
            "video": {
                "_target_": "unirl.reward.local.VideoAlign",
                "path": va_dir,
                "max_pixels": 3136,
            },
            "unified": {
                "_target_": "unirl.reward.local.UnifiedReward",
                "path": ur_dir,
                "max_new_tokens": 8,
                **PIX,
            },
            "wise": {
                "_target_": "unirl.reward.local.WISEJudge",
                "path": wise_dir,
                "max_new_tokens": 8,
                **PIX,
            },
            "noise": {
                "_target_": "unirl.reward.local.UnifiedReward",
                "path": noise_dir,
                "max_new_tokens": 4,
                **PIX,
            },
        },
    }
    images, sources = _images(3, seed=10), _images(3, seed=11)
    videos = _videos(2, t=4, seed=12)
    with serve_in_thread(service.create_app(config)) as url:
        remote = RemoteRewardBackend(url=url, reward="hpsv3", components=("hpsv3",))
        got = remote.score(images, PROMPTS, [{}] * 3)
        edit = RemoteRewardBackend(url=url, reward="edit", components=("edit_reward",))
        got_edit = edit.score_edit(images, sources, PROMPTS, [{}] * 3)
        video = RemoteRewardBackend(url=url, reward="video", components=("videoalign",))
        got_video = video.score_video(videos, 8.0, PROMPTS[:2], [{}] * 2)
        judge = RemoteRewardBackend(url=url, reward="unified", components=("unified_reward",))
        got_judge = judge.score(images, PROMPTS, [{}] * 3)
        wise = RemoteRewardBackend(url=url, reward="wise", components=("wise",))
        got_wise = wise.score(images, PROMPTS, [{"explanation": "e"}] * 3)
        noise = RemoteRewardBackend(url=url, reward="noise", components=("unified_reward",))
        got_noise = noise.score(images[:1], PROMPTS[:1], [{}])
    local = HPSv3(path=hps_dir, **PIX).score(images, PROMPTS, [{}] * 3).scores["hpsv3"]
    assert torch.equal(got.scores["hpsv3"], local)
    assert got.errors["hpsv3"] == [None] * 3
    local_edit = EditReward(path=er_dir, **PIX).score_edit(images, sources, PROMPTS, [{}] * 3)
    assert torch.equal(got_edit.scores["edit_reward"], local_edit.scores["edit_reward"])
    local_video = VideoAlign(path=va_dir, max_pixels=3136).score_video(
        videos, 8.0, PROMPTS[:2], [{}] * 2
    )
    assert torch.equal(got_video.scores["videoalign"], local_video.scores["videoalign"])
    assert got_judge.scores["unified_reward"].tolist() == [4.0, 4.0, 4.0]
    assert got_wise.scores["wise"].tolist() == pytest.approx([0.8] * 3)
    # an unreadable answer crosses the wire as NaN with the server's error, not as 0
    assert torch.isnan(got_noise.scores["unified_reward"]).all()
    assert "no 'Final Score: <number>'" in got_noise.errors["unified_reward"][0]


# -- checkpoint conversion ----------------------------------------------------------------------
def test_convert_maps_a_released_style_checkpoint_onto_its_base(tmp_path):
    """A checkpoint in the released layout (pre-4.52 keys ``visual.*`` / ``model.*``, the reward
    token's embedding row, ``rm_head.*``) converted onto its base scores exactly like the model
    it was taken from."""
    from unirl.reward.local.vlm.convert import main

    base = _save(tmp_path / "base", "qwen2_vl", _tokenizer())
    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(base).eval()
    tok = transformers.AutoTokenizer.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": [T.HPSV3_REWARD_TOKEN]})
    model.resize_token_embeddings(len(tok))
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # "trained": differs from the base everywhere
    g = torch.Generator().manual_seed(4)
    head = {k: torch.randn(s, generator=g) * 0.5 for k, s in _ranknet_shapes("rm_head").items()}
    legacy = {}
    for key, value in model.state_dict().items():
        key = key.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
        legacy[key] = value.clone()
    safetensors_torch.save_file({**legacy, **head}, str(tmp_path / "HPSv3.safetensors"))
    out = tmp_path / "converted"
    args = ["--kind", "hpsv3", "--checkpoint", str(tmp_path / "HPSv3.safetensors")]
    assert main([*args, "--base", base, "--out", str(out), "--dtype", "fp32"]) == 0
    direct = tmp_path / "direct"
    model.save_pretrained(direct)
    tok.save_pretrained(direct)
    transformers.AutoImageProcessor.from_pretrained(base).save_pretrained(direct)
    safetensors_torch.save_file(head, str(direct / vlm_engine.HEAD_FILE))
    images = _images(2, seed=13)
    got = HPSv3(path=str(out), **PIX).score(images, PROMPTS[:2], [{}] * 2).scores["hpsv3"]
    want = HPSv3(path=str(direct), **PIX).score(images, PROMPTS[:2], [{}] * 2).scores["hpsv3"]
    assert torch.equal(got, want)
    with pytest.raises(RewardError, match="holds no rm_head"):
        safetensors_torch.save_file(legacy, str(tmp_path / "no_head.safetensors"))
        main(
            [
                "--kind",
                "hpsv3",
                "--checkpoint",
                str(tmp_path / "no_head.safetensors"),
                "--base",
                base,
                "--out",
                str(tmp_path / "x"),
            ]
        )
