"""MkDocs hook (``mkdocs.yml``: ``hooks:``): the site's generated parts, made at build time.

- ``on_config``: the nav's ``Packages`` entry becomes one page per package README, and the
  pages other work adds (``OPTIONAL_PAGES``) join the nav when their file exists.
- ``on_files``: the package pages (``unirl.tools.docs.package_pages``).
- ``on_page_markdown``: a marker line in a page is replaced by its generated Markdown
  (``<!-- unirl:recipes -->``, ``<!-- unirl:config-reference -->``); links to repository
  files outside ``docs/`` become paths (the site holds no source); the final Markdown of each
  page is kept for the agents' files.
- ``on_post_build``: ``<page>.md`` next to every page, ``llms.txt`` and ``llms-full.txt``.

The generators live in ``unirl/tools/docs.py``; nothing generated is committed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# the site describes the checkout it is built from, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from unirl.tools import docs as gen

MARKERS = {
    "<!-- unirl:recipes -->": gen.recipes_table,
    "<!-- unirl:config-reference -->": gen.config_reference,
}
# (nav title, file, the nav title it follows): pages written by other work, listed when present
OPTIONAL_PAGES = (
    ("CPU-only torch", "install-cpu-torch.md", "Installation"),
    ("Migrating from UniRL", "migration.md", "Configuration"),
    ("Report", "report.md", "Performance"),
)
SUMMARY = (
    "Distributed reinforcement learning for multimodal generative models: diffusion and "
    "flow-matching image and video models, autoregressive text and vision-language models, "
    "and prompt enhancers, each run from one self-contained Hydra recipe."
)

_generated: set[str] = set()
_markdown: dict[str, str] = {}
_order: list[tuple[str, str]] = []


def _insert_after(nav: list[Any], after: str, entry: dict[str, str]) -> bool:
    for i, item in enumerate(nav):
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if title == after:
                nav.insert(i + 1, entry)
                return True
            if isinstance(value, list) and _insert_after(value, after, entry):
                return True
    return False


def on_config(config: Any) -> Any:
    docs_dir = Path(config.docs_dir)
    nav = config.nav
    for i, item in enumerate(nav):
        if isinstance(item, dict) and "Packages" in item:
            nav[i] = {
                "Packages": [
                    {gen.package_title(r): gen.package_page(r)} for r in gen.package_readmes()
                ]
            }
    for title, name, after in OPTIONAL_PAGES:
        if (docs_dir / name).is_file() and not _insert_after(nav, after, {title: name}):
            nav.append({title: name})
    return config


def on_files(files: Files, config: Any) -> Files:
    _generated.clear()
    _markdown.clear()
    for path, text in gen.package_pages().items():
        files.append(File.generated(config, path, content=text))
        _generated.add(path)
    return files


def on_nav(nav: Any, config: Any, files: Files) -> Any:
    _order.clear()
    _order.extend((page.file.src_uri, page.title or "") for page in nav.pages)
    return nav


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    src = page.file.src_uri
    if src not in _generated:
        source = Path(config.docs_dir) / src
        markdown = gen.rewrite_links(markdown, source, src)
    _markdown[src] = markdown
    return markdown


def _title(src: str, nav_title: str) -> str:
    if nav_title:
        return nav_title
    heading = re.search(r"^# (.+)$", _markdown.get(src, ""), flags=re.M)
    return heading.group(1).strip() if heading else src


def on_post_build(config: Any) -> None:
    site = Path(config.site_dir)
    listed = [src for src, _ in _order]
    extra = sorted(src for src in _markdown if src not in listed)
    titles = dict(_order)
    pages = [
        gen.PageText(path=src, title=_title(src, titles.get(src, "")), markdown=_markdown[src])
        for src in (*listed, *extra)
        if src in _markdown
    ]
    for page in pages:
        out = site / page.path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page.markdown)
    (site / "llms.txt").write_text(gen.llms_txt(pages, summary=SUMMARY))
    (site / "llms-full.txt").write_text(gen.llms_full(pages))
