"""OCR reward: the pure score on strings, and OCRScorer end to end on PIL-rendered text."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from unirl.config import ConfigError
from unirl.reward import RewardError
from unirl.reward.local import OCRScorer, extract_quoted_target, levenshtein, ocr_score


def test_levenshtein_known_distances():
    assert levenshtein("", "") == 0
    assert levenshtein("abc", "") == 3
    assert levenshtein("", "abcd") == 4
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("flaw", "lawn") == 2
    assert levenshtein("abc", "abc") == 0
    assert levenshtein("abc", "acb") == 2
    assert levenshtein("sitting", "kitten") == levenshtein("kitten", "sitting")


def test_extract_quoted_target_takes_first_pair():
    assert extract_quoted_target('A sign that says "OPEN LATE"') == "OPEN LATE"
    assert extract_quoted_target('say "one" then "two"') == "one"
    assert extract_quoted_target("no quotes here") is None
    assert extract_quoted_target('only one " quote') is None
    assert extract_quoted_target('empty ""') == ""


def test_ocr_score_formula():
    # exact, case and spaces ignored
    assert ocr_score("Open Late", "OPEN LATE") == 1.0
    # target is a substring of the recognised text -> distance 0
    assert ocr_score("WE ARE OPEN LATE TODAY", "open late") == 1.0
    # one substitution in a 10-character target
    assert ocr_score("lighthousx", "LIGHTHOUSE") == pytest.approx(0.9, abs=1e-12)
    # one missing character out of 8 ("openlate")
    assert ocr_score("openlat", "open late") == pytest.approx(1 - 1 / 8, abs=1e-12)
    # nothing recognised -> distance = len(target) -> 0
    assert ocr_score("", "HELLO") == 0.0
    # distance is capped at len(target): a long wrong reading cannot go negative
    assert ocr_score("completely different words here", "abc") == 0.0
    with pytest.raises(ValueError, match="empty"):
        ocr_score("abc", "   ")


def _font() -> ImageFont.FreeTypeFont:
    font = ImageFont.load_default(size=40)
    if not isinstance(font, ImageFont.FreeTypeFont):
        pytest.skip("Pillow was built without FreeType: no TrueType font to render test text")
    return font


def _render(text: str, width: int = 320, height: int = 96) -> torch.Tensor:
    """Black text centred on white with Pillow's bundled TrueType font: ``[3, H, W]`` in [0, 1]."""
    font = _font()
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    origin = ((width - (right - left)) / 2 - left, (height - (bottom - top)) / 2 - top)
    draw.text(origin, text, fill="black", font=font)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255.0


@pytest.fixture(scope="module")
def scorer() -> OCRScorer:
    pytest.importorskip("rapidocr_onnxruntime", reason="pip install 'unirl-mm[ocr]' for OCR tests")
    return OCRScorer(engine="rapidocr")


def test_ocr_scorer_on_rendered_text(scorer: OCRScorer):
    images = torch.stack(
        [_render("LIGHTHOUSE"), _render("LIGHTHOUSE"), torch.ones(3, 96, 320), _render("OPEN LATE")]
    )
    prompts = [
        'A sign that says "LIGHTHOUSE"',
        'A sign that says "LIGHTHOUSX"',  # one wrong character of ten
        'A sign that says "LIGHTHOUSE"',  # blank image
        'A sign that says "ignored"',  # metadata target wins
    ]
    metadata = [{}, {}, {}, {"target_text": "open late"}]
    result = scorer.score(images, prompts, metadata)
    assert result.scores["ocr"].dtype == torch.float32
    assert result.scores["ocr"].tolist() == pytest.approx([1.0, 0.9, 0.0, 1.0], abs=1e-6)
    assert result.metrics == {"ocr/failures": 0.0}
    assert result.errors["ocr"] == [None] * 4


def test_ocr_engine_failure_scores_zero_and_is_counted():
    class Broken:
        def __call__(self, *args, **kwargs):
            raise RuntimeError("onnx session died")

    scorer = OCRScorer()
    scorer._reader = Broken()
    result = scorer.score(torch.ones(2, 3, 8, 8), ['"a"', '"b"'], [{}, {}])
    assert result.scores["ocr"].tolist() == [0.0, 0.0]
    assert result.metrics["ocr/failures"] == 2.0
    assert "onnx session died" in result.errors["ocr"][0]


def test_ocr_prompt_without_quotes_names_the_sample():
    scorer = OCRScorer()
    with pytest.raises(RewardError, match=r"sample 1 has no target text.*'a plain prompt'"):
        scorer.score(torch.ones(2, 3, 8, 8), ['"ok"', "a plain prompt"], [{}, {}])


def test_ocr_missing_rapidocr_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    with pytest.raises(ImportError, match=r"pip install 'unirl-mm\[ocr\]'"):
        OCRScorer().score(torch.ones(1, 3, 8, 8), ['"x"'], [{}])


def test_easyocr_needs_a_local_model_dir(tmp_path):
    with pytest.raises(ConfigError, match="easyocr_model_dir"):
        OCRScorer(engine="easyocr")
    with pytest.raises(ConfigError, match="not a directory"):
        OCRScorer(engine="easyocr", easyocr_model_dir=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="engine="):
        OCRScorer(engine="tesseract")  # type: ignore[arg-type]
