"""Reference images of editing prompt files: loading, resizing, repeat order, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from unirl.config import ConfigError
from unirl.data import read_prompt_file
from unirl.data.media import ReferenceImages, has_references, reference_of


def _write(tmp_path: Path, lines: list[dict]) -> Path:
    for name, color in (("red.png", (255, 0, 0)), ("blue.png", (0, 0, 255))):
        Image.new("RGB", (8, 6), color).save(tmp_path / name)
    path = tmp_path / "edits.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _edit(prompt: str, image: str) -> dict:
    return {"prompt": prompt, "media": [{"modality": "image", "role": "reference", "uri": image}]}


def test_references_load_resized_and_repeat_like_their_prompts(tmp_path: Path) -> None:
    examples = read_prompt_file(_write(tmp_path, [_edit("a", "red.png"), _edit("b", "blue.png")]))
    assert has_references(examples)
    pixels = ReferenceImages(4, 2).pixels(examples, repeat=3)
    assert pixels.shape == (6, 3, 4, 2)
    red = torch.tensor([1.0, 0.0, 0.0])[:, None, None].expand(3, 4, 2)
    blue = torch.tensor([0.0, 0.0, 1.0])[:, None, None].expand(3, 4, 2)
    for row in range(3):
        assert torch.equal(pixels[row], red)
        assert torch.equal(pixels[3 + row], blue)


def test_a_file_mixing_edits_and_plain_prompts_is_refused(tmp_path: Path) -> None:
    examples = read_prompt_file(_write(tmp_path, [_edit("a", "red.png"), {"prompt": "plain"}]))
    with pytest.raises(ConfigError, match=r"mixes edits and plain prompts.*'plain' has none"):
        has_references(examples)


def test_plain_prompts_have_no_references(tmp_path: Path) -> None:
    examples = read_prompt_file(_write(tmp_path, [{"prompt": "a"}, {"prompt": "b"}]))
    assert not has_references(examples)


def test_two_references_on_one_prompt_are_refused(tmp_path: Path) -> None:
    line = _edit("a", "red.png")
    line["media"].append({"modality": "image", "role": "source", "uri": "blue.png"})
    (example,) = read_prompt_file(_write(tmp_path, [line]))
    with pytest.raises(ConfigError, match="2 reference images"):
        reference_of(example)


def test_an_unreadable_reference_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, [_edit("a", "red.png")])
    (tmp_path / "red.png").write_bytes(b"not a png")
    (example,) = read_prompt_file(path)
    with pytest.raises(ConfigError, match=r"red\.png: cannot read reference image"):
        ReferenceImages(4, 4).pixels([example])
