"""``report.html`` opened from disk in headless Chromium (Playwright): every image loads, the
page asks the network for nothing, the curve has its size, the config and the last reward
are on it. Skipped, with the install line, where playwright or Chromium is missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from run_folder import write_run

from unirl.logging import contact_sheet
from unirl.logging.report import REPORT, refresh_run_views

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'"
)
pytestmark = pytest.mark.skipif(
    not CHROMIUM.is_file(),
    reason=f"{CHROMIUM} missing: apt-get install -y chromium (playwright cannot download browsers here)",
)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_page(browser, url: str):
    """The page at ``url`` after it loaded, with every request it made and every console
    message (a blocked load shows up there)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests: list[str] = []
    console: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.goto(url, wait_until="load")
    return page, requests, console


def make_run(root: Path) -> None:
    write_run(root, rollouts=6)
    captions = ["-0.1 | a red cube", "-0.2 | a blue cube"]
    pixels = torch.linspace(0, 1, 2 * 3 * 8 * 8).reshape(2, 3, 8, 8)
    contact_sheet(pixels, captions, root / "samples" / "rollout_000005.png", tile=32)
    contact_sheet(pixels, captions, root / "eval" / "step_000006.png", tile=32)
    assert refresh_run_views(root)


def test_report_opens_from_disk_with_everything_inlined(tmp_path, browser):
    make_run(tmp_path)
    report = tmp_path / REPORT
    page, requests, console = open_page(browser, report.as_uri())

    images = page.eval_on_selector_all(
        "img",
        "els => els.map(e => ({id: e.id, src: e.src.slice(0, 22), complete: e.complete,"
        " natural: e.naturalWidth, w: e.clientWidth,"
        " h: e.clientHeight}))",
    )
    # three curves, the latest eval sheet, the latest train sheet: all decoded
    assert len(images) == 5
    assert all(i["complete"] and i["natural"] > 0 for i in images), images
    assert all(i["src"].startswith("data:image/") for i in images), images

    # nothing but the file itself and its data: URIs was asked for
    assert requests and all(u.startswith(("file:", "data:")) for u in requests), requests
    assert [u for u in requests if u.startswith("file:")] == [report.as_uri()]
    resources = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith("data:") for u in resources), resources
    assert not [m for m in console if "Refused" in m or "error" in m], console

    # the reward curve at its drawn size (900 x 420 fits a 1280 px window unscaled; the
    # client size leaves out the 1 px border)
    curve = next(i for i in images if i["id"] == "curve-reward")
    assert (curve["natural"], curve["w"], curve["h"]) == (900, 900, 420)

    config = page.inner_text("#config-text")
    assert "num_rollouts: 6" in config

    # the last rollout (5) rewards -0.4 + 0.03125 * 5 (-0.24375000000000002 in float), 4 decimals
    cells = page.eval_on_selector_all(
        "#summary tr[data-metric='reward/mean'] td", "tds => tds.map(td => td.innerText)"
    )
    assert cells[0] == "reward/mean"
    assert cells[2] == f"{-0.4 + 0.03125 * 5:.4f}" == "-0.2438"
    header = page.inner_text("#summary thead")
    assert "rollout 5" in header
    page.close()


