"""The Qwen-VL side of examples/benchmarks/trl_grpo_compare.py reads what our side reads:
its locally built processor (transformers' Qwen2_5_VLProcessor + Qwen2VLImageProcessor with
defaults, our tokenizer, its ChatML image template) gives our bundle's prompt ids and our
patchify's pixels for the files make_vl_prompts.py writes, and its check refuses a template
or an image processor that differs. TRL itself is not needed here."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "examples" / "benchmarks"


def _module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("vl") / "prompts.jsonl"
    argv = ["--out", str(out), "--preset", "tiny", "--tokens", "16", "--count", "2"]
    assert _module("make_vl_prompts").main([*argv, "--image-size", "56"]) == 0
    compare = _module("trl_grpo_compare")
    args = argparse.Namespace(prompts=out, preset="tiny", image_size=56)
    texts, paths, formatter = compare.load_vl_prompts(args)
    return compare, texts, paths, formatter


def test_prompt_file_has_fixed_lengths_and_distinct_seeded_images(made) -> None:
    from PIL import Image

    _, texts, paths, formatter = made
    assert len(texts) == len(set(texts)) == 2
    assert [len(formatter.tokenizer(t, add_special_tokens=False).input_ids) for t in texts] == [
        16,
        16,
    ]
    # the chat turn + 4 image tokens (56 px) + the text: one length for every prompt
    assert {len(ids) for ids in formatter.encode_prompts(texts)} == {30}
    pixels = [Image.open(p).convert("RGB").tobytes() for p in paths]
    assert Image.open(paths[0]).size == (56, 56) and pixels[0] != pixels[1]


def test_processor_gives_our_prompt_ids_and_pixels(made) -> None:
    compare, texts, paths, formatter = made
    processor = compare.build_vl_processor(formatter.tokenizer)
    compare.check_vl_inputs(processor, formatter, texts, paths, 56)  # no error


def test_a_different_template_or_normalisation_is_refused(made) -> None:
    from transformers import Qwen2VLImageProcessor

    compare, texts, paths, formatter = made
    processor = compare.build_vl_processor(formatter.tokenizer)
    processor.chat_template = compare.VL_CHAT_TEMPLATE.replace("<|vision_end|>", "")
    with pytest.raises(SystemExit, match="prompt 0: TRL's processor gives 29 ids, our bundle 30"):
        compare.check_vl_inputs(processor, formatter, texts, paths, 56)
    processor = compare.build_vl_processor(formatter.tokenizer)
    processor.image_processor = Qwen2VLImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    with pytest.raises(SystemExit, match="image 0: the processor's pixel_values differ"):
        compare.check_vl_inputs(processor, formatter, texts, paths, 56)
    with pytest.raises(SystemExit, match="not 112x112: pass --image-size"):
        compare.check_vl_inputs(processor, formatter, texts, paths, 112)


def test_prompt_lines_use_the_prompt_file_format(made) -> None:
    _, _, paths, _ = made
    line = json.loads((Path(paths[0]).parent.parent / "prompts.jsonl").read_text().splitlines()[0])
    assert line["media"] == [{"modality": "image", "role": "condition", "uri": paths[0]}]
