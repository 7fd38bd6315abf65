"""GenEval's rule layer on rendered scenes (coloured shapes drawn with PIL, ground-truth
detections handed in below the detector), the prompt-set generator, the deterministic blob
detector, and the transformers path (Mask2Former and CLIP) on tiny random weights of the real
architectures, each compared with a computation written out in this file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from unirl.config import ConfigError
from unirl.reward.local.geneval import (
    COLORS,
    ColourBlobDetector,
    Detection,
    GenEval,
    GenEvalRules,
    MeanColourClassifier,
    box_iou,
    connected_components,
    evaluate_clauses,
    format_table,
    make_prompt_set,
    object_crop,
    plural,
    relative_position,
    select_detections,
    task_table,
)
from unirl.reward.local.geneval.detectors import REFERENCE_RGB

ROOT = Path(__file__).resolve().parents[2]
SIZE = 64


# -- rendered scenes -----------------------------------------------------------------------------
def render(shapes: list[tuple[str, str, tuple[int, int, int, int]]], score: float = 0.95):
    """Draw ``(label, colour, box)`` rectangles / ellipses (ellipse when the label is ``ball``)
    on a grey 64x64 canvas. Returns ``image[3, H, W]`` in [0, 1] and the ground-truth
    detections (mask = the drawn pixels, box = their extent, the given score)."""
    canvas = Image.new("RGB", (SIZE, SIZE), (128, 128, 128))
    dets = []
    for label, colour, box in shapes:
        rgb = tuple(round(255 * v) for v in REFERENCE_RGB[colour])
        layer = Image.new("L", (SIZE, SIZE), 0)
        draw = ImageDraw.Draw(layer)
        x0, y0, x1, y1 = box  # inclusive pixel corners
        (draw.ellipse if label == "ball" else draw.rectangle)((x0, y0, x1, y1), fill=255)
        canvas.paste(Image.new("RGB", (SIZE, SIZE), rgb), mask=layer)
        mask = np.asarray(layer) > 0
        ys, xs = np.nonzero(mask)
        extent = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
        dets.append(Detection(label, extent, score, mask))
    pixels = torch.from_numpy(np.asarray(canvas, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return pixels, dets


def judge(meta: dict, image, dets, rules: GenEvalRules | None = None):
    rules = rules or GenEvalRules()
    kept = select_detections(dets, meta["tag"], rules)
    colours = MeanColourClassifier()
    return evaluate_clauses(
        meta, kept, lambda objs, name: colours.classify(image, objs, name), rules.position_margin
    )


def one(name, **kw):
    return {"class": name, "count": 1, **kw}


# -- single object, two objects --------------------------------------------------------------
def test_single_and_two_object_scenes():
    image, dets = render([("cat", "red", (4, 4, 20, 20)), ("dog", "blue", (40, 30, 60, 50))])
    assert judge({"tag": "single_object", "include": [one("cat")]}, image, dets).correct
    missing = judge({"tag": "single_object", "include": [one("bus")]}, image, dets)
    assert not missing.correct and missing.reasons == ["expected bus>=1, found 0"]
    both = judge({"tag": "two_object", "include": [one("cat"), one("dog")]}, image, dets)
    assert both.correct and both.fraction == 1.0
    half = judge({"tag": "two_object", "include": [one("cat"), one("bus")]}, image, dets)
    assert not half.correct and (half.clauses_met, half.clauses_total) == (1, 2)


# -- counting ---------------------------------------------------------------------------------
def _clocks(n: int, score: float = 0.95):
    return render([("clock", "white", (2 + 15 * i, 10, 12 + 15 * i, 20)) for i in range(n)], score)


COUNT_TWO = {
    "tag": "counting",
    "include": [{"class": "clock", "count": 2}],
    "exclude": [{"class": "clock", "count": 3}],
}


def test_counting_exact_count_too_few_and_too_many():
    assert judge(COUNT_TWO, *_clocks(2)).correct
    few = judge(COUNT_TWO, *_clocks(1))
    assert not few.correct and few.reasons == ["expected clock>=2, found 1"]
    many = judge(COUNT_TWO, *_clocks(3))
    assert not many.correct and many.reasons == ["expected clock<3, found 3"]
    assert (many.clauses_met, many.clauses_total) == (1, 2)


def test_counting_threshold_filters_a_weak_third_object_only_for_counting():
    image, dets = _clocks(3)
    dets[2] = Detection("clock", dets[2].box, 0.85, dets[2].mask)  # above 0.3, below 0.9
    assert judge(COUNT_TWO, image, dets).correct  # the counting threshold drops it
    as_two_object = {**COUNT_TWO, "tag": "two_object"}  # same clauses at threshold 0.3
    assert not judge(as_two_object, image, dets).correct


def test_low_scores_are_filtered_strictly_above_the_threshold():
    image, dets = render([("cat", "red", (4, 4, 20, 20))], score=0.3)
    meta = {"tag": "single_object", "include": [one("cat")]}
    assert not judge(meta, image, dets).correct  # 0.3 is not > 0.3
    image, dets = render([("cat", "red", (4, 4, 20, 20))], score=0.3001)
    assert judge(meta, image, dets).correct


# -- colours ----------------------------------------------------------------------------------
@pytest.mark.parametrize("colour", COLORS)
def test_colour_scenes_every_benchmark_colour(colour):
    image, dets = render([("ball", colour, (10, 10, 40, 40))])
    for asked in COLORS:
        meta = {"tag": "colors", "include": [one("ball", color=asked)]}
        assert judge(meta, image, dets).correct == (asked == colour)


def test_colour_is_judged_on_the_most_confident_objects_only():
    image, dets = render([("dog", "red", (2, 2, 20, 20)), ("dog", "green", (30, 30, 60, 60))])
    dets = [Detection("dog", d.box, s, d.mask) for d, s in zip(dets, (0.5, 0.9), strict=True)]
    meta = {"tag": "colors", "include": [one("dog", color="red")]}
    result = judge(meta, image, dets)
    assert not result.correct  # the green dog (0.9) is the one classified
    assert result.reasons == ["expected red dog>=1, found 0 red; and 1 green"]


def test_colour_attribution_swapped_colours_fail_both_clauses():
    image, dets = render([("bus", "red", (2, 2, 25, 25)), ("cup", "green", (35, 35, 60, 60))])
    good = {"tag": "color_attr", "include": [one("bus", color="red"), one("cup", color="green")]}
    swapped = {"tag": "color_attr", "include": [one("bus", color="green"), one("cup", color="red")]}
    assert judge(good, image, dets).correct
    bad = judge(swapped, image, dets)
    assert (bad.correct, bad.clauses_met) == (False, 0)


# -- position ---------------------------------------------------------------------------------
def test_relative_position_by_hand():
    a = Detection("a", (0, 0, 10, 10), 1.0)
    b = Detection("b", (20, 0, 30, 10), 1.0)
    # offset (-20, 0), sizes sum (20, 20): shrunk x = -(20 - 2) -> dx = -0.9
    assert relative_position(a, b) == {"left of"}
    assert relative_position(b, a) == {"right of"}
    # diagonal: offset (20, 20), shrunk (16, 16) / |offset| 28.28 -> 0.566 each: both
    c = Detection("c", (20, 20, 30, 30), 1.0)
    assert relative_position(c, a) == {"right of", "below"}
    # offset (10, 30): shrunk (6, 26) / 31.62 -> (0.19, 0.82): below only
    d = Detection("d", (10, 30, 20, 40), 1.0)
    assert relative_position(d, a) == {"below"}
    # offset (-12, 20): shrunk (-10, 18) / 23.32 -> (-0.43, 0.77): below, not left of
    f = Detection("f", (0, 20, 10, 30), 1.0)
    g = Detection("g", (12, 0, 22, 10), 1.0)
    assert relative_position(f, g) == {"below"}
    # centres 1.5 px apart, margins 2 px: no relation at all
    e = Detection("e", (1.5, 0, 11.5, 10), 1.0)
    assert relative_position(e, a) == set()
    assert relative_position(e, a, margin=0.0) == {"right of"}


def _position(relation: str) -> dict:
    return {"tag": "position", "include": [one("dog"), one("cat", position=[relation, 0])]}


def test_position_scenes_and_the_ambiguous_case():
    image, dets = render([("dog", "blue", (2, 20, 20, 40)), ("cat", "red", (40, 20, 58, 40))])
    assert judge(_position("right of"), image, dets).correct
    wrong = judge(_position("left of"), image, dets)
    assert not wrong.correct and wrong.reasons == [
        "expected cat left of target, found right of target"
    ]
    # the cat straight above the dog, overlapping: centres 4 px apart, margins 3.6 + 3.6 px
    image, dets = render([("dog", "blue", (20, 20, 37, 37)), ("cat", "red", (20, 16, 37, 33))])
    ambiguous = judge(_position("above"), image, dets)
    assert not ambiguous.correct
    assert ambiguous.reasons == ["expected cat above target, found no relation target"]


def test_position_without_a_matched_target():
    image, dets = render([("cat", "red", (40, 20, 58, 40))])
    result = judge(_position("right of"), image, dets)
    assert result.reasons == ["expected dog>=1, found 0", "no target for cat to be right of"]
    assert result.clauses_met == 0


def test_exclude_clause_any_match_fails():
    image, dets = render([("cat", "red", (4, 4, 20, 20)), ("dog", "blue", (40, 30, 60, 50))])
    meta = {"tag": "single_object", "include": [one("cat")], "exclude": [one("dog")]}
    result = judge(meta, image, dets)
    assert not result.correct and result.reasons == ["expected dog<1, found 1"]
    meta["exclude"] = [one("bus")]
    assert judge(meta, image, dets).correct


# -- selection: NMS, cap, IoU ------------------------------------------------------------------
def test_box_iou_and_nms():
    assert box_iou((0, 0, 9, 9), (5, 0, 14, 9)) == pytest.approx(50 / 150, abs=0)
    assert box_iou((0, 0, 9, 9), (20, 20, 29, 29)) == 0.0
    dets = [Detection("cat", (0, 0, 9, 9), 0.9), Detection("cat", (5, 0, 14, 9), 0.8)]
    assert len(select_detections(dets, "two_object", GenEvalRules())["cat"]) == 2  # NMS off
    kept = select_detections(dets, "two_object", GenEvalRules(nms_threshold=0.3))["cat"]
    assert [d.score for d in kept] == [0.9]
    kept = select_detections(dets, "two_object", GenEvalRules(nms_threshold=0.34))["cat"]
    assert len(kept) == 2  # IoU 1/3 < 0.34 survives


def test_max_objects_cap_and_order():
    dets = [Detection("cup", (i, 0, i + 1, 1), 0.31 + 0.01 * i) for i in range(20)]
    kept = select_detections(dets, "colors", GenEvalRules())["cup"]
    assert (
        len(kept) == 16
        and kept[0].score == pytest.approx(0.50)
        and kept[-1].score == pytest.approx(0.35)
    )


# -- tables -------------------------------------------------------------------------------------
def test_task_table_and_format():
    tags = ["counting", "counting", "colors", "position", "position", "position"]
    table = task_table(tags, [1, 0, 1, 1, 1, 0])
    assert table == {
        "counting": 0.5,
        "colors": 1.0,
        "position": pytest.approx(2 / 3),
        "overall": pytest.approx((0.5 + 1.0 + 2 / 3) / 3),
    }
    text = format_table(table, {"counting": 2, "colors": 1, "position": 3})
    assert text.splitlines()[0] == (
        "| Overall | Single object | Two object | Counting | Colors | Position | Color attribution |"
    )
    assert text.splitlines()[2] == "| 0.72 | - | - | 0.50 | 1.00 | 0.67 | - |"
    assert text.splitlines()[3] == "| 6 | 0 | 0 | 2 | 1 | 3 | 0 |"


# -- the reward backend -------------------------------------------------------------------------
def test_blob_detector_finds_rendered_shapes_exactly():
    image, truth = render([("blob", "red", (4, 4, 19, 19)), ("blob", "blue", (30, 30, 55, 50))])
    found = ColourBlobDetector().detect(image[None])[0]
    assert sorted(d.box for d in found) == sorted(d.box for d in truth)
    for det in found:
        area = float(det.mask.sum())
        assert det.score == pytest.approx(min(1.0, area / (0.25 * SIZE * SIZE)), abs=1e-12)
    labels = connected_components(np.array([[1, 1, 0, 1], [0, 1, 0, 1], [1, 0, 0, 0]], bool))
    assert labels.tolist() == [[1, 1, 0, 2], [0, 1, 0, 2], [3, 0, 0, 0]]


def test_geneval_backend_scores_and_metrics():
    red, _ = render([("blob", "red", (4, 4, 40, 40))])
    two, _ = render([("blob", "blue", (2, 2, 30, 60)), ("blob", "green", (34, 2, 62, 60))])
    images = torch.stack([red, red, two])
    metadata = [
        {"tag": "colors", "include": [one("blob", color="red")]},
        {"tag": "colors", "include": [one("blob", color="blue")]},
        {"tag": "counting", "include": [{"class": "blob", "count": 2}],
         "exclude": [{"class": "blob", "count": 3}]},
    ]  # fmt: skip
    prompts = ["a red blob", "a blue blob", "two blobs"]
    scorer = GenEval(detector=ColourBlobDetector(), colours=MeanColourClassifier())
    result = scorer.score(images, prompts, metadata)
    assert result.scores["geneval"].tolist() == [1.0, 0.0, 1.0]
    assert result.metrics["geneval/colors"] == 0.5 and result.metrics["geneval/counting"] == 1.0
    assert result.metrics["geneval/overall"] == 0.75


def test_geneval_backend_refuses_bad_metadata_and_missing_colour_classifier():
    image, _ = render([("blob", "red", (4, 4, 40, 40))])
    scorer = GenEval(detector=ColourBlobDetector())
    with pytest.raises(ConfigError, match=r"metadata\['tag'\]=None is not a GenEval task"):
        scorer.score(image[None], ["a red blob"], [{}])
    with pytest.raises(ConfigError, match="'count' \\(an integer >= 1\\)"):
        scorer.score(image[None], ["x"], [{"tag": "colors", "include": [{"class": "blob"}]}])
    with pytest.raises(ConfigError, match=r"GenEval\.colours is null"):
        scorer.score(image[None], ["x"], [{"tag": "colors", "include": [one("blob", color="red")]}])
    with pytest.raises(ConfigError, match=r"GenEval\.reward='strict'"):
        GenEval(detector=ColourBlobDetector(), reward="strict")


# -- prompt sets ---------------------------------------------------------------------------------
def _load_generator():
    path = ROOT / "datasets" / "make_geneval_prompts.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("make_geneval_prompts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prompt_files_are_current_and_well_formed(tmp_path):
    _load_generator().main(["--out-dir", str(tmp_path)])
    committed = ROOT / "datasets" / "geneval"
    for name in (
        "evaluation_metadata.jsonl",
        "train.jsonl",
        "blobs_train.jsonl",
        "blobs_test.jsonl",
    ):
        made = (tmp_path / name).read_bytes()
        assert made == (committed / name).read_bytes(), (
            f"rerun datasets/make_geneval_prompts.py ({name})"
        )
    records = [json.loads(line) for line in (committed / "evaluation_metadata.jsonl").open()]
    counts = {t: sum(r["tag"] == t for r in records) for t in {r["tag"] for r in records}}
    assert counts == {"single_object": 80, "two_object": 99, "counting": 80, "colors": 94,
                      "position": 100, "color_attr": 100}  # fmt: skip
    train = {json.loads(line)["prompt"] for line in (committed / "train.jsonl").open()}
    assert not train & {r["prompt"] for r in records}
    for r in records:
        if r["tag"] == "counting":
            n = r["include"][0]["count"]
            assert r["exclude"] == [{"class": r["include"][0]["class"], "count": n + 1}]
            assert r["prompt"].split()[3] == {2: "two", 3: "three", 4: "four"}[n]
        if r["tag"] == "position":
            relation, target = r["include"][1]["position"]
            a, b = r["include"][1]["class"], r["include"][0]["class"]
            assert target == 0 and r["prompt"].endswith(
                f"{a} {relation} {'an' if b[0] in 'aeiou' else 'a'} {b}"
            )


def test_plurals_and_determinism():
    assert [plural(w) for w in ("bus", "person", "sheep", "wine glass", "knife", "cup")] == [
        "buses", "people", "sheep", "wine glasses", "knives", "cups"]  # fmt: skip
    assert make_prompt_set(3) == make_prompt_set(3) != make_prompt_set(4)


# -- transformers path on tiny random weights ---------------------------------------------------
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mask2former_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_m2f")
    config = transformers.Mask2FormerConfig(
        backbone_config=transformers.SwinConfig(
            image_size=64, patch_size=4, embed_dim=32, depths=[1, 1, 1, 1],
            num_heads=[1, 1, 2, 2], window_size=4,
            out_features=["stage1", "stage2", "stage3", "stage4"],
        ),
        feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=32,
        dim_feedforward=32, encoder_layers=1, decoder_layers=2, num_attention_heads=2,
        num_queries=6, num_labels=3, id2label={0: "cat", 1: "dog", 2: "blob"},
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Mask2FormerForUniversalSegmentation(config).save_pretrained(path)
    return str(path)


def test_mask2former_detector_matches_a_float64_postprocess(mask2former_dir):
    from unirl.reward.local.geneval import Mask2FormerDetector

    image, _ = render([("cat", "red", (4, 4, 30, 30))])
    image = image[:, :, :48]  # 64 x 48: a resize and a pad
    detector = Mask2FormerDetector(
        model=mask2former_dir, short_side=64, long_side=96, max_per_image=5
    )
    found = detector.detect(image[None])[0]
    net = detector._model
    # independent: resize 64x48 -> 85x64 (scale 4/3), pad to 96x64, forward, float64 scoring
    x = torch.round(image[None] * 255.0)
    x = torch.nn.functional.interpolate(x, size=(85, 64), mode="bilinear", align_corners=False)
    x = (x - torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)) / torch.tensor(
        [58.395, 57.12, 57.375]).view(1, 3, 1, 1)  # fmt: skip
    x = torch.nn.functional.pad(x, (0, 0, 0, 11))
    with torch.no_grad():
        out = net(pixel_values=x)
    masks = torch.nn.functional.interpolate(
        out.masks_queries_logits, size=(96, 64), mode="bilinear"
    )
    masks = torch.nn.functional.interpolate(masks[..., :85, :], size=(64, 48), mode="bilinear")[
        0
    ].double()
    probs = out.class_queries_logits[0].double().softmax(-1)[:, :-1]
    expected = []
    for q in range(6):
        for c in range(3):
            binary = masks[q] > 0
            mask_score = (masks[q].sigmoid() * binary).sum() / (binary.sum() + 1e-6)
            expected.append((float(probs[q, c] * mask_score), ["cat", "dog", "blob"][c], binary))
    top = sorted(expected, key=lambda e: -float(probs.flatten()[expected.index(e)]))[:5]
    got = sorted(found, key=lambda d: -d.score)
    want = sorted(top, key=lambda e: -e[0])
    assert [d.label for d in got] == [e[1] for e in want]
    for det, (score, _, binary) in zip(got, want, strict=True):
        assert det.score == pytest.approx(score, abs=1e-6)
        assert np.array_equal(det.mask, binary.numpy())
        ys, xs = np.nonzero(det.mask)
        if len(xs):
            assert det.box == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    # end to end through the rules: a finite 0/1 per image
    result = GenEval(detector=detector).score(
        image[None], ["a cat"], [{"tag": "single_object", "include": [one("cat")]}]
    )
    assert result.scores["geneval"].tolist()[0] in (0.0, 1.0)


def _tiny_clip_dir(path: Path) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {c: i for i, c in enumerate(letters)}
    vocab.update({c + "</w>": 26 + i for i, c in enumerate(letters)})
    vocab.update({"<|startoftext|>": 52, "<|endoftext|>": 53})
    config = transformers.CLIPConfig(
        text_config={"vocab_size": 54, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2,
                     "max_position_embeddings": 40, "bos_token_id": 52, "eos_token_id": 53,
                     "pad_token_id": 53},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )  # fmt: skip
    torch.manual_seed(1)
    transformers.CLIPModel(config).save_pretrained(path)
    transformers.CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(path)
    transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    ).save_pretrained(path)
    return str(path)


def test_clip_colour_classifier_matches_the_model_forward(tmp_path):
    from unirl.reward.local._hf import ImagePreprocess
    from unirl.reward.local.geneval import CLIPColourClassifier
    from unirl.reward.local.geneval.detectors import COLOUR_TEMPLATES

    folder = _tiny_clip_dir(tmp_path)
    image, dets = render([("cat", "red", (4, 4, 40, 30)), ("ball", "blue", (30, 35, 60, 60))])
    crop = object_crop(image, dets[1])
    assert tuple(crop.shape) == (3, 26, 31)  # the ellipse's extent
    outside = ~torch.from_numpy(dets[1].mask)[35:61, 30:61]
    assert torch.all(crop[:, outside] == 153 / 255)  # grey outside the mask, not the red cat
    clf = CLIPColourClassifier(model=folder)
    got = clf.classify(image, dets, "cat")
    model = transformers.CLIPModel.from_pretrained(folder).eval()
    tok = transformers.CLIPTokenizer.from_pretrained(folder)
    texts = [t.format(c=c, classname="cat") for c in COLORS for t in COLOUR_TEMPLATES]
    batch = tok(texts, padding=True, return_tensors="pt")
    pre = ImagePreprocess(crop_size=32, resize_size=32, mean=(0.48145466, 0.4578275, 0.40821073),
                          std=(0.26862954, 0.26130258, 0.27577711))  # fmt: skip
    pixels = torch.cat([pre(object_crop(image, d)[None]) for d in dets])
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=pixels,
        )
    text = out.text_embeds.double().view(len(COLORS), 3, -1).mean(1)
    text = text / text.norm(dim=-1, keepdim=True)
    logits = out.image_embeds.double() @ text.T
    assert got == [COLORS[int(i)] for i in logits.argmax(1)]
    assert torch.allclose(clf.colour_embeddings("cat").double(), text, atol=1e-6)


def test_eval_cli_prints_the_task_table_of_a_geneval_folder(tmp_path, capsys):
    from unirl.reward.local.geneval.__main__ import main

    scenes = [
        ({"tag": "single_object", "include": [one("red blob")], "prompt": "a photo of a red blob"},
         [[("blob", "red", (4, 4, 40, 40))], [("blob", "blue", (4, 4, 40, 40))]]),
        ({"tag": "two_object", "include": [one("red blob"), one("blue blob")], "prompt": "p"},
         [[("blob", "red", (2, 2, 28, 60)), ("blob", "blue", (34, 2, 62, 60))]]),
    ]  # fmt: skip
    for index, (meta, images) in enumerate(scenes):
        folder = tmp_path / f"{index:05d}"
        (folder / "samples").mkdir(parents=True)
        (folder / "metadata.jsonl").write_text(json.dumps(meta) + "\n")
        for k, shapes in enumerate(images):
            pixels, _ = render(shapes)
            array = (pixels.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            Image.fromarray(array).save(folder / "samples" / f"{k:04d}.png")
    text = main(["--images", str(tmp_path), "--detector", "blob", "--blob-label", "{colour} blob"])
    assert text.splitlines()[2] == "| 0.75 | 0.50 | 1.00 | - | - | - | - |"
    assert text.splitlines()[3] == "| 3 | 2 | 1 | 0 | 0 | 0 | 0 |"
    assert text in capsys.readouterr().out
