"""What ``--help`` adds to Hydra's usage: every key a recipe can set, with a one-line
description read from the typed configs' docstrings.

A key's description comes from the first of these that says something about it:

1. the field's own docstring (a string right below ``name: type = default``),
2. a comment on the field's line, or the comment lines right above it,
3. the clause of the config class's docstring (or of a base class's) that names it in
   double backquotes (``micro_batch_size`` samples per forward + backward; ...),
4. the same in the component class's docstring or its ``__init__``'s (components that take
   their knobs as keyword arguments, such as the algorithms).

The same walk feeds the configuration reference page of the documentation site
(``docs/hooks/unirl_docs.py``), so ``--help`` and the page cannot disagree.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Iterator, Mapping
from typing import Any

from unirl.config.component import config_class_of
from unirl.config.run import COMPONENT_BLOCKS, RunConfig
from unirl.config.typecheck import _describe, annotations_of, config_class

_ROLE = object()  # a parameter with no default that the recipe does not set: a sibling role
_REQUIRED = object()  # a config field with no default


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One settable key: ``key`` dotted from the top (``stack.micro_batch_size``), the recipe's
    ``value`` (or the default when ``in_recipe`` is false), its type in words and its line."""

    key: str
    value: object
    in_recipe: bool
    kind: str
    doc: str


# ----------------------------------------------------------------------------- descriptions


def _plain(text: str) -> str:
    """Docstring markup to plain words: ``x`` -> x, :class:`~a.b.C` -> C, one line."""
    text = re.sub(r":\w+:`~?([\w.]*?)([\w]+)`", r"\2", text)
    text = text.replace("``", "")
    return " ".join(text.split())


def _clauses(doc: str) -> Iterator[str]:
    """A docstring cut into clauses: sentences, then the parts between ``;`` outside
    parentheses (``a``: x; ``b``: y (1; 2)) -> ``a``: x | ``b``: y (1; 2))."""
    text = " ".join(doc.split())
    text = text.replace("e.g. ", "e.g.\0").replace("i.e. ", "i.e.\0")
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif depth == 0 and (ch == ";" or (ch == "." and text[i + 1 : i + 2] == " ")):
            yield text[start : i + 1].replace("\0", " ").strip()
            start = i + 1
    if text[start:].strip():
        yield text[start:].replace("\0", " ").strip()


def _mentions(doc: str | None) -> dict[str, str]:
    """``{name: clause}`` for every ``name`` (or ``name=...``) a docstring mentions, the first
    clause that names it; later mentions do not replace it."""
    out: dict[str, str] = {}
    for clause in _clauses(inspect.cleandoc(doc or "")):
        for match in re.finditer(r"``(\w+)(?:=[^`]*)?``", clause):
            out.setdefault(match.group(1), clause)
    return out


