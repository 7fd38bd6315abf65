"""The generated pages of the documentation site, built from the repository at build time.

``docs/hooks/unirl_docs.py`` (the MkDocs hook named in ``mkdocs.yml``) calls these, so no
generated page is committed and none can fall behind the code:

- :func:`recipes_table`: one row per ``examples/**/*.yaml`` (entrypoint from its folder,
  family from ``bundle._target_``, algorithm, rollout engine, devices, the header's first line);
- :func:`config_reference`: every key of ``RunConfig`` and of every ``_target_`` the recipes
  use, with type, default and the line ``--help`` prints (:mod:`unirl.config.help`);
- :func:`package_pages`: one page per package README (``unirl/**/README.md``), links to other
  READMEs pointed at their pages and links to source files turned into paths;
- :func:`llms_txt` / :func:`llms_full`: the index and the whole text for coding agents.

Check it without MkDocs: ``python -m unirl.tools.docs recipes`` prints the recipe table.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from unirl.config.help import KeyDoc

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PACKAGE_PAGES = "packages"  # generated package pages live under docs/<this>/ in the site

# folders whose recipes another entrypoint than ``train_<folder>`` runs
ENTRYPOINT_OF_FOLDER = {"llm": "train_vlm", "vlm": "train_vlm"}


class DocsError(ValueError):
    """A page cannot be generated: the message names the file and the fix."""


# ----------------------------------------------------------------------------- recipes


@dataclasses.dataclass(frozen=True)
class RecipeRow:
    """One recipe as the recipes table shows it."""

    name: str  # ``diffusion/sd3_tiny_trainside``
    entrypoint: str  # ``unirl.train_diffusion``
    family: str
    algorithm: str
    engine: str
    hardware: str
    summary: str


def entrypoint_of(folder: str, repo: Path = REPO) -> str:
    """The module that runs the recipes of ``examples/<folder>/``: ``train_vlm`` for ``llm`` and
    ``vlm``, else ``train_<folder>`` when ``unirl/train_<folder>.py`` exists."""
    module = ENTRYPOINT_OF_FOLDER.get(folder, f"train_{folder}")
    if not (repo / "unirl" / f"{module}.py").is_file():
        raise DocsError(
            f"examples/{folder}/: no entrypoint unirl/{module}.py runs these recipes; add it, or "
            "name the entrypoint of this folder in ENTRYPOINT_OF_FOLDER (unirl/tools/docs.py)"
        )
    return f"unirl.{module}"


def _target(block: object) -> str | None:
    return str(block["_target_"]) if isinstance(block, Mapping) and "_target_" in block else None


def _family(target: str | None) -> str:
    """``unirl.models.sd3.SD3Bundle`` -> ``sd3``; a bundle outside ``unirl.models`` keeps its
    class name."""
    if target is None:
        return "—"
    parts = target.split(".")
    if parts[:2] == ["unirl", "models"] and len(parts) > 3:
        return parts[2]
    return parts[-1]


def _short(target: str | None) -> str:
    return "—" if target is None else target.rsplit(".", 1)[-1]


def _hardware(recipe: Mapping[str, object]) -> str:
    from unirl.config.run import RunConfig

    defaults = RunConfig()
    count = recipe.get("num_devices", defaults.num_devices)
    device = recipe.get("device", defaults.device)
    per_node = recipe.get("devices_per_node")
    kind = "GPU" if device == "cuda" else "CPU worker"
    text = f"{count} {kind}{'' if count == 1 else 's'}"
    if isinstance(count, int) and isinstance(per_node, int) and count > per_node:
        text += f" ({count // per_node} nodes × {per_node})"
    return text


def _summary(text: str) -> str:
    """The first sentence of a recipe's header comment (the lines before ``defaults:``)."""
    lines: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            if lines:
                break
            continue
        body = line.lstrip("#").strip()
        if body.startswith("@package") or body.startswith("python -m"):
            continue
        if not body:
            if lines:
                break
            continue
        lines.append(body)
    sentence = " ".join(lines)
    match = re.search(r"(?<=\.)\s", sentence)
    return sentence[: match.start()] if match else sentence


def recipe_files(examples: Path = EXAMPLES) -> list[Path]:
    """Every recipe: ``examples/<folder>/**/*.yaml``, sorted."""
    return sorted(p for p in examples.glob("*/**/*.yaml") if p.is_file())


