"""The Qwen2.5-VL family on its tiny preset: the image layout and multimodal positions
against transformers' own, the sampler with images and its replay, vision tokens kept out
of completions, the arch presets' shapes on meta, and the shared text-family contract
(``text_family_tester.py``) with one image per prompt."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from text_family_tester import TextFamilyTester

from unirl.models.qwen_vl import QwenVLBundle, QwenVLPipeline
from unirl.models.qwen_vl.vision import mrope_positions, patchify
from unirl.types import Images, Packed, RolloutReq, TextRequest, Texts

PROMPTS = ["Find x.\nChoices: A. 1 B. 2 C. 3 D. 4", "Find the area.", "Find x.", "Which?"]


@pytest.fixture(scope="module")
def bundle() -> QwenVLBundle:
    return QwenVLBundle(path="tiny", dtype="fp32", device="cpu", image_size=56)


def images(n: int, seed: int = 0) -> Images:
    return Images(pixels=torch.rand(n, 3, 56, 56, generator=torch.Generator().manual_seed(seed)))


def request(n: int, *, image_seed: int = 0, **knobs: object) -> RolloutReq:
    block = {"max_new_tokens": 12, "temperature": 1.0, **knobs}
    ids = torch.arange(n)
    return RolloutReq(
        sample_ids=ids,
        group_ids=torch.zeros(n, dtype=torch.long),
        primitives={"text": Texts(texts=PROMPTS[:n]), "image": images(n, image_seed)},
        stage_params={"text": TextRequest(seed_ids=ids, **block)},  # type: ignore[arg-type]
    )


def test_patchify_equals_the_qwen2_vl_image_processor() -> None:
    from transformers import Qwen2VLImageProcessor

    proc = Qwen2VLImageProcessor(min_pixels=56 * 112, max_pixels=56 * 112)
    array = (np.random.RandomState(0).rand(56, 112, 3) * 255).astype(np.uint8)
    theirs = proc(images=[array], return_tensors="pt")
    ours, grid = patchify(torch.from_numpy(array).permute(2, 0, 1).float() / 255.0)
    assert grid.tolist() == theirs["image_grid_thw"][0].tolist() == [1, 4, 8]
    torch.testing.assert_close(ours, theirs["pixel_values"], atol=1e-5, rtol=0)


def test_mrope_positions_equal_the_model_rope_index(bundle: QwenVLBundle) -> None:
    image = bundle.prompts.image_token_id
    ids = [100, 101, 102, image, image, image, image, 103, 104]
    grid = torch.tensor([[1, 4, 4]])
    ours = mrope_positions(ids, image, grid.tolist())
    model = bundle.model.model
    kwargs = {"image_grid_thw": grid}
    if "mm_token_type_ids" in inspect.signature(model.get_rope_index).parameters:
        kwargs["mm_token_type_ids"] = (torch.tensor([ids]) == image).int()
    theirs, _ = model.get_rope_index(torch.tensor([ids]), **kwargs)
    assert torch.equal(ours, theirs[:, 0])
    assert ours[:, 3:7].tolist() == [[3] * 4, [3, 3, 4, 4], [3, 4, 3, 4]]  # t, h, w
    assert ours[:, 7].tolist() == [5, 5, 5]  # text resumes at p + max(h, w) / 2


def test_sampling_with_images_and_its_replay(bundle: QwenVLBundle) -> None:
    pipe = QwenVLPipeline(bundle=bundle, forward_batch_size=3)
    track = pipe.generate(request(4)).tracks["text"]
    seg, cond = track.segment, track.conditions
    assert cond.pixel_values.values.shape == (4 * 16, 1176)
    assert cond.image_grid_thw.tolist() == [[1, 4, 4]] * 4
    prompt = bundle.encode_prompts(PROMPTS[:1])[0]
    assert prompt.count(bundle.prompts.image_token_id) == 4  # 56 px: (56/14)² / 4
    with torch.no_grad():
        replay = pipe.token_log_probs(cond, seg).values
    m = seg.loss_mask.values
    assert float((replay[m] - seg.log_probs.values[m]).abs().max()) < 1e-5
    rows = Packed(values=replay, offsets=seg.tokens.offsets)
    with torch.no_grad():  # rows independent of their neighbours in the padded batch
        alone = pipe.token_log_probs(cond.select([2]), seg.select([2])).values
    torch.testing.assert_close(alone, rows.row(2), atol=2e-6, rtol=0)
    # the image matters: the same tokens under other images score differently
    other = dataclass_replace(cond, pixel_values=Packed.from_list([torch.randn(16, 1176)] * 4))
    with torch.no_grad():
        moved = pipe.token_log_probs(other, seg).values
    assert float((moved[m] - replay[m]).abs().max()) > 1e-4


def dataclass_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_completions_never_hold_vision_tokens(bundle: QwenVLBundle) -> None:
    pipe = QwenVLPipeline(bundle=bundle)
    suppressed = set(bundle.prompts.suppressed_token_ids)
    assert len(suppressed) == 4
    track = pipe.generate(request(4, max_new_tokens=48, temperature=2.0)).tracks["text"]
    seg = track.segment
    generated = seg.tokens.values[seg.loss_mask.values].tolist()
    assert len(generated) > 100 and not suppressed & set(generated)


def test_missing_images_are_refused(bundle: QwenVLBundle) -> None:
    req = request(2)
    req.primitives.pop("image")
    with pytest.raises(ValueError, match="no 'image' primitive"):
        QwenVLPipeline(bundle=bundle).generate(req)


@pytest.mark.parametrize(
    ("preset", "low", "high"),
    [("qwen2.5-vl-7b-arch", 8.2e9, 8.4e9), ("qwen2.5-vl-3b-arch", 3.7e9, 3.8e9)],
)
def test_arch_presets_have_the_released_sizes(preset: str, low: float, high: float) -> None:
    model = QwenVLBundle.trainable_on_meta({"path": preset})
    assert model is not None
    count = sum(p.numel() for p in model.parameters())
    assert low < count < high, count
    names = {n for n, _ in model.named_modules()}
    assert any(n.endswith("language_model.layers.0.self_attn.q_proj") for n in names)


@pytest.mark.parametrize("kind", ["grpo", "drpo"])
def test_first_ratio_is_exactly_one_with_images(kind: str) -> None:
    """fp32 CPU, old log-probs replayed at training geometry: the first update of a rollout
    is on-policy (ratio exactly 1 on every token), for GRPO and for DRPO, images included;
    the second update has moved."""
    from unirl.algorithms import DRPO, GRPO
    from unirl.train import FSDPBackend, LoraConfig, TrainStack

    vlm = QwenVLBundle(path="tiny", dtype="fp32", device="cpu", image_size=56)
    pipe = QwenVLPipeline(bundle=vlm)
    backend = FSDPBackend(
        bundle=vlm,
        lora=LoraConfig(rank=4, alpha=8),
        optimizer={"lr": 1e-2},
        param_dtype="fp32",
        trainable_attr="model",
    )
    algo = (
        GRPO(policy=pipe, clip_low=0.2, clip_high=0.28)
        if kind == "grpo"
        else DRPO(policy=pipe, epsilon=0.2)
    )
    stack = TrainStack(
        backend=backend, algorithm=algo, num_updates_per_batch=2, max_tokens_per_micro_batch=96
    )
    track = pipe.generate(request(4)).tracks["text"]
    advantages = torch.randn(4, generator=torch.Generator().manual_seed(1))
    out = stack.train_track(dataclass_replace(track, advantages=advantages), 0)
    first, second = out["steps"]
    assert first["ratio/min"] == 1.0 == first["ratio/max"]
    assert second["ratio/min"] != 1.0 or second["ratio/max"] != 1.0


class TestQwenVLTextFamily(TextFamilyTester):
    """Every prompt carries its own image (a function of the prompt's row); transformers'
    ``generate`` gets the same image as ``pixel_values`` / ``image_grid_thw``."""

    pipeline_class = QwenVLPipeline
    bundle_class = QwenVLBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"image_size": 56}

    def media(self, rows: list[int]) -> dict[str, Any]:
        pixels = torch.rand(4, 3, 56, 56, generator=torch.Generator().manual_seed(0))
        return {"image": Images(pixels=pixels[rows])}

    def hf_inputs(self, req: RolloutReq, i: int) -> dict[str, Any]:
        image = req.primitives["image"]
        assert isinstance(image, Images)
        pixel_values, grid = patchify(image.pixels[i])
        return {"pixel_values": pixel_values, "image_grid_thw": grid[None]}
