"""Model-based scorers (CLIP score, PickScore, HPS v2, ImageReward, LAION aesthetic) on tiny
randomly initialised models of the real architectures, saved to local folders.

Each scorer is checked against an independent computation in this file: the model's own
``forward`` (``logits_per_image``, ``question_embeds``) or, for the open_clip conversion, a
reference open_clip-layout network built here from ``nn.MultiheadAttention``.
Preprocessing references use sizes worked out by hand for 48x40 inputs at 32 px.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from unirl.config import ConfigError
from unirl.reward.local import (
    CLIPScore,
    HPSv2,
    ImageReward,
    LaionAesthetic,
    PickScore,
    RewardWeightsNotFound,
    convert_image_reward_checkpoint,
    convert_open_clip_checkpoint,
    convert_open_clip_state_dict,
)
from unirl.reward.local._hf import ImagePreprocess

transformers = pytest.importorskip("transformers")

MEAN = (0.5, 0.4, 0.3)  # deliberately not CLIP's, to prove they are read from the folder
STD = (0.2, 0.25, 0.3)
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
PROMPTS = ["a red cat", "a blue dog", "a red cat", "the photo of a dog", "a cat"]
BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "blue", "cat", "dog"]
BERT_WORDS += ["photo", "of", "the"]
META = [{} for _ in PROMPTS]
TOL = 1e-5


# -- fixtures: tiny models in local folders ---------------------------------------------------
def _clip_vocab() -> dict[str, int]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {c: i for i, c in enumerate(letters)}
    vocab.update({c + "</w>": 26 + i for i, c in enumerate(letters)})
    vocab["<|startoftext|>"] = 52
    vocab["<|endoftext|>"] = 53
    return vocab


def _tiny_clip_config():
    return transformers.CLIPConfig(
        text_config={
            "vocab_size": 54,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 16,
            "hidden_act": "gelu",
            "bos_token_id": 52,
            "eos_token_id": 53,
            "pad_token_id": 53,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
            "hidden_act": "gelu",
        },
        projection_dim=16,
        logit_scale_init_value=2.0,
    )


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_clip")
    torch.manual_seed(0)
    transformers.CLIPModel(_tiny_clip_config()).save_pretrained(path)
    transformers.CLIPTokenizer(vocab=_clip_vocab(), merges=[]).save_pretrained(path)
    transformers.CLIPImageProcessor(
        size={"shortest_edge": 32},
        crop_size={"height": 32, "width": 32},
        image_mean=list(MEAN),
        image_std=list(STD),
    ).save_pretrained(path)
    return str(path)


def _tiny_blip_config():
    return transformers.BlipConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
            "layer_norm_eps": 1e-6,
        },
        text_config={
            "vocab_size": len(BERT_WORDS) + 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 40,
            "pad_token_id": 0,
            "bos_token_id": len(BERT_WORDS),
            "sep_token_id": 3,
        },
        image_text_hidden_size=16,
    )


def _bert_tokenizer():
    return transformers.BertTokenizer(vocab={w: i for i, w in enumerate(BERT_WORDS)})


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_bert")
    _bert_tokenizer().save_pretrained(path)
    return str(path)


def _random_head(width: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = {0: (1024, width), 2: (128, 1024), 4: (64, 128), 6: (16, 64), 7: (1, 16)}
    state = {}
    for index, (rows, cols) in sizes.items():
        state[f"layers.{index}.weight"] = torch.randn(rows, cols, generator=g) / cols**0.5
        state[f"layers.{index}.bias"] = torch.randn(rows, generator=g) * 0.1
    return state


def _apply_head(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for index in (0, 2, 4, 6, 7):  # linear layers, no activations (as released)
        x = x @ state[f"layers.{index}.weight"].T + state[f"layers.{index}.bias"]
    return x.squeeze(-1)


@pytest.fixture(scope="module")
def image_reward_dir(tmp_path_factory):
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("tiny_image_reward")
    torch.manual_seed(1)
    model = transformers.BlipForImageTextRetrieval(_tiny_blip_config())
    with torch.no_grad():  # HF's 0.02 init leaves the cross attention nearly blind to the image
        for param in model.parameters():
            if param.ndim >= 2:
                param.normal_(0.0, 0.2)
    model.save_pretrained(path)
    tok = _bert_tokenizer()
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    tok.save_pretrained(path)
    save_file(_random_head(32, seed=2), str(path / "image_reward_head.safetensors"))
    return str(path)


@pytest.fixture(scope="module")
def aesthetic_head(tmp_path_factory):
    path = tmp_path_factory.mktemp("aesthetic") / "head.pth"
    torch.save(_random_head(16, seed=3), path)
    return str(path)


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(7)
    return torch.rand(len(PROMPTS), 3, 48, 40, generator=g)


# -- independent references -------------------------------------------------------------------
def _normalise(x, mean, std):
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def _ref_shortest_crop(images, mean, std):
    # 48x40 -> shorter side 40 -> 32, longer int(32 * 48 / 40) = 38; crop rows 3..35.
    x = F.interpolate(images, size=(38, 32), mode="bicubic", antialias=True, align_corners=False)
    return _normalise(x.clamp(0, 1)[:, :, 3:35, :], mean, std)


def _ref_longest_pad(images, mean, std):
    # 48x40 -> longer side 48 -> 32, shorter round(40 * 32 / 48) = 27; pad width 5 = 2 + 3.
    x = F.interpolate(images, size=(32, 27), mode="bicubic", antialias=True, align_corners=False)
    return _normalise(F.pad(x.clamp(0, 1), (2, 3, 0, 0)), mean, std)


def _clip_reference(clip_dir, pixels, prompts):
    """``(cos[N], exp(logit_scale))`` from ``CLIPModel.forward`` (max-length padding)."""
    model = transformers.CLIPModel.from_pretrained(clip_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(clip_dir)
    text = tok(prompts, padding="max_length", max_length=16, return_tensors="pt")
    with torch.no_grad():
        out = model(**text, pixel_values=pixels)
        scale = model.logit_scale.exp()
    return out.logits_per_image.diagonal() / scale, scale


def _check_common(scorer_factory, images, expected):
    """Shape, finiteness, equality with the reference, determinism, batch splitting."""
    scorer = scorer_factory(batch_size=len(PROMPTS))
    assert not scorer.loaded
    result = scorer.score(images, PROMPTS, META)
    scores = result.scores[scorer.name]
    assert scorer.loaded
    assert scores.shape == (len(PROMPTS),) and scores.dtype == torch.float32
    assert torch.isfinite(scores).all() and result.errors[scorer.name] == [None] * len(PROMPTS)
    torch.testing.assert_close(scores, expected.float(), rtol=TOL, atol=TOL)
    assert torch.equal(scorer.score(images, PROMPTS, META).scores[scorer.name], scores)
    # Not bitwise: other chunk shapes change the GEMM blocking (fp32 rounding, ~1e-7 of cos).
    split = scorer_factory(batch_size=2).score(images, PROMPTS, META).scores[scorer.name]
    torch.testing.assert_close(split, scores, rtol=TOL, atol=TOL)
    # Samples 0 and 2 share the prompt: only the image differs.
    assert abs(float(scores[0] - scores[2])) > 1e-4
    return scorer, scores


# -- CLIP score / PickScore -------------------------------------------------------------------
def test_clip_score_equals_scaled_cosine_of_clip_forward(clip_dir, images):
    cos, _ = _clip_reference(clip_dir, _ref_shortest_crop(images, MEAN, STD), PROMPTS)

    def make(**kw):
        return CLIPScore(model=clip_dir, clamp_min_zero=False, **kw)

    _check_common(make, images, 100.0 * cos)
    clamped = CLIPScore(model=clip_dir).score(images, PROMPTS, META).scores["clip_score"]
    torch.testing.assert_close(clamped, (100.0 * cos).clamp_min(0.0), rtol=TOL, atol=TOL)


def test_pickscore_is_logit_scale_times_cosine(clip_dir, images):
    cos, scale = _clip_reference(clip_dir, _ref_shortest_crop(images, MEAN, STD), PROMPTS)
    assert abs(float(scale) - float(np.exp(2.0))) < 1e-5  # logit_scale_init_value=2.0

    def make(**kw):
        return PickScore(model=clip_dir, processor=clip_dir, **kw)

    _check_common(make, images, scale * cos)


def test_torch_preprocessing_matches_clip_image_processor_without_resize(clip_dir):
    # Images already 32x32 on the uint8 grid: the PIL processor only rescales and normalises.
    g = torch.Generator().manual_seed(3)
    pixels = torch.randint(0, 256, (2, 32, 32, 3), generator=g, dtype=torch.uint8)
    processor = transformers.CLIPImageProcessor.from_pretrained(clip_dir)
    expected = processor(images=list(pixels.numpy()), return_tensors="pt")["pixel_values"]
    with open(f"{clip_dir}/preprocessor_config.json", encoding="utf-8") as handle:
        config = json.load(handle)
    ours = ImagePreprocess.from_processor_config(config, mode="shortest_crop")
    got = ours(pixels.permute(0, 3, 1, 2).float() / 255.0)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


# -- HPS v2 through the open_clip conversion --------------------------------------------------
def _open_clip_state(seed: int = 5) -> dict[str, torch.Tensor]:
    """A tiny open_clip ``CLIP`` state dict (width 32, MLP 64, 2 layers, embed 16, patch 8 at
    32 px), matching the tiny HF config used as the conversion base."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    def blocks(prefix):
        for i in range(2):
            p = f"{prefix}transformer.resblocks.{i}."
            sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = 1 + r(32), r(32)
            sd[p + "attn.in_proj_weight"], sd[p + "attn.in_proj_bias"] = r(96, 32), r(96)
            sd[p + "attn.out_proj.weight"], sd[p + "attn.out_proj.bias"] = r(32, 32), r(32)
            sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = 1 + r(32), r(32)
            sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = r(64, 32), r(64)
            sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = r(32, 64), r(32)

    sd: dict[str, torch.Tensor] = {
        "token_embedding.weight": r(54, 32),
        "positional_embedding": r(16, 32),
        "ln_final.weight": 1 + r(32),
        "ln_final.bias": r(32),
        "text_projection": r(32, 16),
        "logit_scale": torch.tensor(2.5),
        "attn_mask": torch.full((16, 16), float("-inf")).triu(1),
        "visual.class_embedding": r(32),
        "visual.positional_embedding": r(17, 32),
        "visual.conv1.weight": r(32, 3, 8, 8),
        "visual.ln_pre.weight": 1 + r(32),
        "visual.ln_pre.bias": r(32),
        "visual.ln_post.weight": 1 + r(32),
        "visual.ln_post.bias": r(32),
        "visual.proj": r(32, 16),
    }
    blocks("")
    blocks("visual.")
    return sd


