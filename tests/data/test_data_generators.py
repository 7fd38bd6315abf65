"""The committed prompt sets: generators are deterministic and match the committed files."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def _load(script: str) -> ModuleType:
    if str(DATASETS) not in sys.path:  # as when run as `python datasets/<script>.py`
        sys.path.insert(0, str(DATASETS))
    spec = importlib.util.spec_from_file_location(script, DATASETS / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATORS = {
    "make_ocr_prompts": ("ocr", ["train.txt", "test.txt"]),
    "make_caption_prompts": ("captions", ["train.txt", "test.txt"]),
    "make_tiny_prompts": ("tiny", ["prompts.txt"]),
}


@pytest.mark.parametrize("script", sorted(GENERATORS))
def test_generator_is_deterministic_and_matches_committed_files(tmp_path, script):
    module = _load(script)
    folder, files = GENERATORS[script]
    module.main(["--out-dir", str(tmp_path / "a")])
    module.main(["--out-dir", str(tmp_path / "b")])
    for name in files:
        first = (tmp_path / "a" / name).read_bytes()
        assert first == (tmp_path / "b" / name).read_bytes()
        committed = DATASETS / folder / name
        assert committed.read_bytes() == first, f"{committed} is stale: rerun datasets/{script}.py"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_ocr_prompts_have_exactly_one_quoted_target_and_disjoint_splits():
    from unirl.reward.local import extract_quoted_target, normalize_ocr_text

    splits = {name: _lines(DATASETS / "ocr" / f"{name}.txt") for name in ("train", "test")}
    assert len(splits["train"]) == 2000 and len(splits["test"]) == 200
    targets = {}
    for name, lines in splits.items():
        for line in lines:
            assert line.count('"') == 2, line
            target = extract_quoted_target(line)
            assert target and re.fullmatch(r"[A-Za-z0-9 ]{2,16}", target), line
        targets[name] = {normalize_ocr_text(extract_quoted_target(x)) for x in lines}
    assert not targets["train"] & targets["test"]
    assert len(targets["test"]) == 40


def test_caption_and_tiny_sets():
    train, test = (
        _lines(DATASETS / "captions" / "train.txt"),
        _lines(DATASETS / "captions" / "test.txt"),
    )
    assert len(train) == len(set(train)) == 2000 and len(test) == len(set(test)) == 200
    assert not set(train) & set(test)
    tiny = _lines(DATASETS / "tiny" / "prompts.txt")
    assert len(tiny) == len(set(tiny)) == 64 and all(line.startswith("a ") for line in tiny)


def test_edit_set_is_deterministic_matches_the_committed_files_and_its_boxes(tmp_path):
    """jsonl byte for byte; PNGs pixel for pixel (encoders may differ between machines);
    each mask is white exactly on the line's ``edit_box`` and the source's shape lies in it."""
    import json

    import numpy as np
    from PIL import Image

    module = _load("make_edit_prompts")
    module.main(["--out-dir", str(tmp_path)])
    committed = DATASETS / "edit"
    lines = {}
    for split, count in (("train", 48), ("test", 16)):
        made = (tmp_path / f"{split}.jsonl").read_bytes()
        assert made == (committed / f"{split}.jsonl").read_bytes(), "rerun make_edit_prompts.py"
        lines[split] = [json.loads(x) for x in made.decode().splitlines()]
        assert len(lines[split]) == count
    for line in lines["train"] + lines["test"]:
        source_uri, mask_uri = (m["uri"] for m in line["media"])
        for uri in (source_uri, mask_uri):
            ours = np.asarray(Image.open(tmp_path / uri))
            assert np.array_equal(ours, np.asarray(Image.open(committed / uri))), uri
        mask = np.asarray(Image.open(committed / mask_uri)) > 0
        x0, y0, x1, y1 = (round(v * 64) for v in line["edit_box"])
        expected = np.zeros((64, 64), dtype=bool)
        expected[y0:y1, x0:x1] = True
        assert np.array_equal(mask, expected)
        source = np.asarray(Image.open(committed / source_uri)).astype(int)
        background = source[0, 0]
        assert (source[~mask] == background).all()  # nothing outside the box changes
        assert line["prompt"].split()[-1] in {
            "red",
            "green",
            "blue",
            "yellow",
            "white",
            "black",
            "orange",
            "purple",
        }
    train = {json.dumps(x["edit_box"]) + x["prompt"] for x in lines["train"]}
    assert not train & {json.dumps(x["edit_box"]) + x["prompt"] for x in lines["test"]}


def test_video_sets_are_deterministic_match_the_committed_files_and_their_prompts(tmp_path):
    """t2v.txt and i2v.jsonl byte for byte, first frames pixel for pixel; every first frame is
    32x48 with the backdrop and the one colour its prompt names; no scene twice."""
    import json

    import numpy as np
    from PIL import Image

    module = _load("make_video_prompts")
    module.main(["--out-dir", str(tmp_path / "a")])
    module.main(["--out-dir", str(tmp_path / "b")])
    committed = DATASETS / "video"
    for name in ("t2v.txt", "i2v.jsonl"):
        made = (tmp_path / "a" / name).read_bytes()
        assert made == (tmp_path / "b" / name).read_bytes()
        assert made == (committed / name).read_bytes(), "rerun make_video_prompts.py"
    t2v = _lines(committed / "t2v.txt")
    assert len(t2v) == len(set(t2v)) == 64
    for line in t2v:
        words = line.split()
        assert words[0] == ("an" if words[1][0] in "aeiou" else "a"), line
        assert " ".join(words[3:]) in module.MOTIONS, line
    lines = [json.loads(x) for x in _lines(committed / "i2v.jsonl")]
    assert len(lines) == 48 and len({x["prompt"] + x["media"][0]["uri"] for x in lines}) == 48
    frames = []
    for line in lines:
        [ref] = line["media"]
        assert ref["modality"] == "image" and ref["role"] == "reference", line
        ours = np.asarray(Image.open(tmp_path / "a" / ref["uri"]))
        frame = np.asarray(Image.open(committed / ref["uri"]))
        assert np.array_equal(ours, frame), ref["uri"]
        assert frame.shape == (32, 48, 3)
        colors = {tuple(int(c) for c in px) for px in frame.reshape(-1, 3)}
        shape_color = module.RGB[line["prompt"].split()[1]]
        assert colors == {tuple(frame[0, 0]), shape_color}, line  # backdrop + the named shape
        assert line["prompt"] == module.I2V_MOTIONS[line["motion"]].format(
            color=line["prompt"].split()[1], shape=line["prompt"].split()[2]
        )
        frames.append(frame.tobytes())
    assert len(set(frames)) == 48