def recipe_row(path: Path, examples: Path = EXAMPLES, repo: Path = REPO) -> RecipeRow:
    relative = path.relative_to(examples)
    text = path.read_text()
    try:
        recipe = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise DocsError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(recipe, dict):
        raise DocsError(f"{path}: a recipe is a mapping of keys, got {type(recipe).__name__}")
    family = _family(_target(recipe.get("bundle")))
    pe = recipe.get("pe")
    drawer = _target(pe.get("diffusion", {}).get("bundle")) if isinstance(pe, Mapping) else None
    if drawer is not None:
        family = f"{family} → {_family(drawer)}"
    return RecipeRow(
        name=str(relative.with_suffix("")),
        entrypoint=entrypoint_of(relative.parts[0], repo),
        family=family,
        algorithm=_short(_target(recipe.get("algorithm"))),
        engine=_short(_target(recipe.get("rollout"))),
        hardware=_hardware(recipe),
        summary=_summary(text),
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def recipes_table(examples: Path = EXAMPLES, repo: Path = REPO) -> str:
    """The Markdown table of every recipe, one section per entrypoint."""
    rows = [recipe_row(p, examples, repo) for p in recipe_files(examples)]
    out: list[str] = []
    for entrypoint in sorted({r.entrypoint for r in rows}):
        mine = [r for r in rows if r.entrypoint == entrypoint]
        out += [
            f"### `python -m {entrypoint}`",
            "",
            f"{len(mine)} recipes.",
            "",
            "| recipe | family | algorithm | engine | hardware | what |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| `{r.name}` | {r.family} | {r.algorithm} | {r.engine} | {r.hardware} | "
            f"{_cell(r.summary)} |"
            for r in mine
        ]
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- configuration


def recipe_targets(examples: Path = EXAMPLES) -> dict[str, set[str]]:
    """``{_target_: {where it is used (``pipeline.strategy``)}}`` over every recipe."""
    found: dict[str, set[str]] = {}

    def walk(node: object, where: str) -> None:
        if isinstance(node, Mapping):
            target = _target(node)
            if target is not None:
                found.setdefault(target, set()).add(where)
            for key, value in node.items():
                if key != "_target_":
                    walk(value, f"{where}.{key}" if where else str(key))
        elif isinstance(node, list):
            for value in node:
                walk(value, f"{where}[]")

    for path in recipe_files(examples):
        walk(yaml.safe_load(path.read_text()) or {}, "")
    return found


def _md_value(value: object) -> str:
    from unirl.config.help import _show

    return f"`{_cell(_show(value, width=60))}`"


def _key_table(keys: Iterable[KeyDoc]) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for k in keys:
        if k.key.endswith("._target_"):
            continue
        rows.append(f"| `{k.key}` | {_cell(k.kind)} | {_md_value(k.value)} | {_cell(k.doc)} |")
    return rows


def config_reference(examples: Path = EXAMPLES) -> str:
    """Every top-level key, then one section per ``_target_`` the recipes use (grouped by the
    block it fills), each key with its type, default and description."""
    from unirl.config.help import component_keys, summary, top_level_blocks
    from unirl.config.run import RunConfig
    from unirl.config.validate import locate

    blocks = top_level_blocks()
    out = [
        "## Top level (`RunConfig`)",
        "",
        summary(RunConfig),
        "",
        *_key_table(k for k in component_keys("", RunConfig, None) if k.key not in blocks),
        "",
    ]
    by_block: dict[str, list[tuple[str, set[str]]]] = {}
    for target, used in recipe_targets(examples).items():
        block = min(used, key=len).split(".")[0].split("[")[0]
        by_block.setdefault(block, []).append((target, used))
    for block in sorted(
        by_block, key=lambda b: (b not in blocks, blocks.index(b) if b in blocks else 0, b)
    ):
        out += [f"## `{block}`", ""]
        for target, used in sorted(by_block[block]):
            cls = locate(target, target)
            out += [
                f"### `{target}`",
                "",
                summary(cls) or "(no docstring)",
                "",
                "Used as " + ", ".join(f"`{u}`" for u in sorted(used)) + ".",
                "",
                *_key_table(component_keys("", cls, None)),
                "",
            ]
    return "\n".join(out)


# ----------------------------------------------------------------------------- packages


REWARD_SERVICE_README = "unirl-reward-service/README.md"


def package_readmes(repo: Path = REPO) -> list[Path]:
    """Every ``unirl/**/README.md``, then the reward service's."""
    found = sorted((repo / "unirl").rglob("README.md"))
    service = repo / REWARD_SERVICE_README
    return [*found, service] if service.is_file() else found


def package_page(readme: Path, repo: Path = REPO) -> str:
    """Site path of a README's page: ``unirl/README.md`` -> ``packages/index.md``,
    ``unirl/models/sd3/README.md`` -> ``packages/models/sd3.md``, the reward service's ->
    ``packages/reward-service.md``."""
    if readme == repo / REWARD_SERVICE_README:
        return f"{PACKAGE_PAGES}/reward-service.md"
    parts = readme.parent.relative_to(repo / "unirl").parts
    if not parts:
        return f"{PACKAGE_PAGES}/index.md"
    return posixpath.join(PACKAGE_PAGES, *parts[:-1], f"{parts[-1]}.md")


def package_title(readme: Path, repo: Path = REPO) -> str:
    return ".".join(readme.parent.relative_to(repo).parts)


_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def rewrite_links(markdown: str, source: Path, page: str, repo: Path = REPO) -> str:
    """Links of a file at ``source`` (in the repository) shown as the site page ``page``:
    a link to a package README goes to its page, a link to a page of ``docs/`` goes to that
    page, a link to any other file of the repository becomes its path in code (the site
    holds no source files); web links, anchors and links that resolve to nothing are kept
    (the strict build reports the last)."""
    docs = repo / "docs"

    def replace(match: re.Match[str]) -> str:
        text, href = match.group(1), match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith("#"):
            return match.group(0)
        path_part, _, anchor = href.partition("#")
        target = (source.parent / path_part).resolve()
        if not str(target).startswith(str(repo)) or not target.exists():
            return match.group(0)
        suffix = f"#{anchor}" if anchor else ""
        if target.name == "README.md" and target in package_readmes(repo):
            goal = package_page(target, repo)
        elif target.is_relative_to(docs) and target.suffix == ".md":
            goal = target.relative_to(docs).as_posix()
        else:
            where = target.relative_to(repo).as_posix() + ("/" if target.is_dir() else "")
            return f"{text} (`{where}`)" if text.strip("`") != where else f"`{where}`"
        relative = posixpath.relpath(goal, posixpath.dirname(page) or ".")
        return f"[{text}]({relative}{suffix})"

    return _outside_code(markdown, lambda chunk: _LINK.sub(replace, chunk))


def _outside_code(markdown: str, change: Callable[[str], str]) -> str:
    """Apply ``change`` to the text outside fenced code blocks."""
    parts = re.split(r"(^```.*?^```[^\n]*$)", markdown, flags=re.M | re.S)
    return "".join(p if i % 2 else change(p) for i, p in enumerate(parts))


def package_pages(repo: Path = REPO) -> dict[str, str]:
    """``{site path: Markdown}`` of every package README."""
    pages: dict[str, str] = {}
    for readme in package_readmes(repo):
        page = package_page(readme, repo)
        text = readme.read_text()
        rel = readme.relative_to(repo).as_posix()
        body = rewrite_links(text, readme, page, repo)
        pages[page] = f"<!-- generated from {rel} at build time -->\n{body}"
    return pages


# ----------------------------------------------------------------------------- agents


@dataclasses.dataclass(frozen=True)
class PageText:
    """A built page: its site path (``first-run.md``), title and final Markdown."""

    path: str
    title: str
    markdown: str


def _first_paragraph(markdown: str) -> str:
    """The first paragraph of prose (headings, comments, code, tables and lists skipped)."""
    body = re.sub(r"^```.*?^```[^\n]*$", "", markdown, flags=re.M | re.S)
    body = re.sub(r"^(#.*|<!--.*-->)$", "", body, flags=re.M)
    for block in re.split(r"\n\s*\n", body):
        text = block.strip()
        if text and not text.startswith(("#", "<!--", "```", "|", "-", "*", ">")):
            return " ".join(text.split())[:200]
    return ""


def llms_txt(pages: list[PageText], *, summary: str) -> str:
    """The ``llms.txt`` index: the project in one line, then each page's Markdown with its
    first paragraph."""
    lines = ["# UniRL", "", f"> {summary}", ""]
    sections: dict[str, list[PageText]] = {}
    for page in pages:
        section = "Packages" if page.path.startswith(f"{PACKAGE_PAGES}/") else "Docs"
        sections.setdefault(section, []).append(page)
    for section in ("Docs", "Packages"):
        if section not in sections:
            continue
        lines += [f"## {section}", ""]
        for page in sections[section]:
            blurb = _first_paragraph(page.markdown)
            lines.append(f"- [{page.title}]({page.path})" + (f": {blurb}" if blurb else ""))
        lines.append("")
    return "\n".join(lines)


def llms_full(pages: list[PageText]) -> str:
    """Every page's Markdown in nav order, each under a line naming its path."""
    return (
        "\n\n".join(f"<!-- page: {page.path} -->\n{page.markdown.strip()}" for page in pages) + "\n"
    )


def main(argv: list[str]) -> int:
    commands = {"recipes": recipes_table, "config": config_reference}
    if len(argv) != 1 or argv[0] not in commands:
        print(f"usage: python -m unirl.tools.docs {{{','.join(commands)}}}", file=sys.stderr)
        return 2
    print(commands[argv[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