def test_the_request_check_sees_an_external_load(tmp_path, browser):
    """Control: a page that points at a server is caught by the same checks."""
    page_path = tmp_path / "leaky.html"
    page_path.write_text('<html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    page, requests, _ = open_page(browser, page_path.as_uri())
    assert "http://127.0.0.1:9/x.png" in requests
    assert page.eval_on_selector("img", "e => e.naturalWidth") == 0
    page.close()


def test_a_moved_report_still_opens(tmp_path, browser):
    """Self-contained: the page copied away from its run folder shows the same images."""
    make_run(tmp_path / "run")
    moved = tmp_path / "elsewhere" / "copy.html"
    moved.parent.mkdir()
    shutil.copy(tmp_path / "run" / REPORT, moved)
    shutil.rmtree(tmp_path / "run")
    page, _, _ = open_page(browser, moved.as_uri())
    widths = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
    assert len(widths) == 5 and min(widths) > 0
    page.close()


def make_text_run(root: Path) -> None:
    """A text run as ``ARTrainer`` leaves it: completions as JSON lines (train every 10
    rollouts, eval at 0 and 20), no contact sheet, and ``run.json``."""
    write_run(root, rollouts=21)
    for folder, name, completion in [
        ("samples", "rollout_000000.jsonl", "\\boxed{{{"),
        ("samples", "rollout_000020.jsonl", "\\boxed{7}"),
        ("eval", "step_000000.jsonl", "\\boxed{<|"),
        ("eval", "step_000020.jsonl", "\\boxed{9}"),
    ]:
        (root / folder).mkdir(exist_ok=True)
        rows = [
            {"prompt": "What is 3 + 6?", "completion": completion, "reward": 0.625, "answer": "9"},
            {"prompt": "a <b>bold</b> prompt", "completion": "<script>x</script>", "reward": 0.0},
        ]
        (root / folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "run.json").write_text(
        json.dumps(
            {
                "status": "finished",
                "started": "2026-11-29T00:00:00+00:00",
                "wall_s": 83.4,
                "commit": "b94378a1c2d3",
                "resumed": False,
                "ended": None,
            }
        )
    )
    assert refresh_run_views(root)


def _completions(page, section: str) -> dict[str, list[list[str]]]:
    """``{step: rows}`` of the completion tables in a samples section."""
    sides = page.query_selector_all(f"#{section} ~ div.pair")[0].query_selector_all("div.side")
    out = {}
    for side in sides:
        rows = side.eval_on_selector_all(
            "table.completions tr", "trs => trs.map(tr => [...tr.cells].map(c => c.innerText))"
        )
        out[side.get_attribute("data-step")] = rows
    return out


def test_a_text_run_report_shows_completions_step_zero_beside_the_latest(tmp_path, browser):
    make_text_run(tmp_path)
    page, requests, _ = open_page(browser, (tmp_path / REPORT).as_uri())
    assert [u for u in requests if u.startswith("file:")] == [(tmp_path / REPORT).as_uri()]
    evals = _completions(page, "eval-samples")
    assert list(evals) == ["0", "20"]
    assert evals["0"][0] == ["prompt", "completion", "answer", "reward"]
    assert evals["0"][1] == ["What is 3 + 6?", "\\boxed{<|", "9", "0.6250"]
    assert evals["20"][1] == ["What is 3 + 6?", "\\boxed{9}", "9", "0.6250"]
    # text is text: the model's markup is escaped, never run or rendered
    assert evals["20"][2] == ["a <b>bold</b> prompt", "<script>x</script>", "–", "0.0000"]
    train = _completions(page, "train-samples")
    assert list(train) == ["0", "20"] and train["20"][1][1] == "\\boxed{7}"
    info = page.eval_on_selector_all(
        "#run-info tr", "trs => trs.map(tr => [...tr.cells].map(c => c.innerText))"
    )
    assert info == [
        ["status", "finished"],
        ["wall time", "0:01:23"],
        ["started", "2026-11-29T00:00:00+00:00"],
        ["code", "b94378a1c2d3"],
    ]
    assert page.query_selector_all("img[alt$='.png'][src^='data:image/png']")  # the curves
    page.close()


def test_an_image_run_report_shows_step_zero_beside_the_latest_sheet(tmp_path, browser):
    write_run(tmp_path, rollouts=6)
    pixels = torch.linspace(0, 1, 2 * 3 * 8 * 8).reshape(2, 3, 8, 8)
    for name in ("step_000000.png", "step_000003.png", "step_000006.png"):
        contact_sheet(pixels, ["-0.1 | a", "-0.2 | b"], tmp_path / "eval" / name, tile=32)
    assert refresh_run_views(tmp_path)
    page, _, _ = open_page(browser, (tmp_path / REPORT).as_uri())
    sides = page.eval_on_selector_all(
        "#eval-samples ~ div.pair div.side",
        "ds => ds.map(d => [d.dataset.step, d.querySelector('img').naturalWidth > 0,"
        " d.querySelector('figcaption').innerText])",
    )
    assert sides == [["0", True, "eval/step_000000.png"], ["6", True, "eval/step_000006.png"]]
    assert page.inner_text("#run-info tr[data-key='status']") == "status\t–"
    page.close()
