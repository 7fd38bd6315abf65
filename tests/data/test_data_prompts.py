"""Prompt file formats and their error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unirl.data import MediaRef, PromptExample, PromptFileError, read_prompt_file


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_txt_one_prompt_per_non_empty_line(tmp_path):
    path = _write(tmp_path / "p.txt", '  a red circle \n\n\t\nA sign that says "OPEN"\nlast')
    assert read_prompt_file(path) == [
        PromptExample(prompt="a red circle"),
        PromptExample(prompt='A sign that says "OPEN"'),
        PromptExample(prompt="last"),
    ]


def test_jsonl_objects_with_metadata_and_media(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(b"png")
    lines = [
        {
            "prompt": "edit this",
            "media": [{"modality": "image", "role": "source", "uri": "imgs/a.png"}],
        },
        {"prompt": "q", "metadata": {"answer": "42"}, "difficulty": 3},
    ]
    path = _write(tmp_path / "p.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    first, second = read_prompt_file(path)
    assert first.media_refs == [
        MediaRef(modality="image", role="source", uri=str((tmp_path / "imgs" / "a.png").resolve()))
    ]
    assert first.metadata == {}
    assert second == PromptExample(prompt="q", metadata={"answer": "42", "difficulty": 3})


def test_json_list_of_strings_or_objects(tmp_path):
    path = _write(
        tmp_path / "p.json",
        json.dumps(["plain", {"prompt": 'say "HI"', "target_text": "HI"}], indent=2),
    )
    assert read_prompt_file(path) == [
        PromptExample(prompt="plain"),
        PromptExample(prompt='say "HI"', metadata={"target_text": "HI"}),
    ]
    with pytest.raises(PromptFileError, match="contains no prompts"):
        read_prompt_file(_write(tmp_path / "e.json", " [ ] \n"))


def test_unknown_extension_lists_accepted_ones(tmp_path):
    with pytest.raises(PromptFileError, match=r"\.csv.*\.txt, \.jsonl, \.json"):
        read_prompt_file(_write(tmp_path / "p.csv", "a\n"))


def test_missing_file(tmp_path):
    with pytest.raises(PromptFileError, match="prompt file not found"):
        read_prompt_file(tmp_path / "nope.txt")


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    path = _write(tmp_path / "p.jsonl", '{"prompt": "a"}\n\n{"prompt": "b"\n')
    with pytest.raises(PromptFileError, match=rf"{path}:3: invalid JSON"):
        read_prompt_file(path)
    path = _write(tmp_path / "q.jsonl", '{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(PromptFileError, match=rf"{path}:2: missing or empty 'prompt'"):
        read_prompt_file(path)
    path = _write(tmp_path / "r.jsonl", '"just a string"\n')
    with pytest.raises(PromptFileError, match=rf"{path}:1: each .jsonl line must be an object"):
        read_prompt_file(path)


def test_missing_media_file_names_file_and_line(tmp_path):
    good = {"prompt": "a"}
    bad = {"prompt": "b", "media": [{"modality": "image", "uri": "missing.png"}]}
    path = _write(tmp_path / "p.jsonl", f"{json.dumps(good)}\n{json.dumps(bad)}\n")
    with pytest.raises(PromptFileError, match=rf"{path}:2: media file not found: 'missing.png'"):
        read_prompt_file(path)


def test_json_item_errors_carry_the_item_line(tmp_path):
    text = '[\n  "ok",\n  {"prompt": "fine"},\n  {"prompt": ""}\n]\n'
    path = _write(tmp_path / "p.json", text)
    with pytest.raises(PromptFileError, match=rf"{path}:4: missing or empty 'prompt'"):
        read_prompt_file(path)
    path = _write(tmp_path / "q.json", '[\n  "ok",\n  3\n]')
    with pytest.raises(PromptFileError, match=rf"{path}:3: list items must be objects or strings"):
        read_prompt_file(path)
    path = _write(tmp_path / "r.json", '[\n  "ok"\n  "missing comma"\n]')
    with pytest.raises(PromptFileError, match=rf"{path}:3: invalid JSON"):
        read_prompt_file(path)
    path = _write(tmp_path / "s.json", '{"prompt": "not a list"}')
    with pytest.raises(PromptFileError, match=rf"{path}:1: .* must hold a list"):
        read_prompt_file(path)


def test_metadata_key_collision_is_an_error(tmp_path):
    path = _write(
        tmp_path / "p.jsonl", json.dumps({"prompt": "a", "answer": 1, "metadata": {"answer": 2}})
    )
    with pytest.raises(PromptFileError, match=r":1: key 'answer' is both top-level and inside"):
        read_prompt_file(path)