def _open_clip_tower(sd, prefix, x, mask):
    """open_clip ``Transformer``: pre-LN residual blocks with ``nn.MultiheadAttention``."""
    for i in range(2):
        p = f"{prefix}transformer.resblocks.{i}."
        attn = nn.MultiheadAttention(32, 2, batch_first=True)
        attn.load_state_dict(
            {
                "in_proj_weight": sd[p + "attn.in_proj_weight"],
                "in_proj_bias": sd[p + "attn.in_proj_bias"],
                "out_proj.weight": sd[p + "attn.out_proj.weight"],
                "out_proj.bias": sd[p + "attn.out_proj.bias"],
            }
        )
        h = F.layer_norm(x, (32,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"])
        x = x + attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        h = F.layer_norm(x, (32,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])
        h = F.gelu(F.linear(h, sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"]))
        x = x + F.linear(h, sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"])
    return x


def _open_clip_reference(sd, pixels, token_ids):
    """open_clip ``encode_image`` / ``encode_text`` (normalised) -> ``cos[N]``."""
    with torch.no_grad():
        x = F.conv2d(pixels, sd["visual.conv1.weight"], stride=8).flatten(2).transpose(1, 2)
        cls = sd["visual.class_embedding"].expand(x.shape[0], 1, 32)
        x = torch.cat([cls, x], dim=1) + sd["visual.positional_embedding"]
        x = F.layer_norm(x, (32,), sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"])
        x = _open_clip_tower(sd, "visual.", x, None)
        x = F.layer_norm(x[:, 0], (32,), sd["visual.ln_post.weight"], sd["visual.ln_post.bias"])
        image = F.normalize(x @ sd["visual.proj"], dim=-1)
        t = sd["token_embedding.weight"][token_ids] + sd["positional_embedding"]
        t = _open_clip_tower(sd, "", t, sd["attn_mask"])
        t = F.layer_norm(t, (32,), sd["ln_final.weight"], sd["ln_final.bias"])
        t = t[torch.arange(t.shape[0]), token_ids.argmax(dim=-1)] @ sd["text_projection"]
        text = F.normalize(t, dim=-1)
    return (image * text).sum(-1)


@pytest.fixture(scope="module")
def hps_dir(tmp_path_factory, clip_dir):
    root = tmp_path_factory.mktemp("hps")
    torch.save({"state_dict": _open_clip_state()}, root / "HPS_v2_tiny.pt")
    return convert_open_clip_checkpoint(
        str(root / "HPS_v2_tiny.pt"), base=clip_dir, out_dir=str(root / "hf")
    )


def test_hps_v2_matches_open_clip_reference_after_conversion(hps_dir, images):
    sd = _open_clip_state()
    tok = transformers.AutoTokenizer.from_pretrained(hps_dir)
    text = tok(PROMPTS, padding="max_length", max_length=16, return_tensors="pt")
    ids = text["input_ids"] * text["attention_mask"]  # open_clip pads with 0
    expected = _open_clip_reference(sd, _ref_longest_pad(images, MEAN, STD), ids)

    def make(**kw):
        return HPSv2(model=hps_dir, **kw)

    _check_common(make, images, expected)
    hundred = HPSv2(model=hps_dir, scale=100.0).score(images, PROMPTS, META).scores["hps"]
    torch.testing.assert_close(hundred, 100.0 * expected, rtol=TOL, atol=1e-3)


def test_open_clip_conversion_rejects_unknown_keys_and_pt_paths():
    sd = _open_clip_state()
    sd["visual.transformer.resblocks.0.ls_1.gamma"] = torch.ones(32)  # layer scale: no HF twin
    with pytest.raises(ValueError, match=r"ls_1\.gamma"):
        convert_open_clip_state_dict(sd)
    converted = convert_open_clip_state_dict(
        {"module." + k: v for k, v in _open_clip_state().items()}
    )
    torch.testing.assert_close(
        converted["visual_projection.weight"], _open_clip_state()["visual.proj"].T
    )
    with pytest.raises(ConfigError, match="convert it once"):
        HPSv2(model="/models/HPS_v2_compressed.pt")


# -- ImageReward ------------------------------------------------------------------------------
def test_image_reward_matches_blip_forward_and_released_normalisation(image_reward_dir, images):
    from safetensors.torch import load_file

    model = transformers.BlipForImageTextRetrieval.from_pretrained(image_reward_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(image_reward_dir)
    text = tok(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    pixels = _ref_shortest_crop(images, OPENAI_MEAN, OPENAI_STD)
    with torch.no_grad():
        out = model(**text, pixel_values=pixels, use_itm_head=True)
    head = load_file(f"{image_reward_dir}/image_reward_head.safetensors")
    raw = _apply_head(head, out.question_embeds[:, 0, :])
    expected = (raw - 0.16717362830052426) / 1.0333394966054072

    def make(**kw):
        return ImageReward(model=image_reward_dir, **kw)

    _check_common(make, images, expected)


def _blip_to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers BLIP keys -> the BLIP_Pretrain layout of ImageReward.pt (written out)."""
    vision_top = {
        "embeddings.class_embedding": "cls_token",
        "embeddings.position_embedding": "pos_embed",
        "embeddings.patch_embedding.weight": "patch_embed.proj.weight",
        "embeddings.patch_embedding.bias": "patch_embed.proj.bias",
        "post_layernorm.weight": "norm.weight",
        "post_layernorm.bias": "norm.bias",
    }
    original = {}
    for key, value in state.items():
        if key.startswith("itm_head."):
            continue  # BLIP_Pretrain in ImageReward has no ITM head
        if key.startswith("vision_model."):
            name = key.removeprefix("vision_model.")
            name = vision_top.get(name) or (
                name.replace("encoder.layers.", "blocks.")
                .replace("layer_norm1", "norm1")
                .replace("layer_norm2", "norm2")
                .replace("self_attn.projection", "attn.proj")
                .replace("self_attn.qkv", "attn.qkv")
            )
            original["blip.visual_encoder." + name] = value
        else:
            original["blip." + key] = value
    original["blip.text_encoder.embeddings.position_ids"] = torch.arange(40).unsqueeze(0)
    return original


def test_image_reward_checkpoint_conversion_round_trip(
    image_reward_dir, bert_dir, images, tmp_path
):
    from safetensors.torch import load_file

    model = transformers.BlipForImageTextRetrieval.from_pretrained(image_reward_dir)
    original = _blip_to_original(model.state_dict())
    head = load_file(f"{image_reward_dir}/image_reward_head.safetensors")
    original.update({f"mlp.{k}": v for k, v in head.items()})
    torch.save(original, tmp_path / "ImageReward.pt")
    out = convert_image_reward_checkpoint(
        str(tmp_path / "ImageReward.pt"),
        tokenizer=bert_dir,
        out_dir=str(tmp_path / "hf"),
        config=image_reward_dir,
    )
    reference = ImageReward(model=image_reward_dir).score(images, PROMPTS, META)
    converted = ImageReward(model=out).score(images, PROMPTS, META)
    assert torch.equal(converted.scores["image_reward"], reference.scores["image_reward"])
    original["blip.visual_encoder_m.cls_token"] = torch.zeros(1)  # not part of ImageReward
    torch.save(original, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="visual_encoder_m"):
        convert_image_reward_checkpoint(
            str(tmp_path / "bad.pt"), tokenizer=bert_dir, out_dir=str(tmp_path / "x")
        )


# -- LAION aesthetic --------------------------------------------------------------------------
def test_laion_aesthetic_is_mlp_of_normalised_clip_image_embedding(
    clip_dir, aesthetic_head, images
):
    model = transformers.CLIPModel.from_pretrained(clip_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(clip_dir)
    text = tok(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**text, pixel_values=_ref_shortest_crop(images, MEAN, STD))
    expected = _apply_head(torch.load(aesthetic_head), out.image_embeds)  # image_embeds: unit norm

    def make(**kw):
        return LaionAesthetic(model=clip_dir, head=aesthetic_head, **kw)

    scorer, scores = _check_common(make, images, expected)
    other = scorer.score(images, ["x"] * len(PROMPTS), META).scores["aesthetic"]
    assert torch.equal(other, scores)  # the prompt is ignored


# -- loading, laziness, devices -----------------------------------------------------------------
def test_missing_weights_offline_raise_the_clear_error(monkeypatch, images, clip_dir, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(PROMPTS)
    cases = [
        (
            CLIPScore(model=str(tmp_path / "nowhere")),
            "no such folder; set model=/path/to/local/folder",
        ),
        (CLIPScore(model="nobody/not-a-model"), "HF_HUB_OFFLINE=1 and it is not in the local"),
        (
            PickScore(model=clip_dir, processor="nobody/no-proc"),
            "set processor=/path/to/local/folder",
        ),
        (HPSv2(model=str(tmp_path / "hps")), "set model=/path/to/local/folder"),
        (ImageReward(model="nobody/image-reward"), "set model=/path/to/local/folder"),
        (LaionAesthetic(model=clip_dir, head=str(tmp_path / "h.pth")), "no such file; set head="),
    ]
    for scorer, message in cases:
        with pytest.raises(RewardWeightsNotFound, match=message.replace(".", r"\.")):
            scorer.score(images, PROMPTS, [{}] * n)
        assert not scorer.loaded


def test_construction_is_lazy_and_hydra_round_trips():
    scorers = [
        CLIPScore(),
        PickScore(),
        HPSv2(model="/nowhere/hps"),
        ImageReward(model="/nowhere/ir", dtype="bfloat16", device="cuda:1"),
        LaionAesthetic(head="/nowhere/head.pth", batch_size=4),
    ]
    for scorer in scorers:
        assert not scorer.loaded
        node = OmegaConf.create({"reward": scorer}).reward
        rebuilt = OmegaConf.to_object(node)
        assert type(rebuilt) is type(scorer) and rebuilt == scorer and not rebuilt.loaded
    assert scorers[3].dtype == "bf16" and scorers[3].torch_device == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="batch_size"):
        CLIPScore(batch_size=0)
    with pytest.raises(ConfigError, match="precision"):
        PickScore(dtype="int8")


def test_offload_onload_and_bf16(clip_dir, images):
    scorer = CLIPScore(model=clip_dir, clamp_min_zero=False)
    first = scorer.score(images, PROMPTS, META).scores["clip_score"]
    scorer.offload()
    assert scorer._offloaded
    again = scorer.score(images, PROMPTS, META).scores["clip_score"]  # onloads by itself
    assert not scorer._offloaded and torch.equal(first, again)
    scorer.to("cpu").onload()
    half = CLIPScore(model=clip_dir, clamp_min_zero=False, dtype="bf16")
    low = half.score(images, PROMPTS, META).scores["clip_score"]
    assert half._bundle.model.dtype == torch.bfloat16 and low.dtype == torch.float32
    assert torch.isfinite(low).all() and (low - first).abs().max() < 2.0  # 100·cos; measured 0.62
