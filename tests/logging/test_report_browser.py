"""``report.html`` opened from disk in headless Chromium (Playwright): every image loads, the
page asks the network for nothing, the curve has its size, the config and the last reward
are on it. Skipped, with the install line, where playwright or Chromium is missing."""

from __future__ import annotations

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