def _field_comments(cls: type) -> dict[str, str]:
    """Field docstrings and comments of ``cls``'s own body: ``{name: text}``."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    comments: dict[int, str] = {}
    trailing: dict[int, str] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError):
        tokens = []
    code_lines = {t.start[0] for t in tokens if t.type not in _NON_CODE}
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            line = tok.start[0]
            text = tok.string.lstrip("#").strip()
            (trailing if line in code_lines else comments)[line] = text
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        after = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[name] = after.value.value
        elif node.lineno in trailing:
            out[name] = trailing[node.lineno]
        else:
            above: list[str] = []
            line = node.lineno - 1
            while line in comments:
                above.insert(0, comments[line])
                line -= 1
            if above:
                out[name] = " ".join(above)
    return out


_NON_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


@functools.cache
def field_docs(target: object) -> dict[str, str]:
    """``{key: one-line description}`` for every key ``target`` (a component class, a config
    dataclass or a function) documents, in the order of precedence of the module docstring."""
    classes: list[type] = []
    knobs = config_class_of(target)
    if knobs is not None:
        classes += [c for c in knobs.__mro__ if c is not object]
    if inspect.isclass(target):
        classes += [c for c in target.__mro__ if c is not object and c not in classes]
    found: dict[str, str] = {}
    for cls in classes:  # own docstrings and comments first, nearest class first
        if inspect.isclass(cls):
            for name, text in _field_comments(cls).items():
                found.setdefault(name, text)
    for cls in classes:
        docs = [cls.__doc__] if inspect.isclass(cls) else []
        if inspect.isclass(cls) and "__init__" in vars(cls):
            docs.append(vars(cls)["__init__"].__doc__)
        for doc in docs:
            for name, clause in _mentions(doc).items():
                found.setdefault(name, clause)
    if not inspect.isclass(target):
        for name, clause in _mentions(getattr(target, "__doc__", None)).items():
            found.setdefault(name, clause)
    return {name: _plain(text) for name, text in found.items()}


def summary(target: object) -> str:
    """The first sentence of a class's (or its config class's) docstring, one line."""
    for obj in (target, config_class_of(target)):
        doc = inspect.getdoc(obj) if obj is not None else None
        if doc and obj is not None and (obj is not target or doc != inspect.getdoc(type)):
            first = next(_clauses(doc.split("\n\n")[0]), "")
            return _plain(first)
    return ""


# ----------------------------------------------------------------------------- keys


def _defaults(target: object) -> dict[str, object]:
    """``{key: default}`` of what ``target`` takes from a block, in declaration order; sibling
    roles (no default) map to ``_ROLE``, required config fields to ``_REQUIRED``."""
    out: dict[str, object] = {}
    if not (dataclasses.is_dataclass(target) and isinstance(target, type)):
        func = target.__init__ if inspect.isclass(target) else target
        try:  # a non-callable has no signature either
            params = list(inspect.signature(func).parameters.values()) if callable(func) else []
        except (TypeError, ValueError):
            params = []
        for p in params:
            if p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            out[p.name] = _ROLE if p.default is p.empty else p.default
        target = config_class_of(target)
        if target is None:
            return out
    for f in dataclasses.fields(target):
        if not f.init or f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = _REQUIRED
    return out


def _locate(path: str) -> Any:
    from unirl.config.validate import locate

    return locate(path, path)


def component_keys(
    prefix: str, target: object, block: Mapping[str, object] | None
) -> Iterator[KeyDoc]:
    """The keys of one block: ``target``'s knobs (with the block's values where it sets them),
    then the keys of its nested config dataclasses and ``_target_`` sub-blocks."""
    block = dict(block or {})
    hints = annotations_of(target)
    docs = field_docs(target)
    for name, default in _defaults(target).items():
        in_recipe = name in block
        value = block.get(name, default)
        if value is _ROLE:
            continue
        key = f"{prefix}.{name}" if prefix else name
        annotation = hints.get(name)
        nested = config_class(annotation) if annotation is not None else None
        if nested is not None and dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        if isinstance(value, Mapping) and "_target_" in value:
            yield from _target_keys(key, value)
            continue
        if nested is not None and (value is None or isinstance(value, Mapping)):
            given = value if isinstance(value, Mapping) else None
            if given is None:  # the block leaves it out: its keys are added with ``+``
                yield KeyDoc(key, value, in_recipe, _kind(annotation), docs.get(name, ""))
            yield from (
                dataclasses.replace(k, in_recipe=k.in_recipe and given is not None)
                for k in component_keys(key, nested, given)
            )
            continue
        if (
            isinstance(value, Mapping)
            and value
            and all(isinstance(v, Mapping) and "_target_" in v for v in value.values())
        ):  # a named set of components (a reward backend's ``components``)
            for child, sub in value.items():
                yield from _target_keys(f"{key}.{child}", sub)
            continue
        yield KeyDoc(key, value, in_recipe, _kind(annotation), docs.get(name, ""))
    for name in block:  # keys of a **kwargs target the signature does not name
        if name.startswith("_") or name in _defaults(target):
            continue
        yield KeyDoc(f"{prefix}.{name}", block[name], True, "", docs.get(name, ""))


def _target_keys(key: str, block: Mapping[str, object]) -> Iterator[KeyDoc]:
    target_path = str(block["_target_"])
    try:
        target = _locate(target_path)
    except Exception:  # the validators name an unimportable target; help shows the block
        yield KeyDoc(f"{key}._target_", target_path, True, "", "(cannot be imported here)")
        return
    yield KeyDoc(f"{key}._target_", target_path, True, "", summary(target))
    yield from component_keys(key, target, {k: v for k, v in block.items() if k != "_target_"})


def _kind(annotation: object) -> str:
    return "" if annotation is None else _describe(annotation)


def top_level_blocks() -> tuple[str, ...]:
    """The ``RunConfig`` keys that hold a block rather than a value: the component blocks and
    every other field typed ``Any`` (``pe``, a new domain's block)."""
    hints = annotations_of(RunConfig)
    extra = [name for name, hint in hints.items() if hint is Any and name not in COMPONENT_BLOCKS]
    return (*COMPONENT_BLOCKS, *extra)


def _mapping_keys(prefix: str, block: Mapping[str, object]) -> Iterator[KeyDoc]:
    """A block without ``_target_`` (``pe``): its ``_target_`` sub-blocks by their classes,
    its other keys as written."""
    for name, value in block.items():
        key = f"{prefix}.{name}"
        if isinstance(value, Mapping) and "_target_" in value:
            yield from _target_keys(key, value)
        elif isinstance(value, Mapping) and value:
            yield from _mapping_keys(key, value)
        else:
            yield KeyDoc(key, value, True, "", "")


def recipe_keys(data: Mapping[str, object]) -> Iterator[KeyDoc]:
    """Every key of a composed recipe: the top-level ``RunConfig`` keys (and its nested
    configs), then each block's, from its ``_target_``."""
    blocks = top_level_blocks()
    top = {k: v for k, v in data.items() if k not in blocks}
    yield from (k for k in component_keys("", RunConfig, top) if k.key not in blocks)
    for name in blocks:
        block = data.get(name)
        if isinstance(block, Mapping) and "_target_" in block:
            yield from _target_keys(name, block)
        elif isinstance(block, Mapping) and block:
            yield from _mapping_keys(name, block)
        elif block is not None:
            yield KeyDoc(name, block, True, "", "")


def _show(value: object, width: int = 48) -> str:
    if value is _REQUIRED:
        return "(required)"
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, Mapping):
        text = "{" + ", ".join(f"{k}: {_show(v, width)}" for k, v in value.items()) + "}"
    elif isinstance(value, list | tuple):
        text = "[" + ", ".join(_show(v, width) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def format_keys(keys: list[KeyDoc], *, doc_width: int = 110) -> str:
    """The listing ``--help`` prints: one line per key, ``key = value  type: description``;
    a key the recipe does not set is shown with its default and a leading ``+``."""
    rows = []
    for k in keys:
        mark = " " if k.in_recipe else "+"
        left = f"{mark}{k.key} = {_show(k.value)}"
        doc = "  ".join(p for p in (f"[{k.kind}]" if k.kind else "", k.doc) if p)
        if len(doc) > doc_width:
            doc = doc[: doc_width - 1] + "…"
        rows.append((left, doc))
    pad = min(44, max((len(left) for left, _ in rows), default=0))
    return "\n".join(f"  {left.ljust(pad)}  {doc}".rstrip() for left, doc in rows)


HEADER = """== Keys ==
Every key this recipe can set, as key = value (the recipe's value, or the default), its type
and a line from the typed config that owns it. Override one with key=value; a key marked +
is not in the recipe: add it with +key=value. Swap a whole block with
'~reward.backend' '+reward.backend={_target_: ...}' (docs: configuration.md)."""


def recipe_help(data: Mapping[str, object]) -> str:
    """The ``== Keys ==`` section ``--help`` prints after Hydra's usage."""
    return f"{HEADER}\n{format_keys(list(recipe_keys(data)))}\n"
