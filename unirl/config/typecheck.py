"""Check recipe values against the annotations of the config they feed, before any Ray work.

Hydra hands over whatever the YAML or the command line spelt: ``shuffle=no`` arrives as the
string ``"no"`` (truthy), ``lr: 1e-4`` as the string ``"1e-4"`` (PyYAML reads no float
without a dot), ``batch_size=8.5`` as a float. ``check_value`` compares one value with one
annotation (``bool``, ``int``, ``float``, ``str``, ``Literal[...]``, ``X | None``,
``list[T]``, ``dict[K, V]``, ``tuple``) and raises ``ConfigError`` naming the key, the
expected type and the fix. A mapping given for a config dataclass (``kl: {beta: 0.04}`` where
the annotation is ``KLConfig | Mapping[str, Any] | None``) is checked key by key against the
dataclass. Annotations it does not understand (``Any``, other classes, protocols) are not
checked; nothing is coerced except an ``int`` where a ``float`` is expected.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, cast

from unirl.config.component import config_class_of
from unirl.config.require import ConfigError

_NOT_CHECKED = object()


@dataclass(frozen=True)
class Bound:
    """A numeric range carried by ``Annotated[...]``: ``PositiveInt`` is
    ``Annotated[int, Bound(ge=1)]``. NaN and infinities never pass."""

    gt: float | None = None
    ge: float | None = None

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.gt is not None and not value > self.gt:
            return False
        return self.ge is None or value >= self.ge

    def __str__(self) -> str:
        parts = [
            f"> {self.gt:g}" if self.gt is not None else "",
            f">= {self.ge:g}" if self.ge is not None else "",
        ]
        return " and ".join(p for p in parts if p)


PositiveInt = Annotated[int, Bound(ge=1)]
"""A size or count: an integer >= 1."""
NonNegativeInt = Annotated[int, Bound(ge=0)]
"""An interval or count where 0 means off."""
PositiveFloat = Annotated[float, Bound(gt=0)]
"""A finite number > 0 (a clip range, a learning rate, a timeout)."""
NonNegativeFloat = Annotated[float, Bound(ge=0)]
"""A finite number >= 0 (a KL coefficient, a noise level)."""


def _describe(annotation: object) -> str:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *extras = typing.get_args(annotation)
        bounds = [e for e in extras if isinstance(e, Bound)]
        return f"{_describe(base)} {bounds[0]}" if bounds else _describe(base)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if annotation is bool:
        return "true or false"
    if annotation is float:
        return "a finite number"
    if annotation is int:
        return "an integer"
    if annotation is str:
        return "a string"
    if origin is not None:
        return f"a {getattr(origin, '__name__', str(origin))}"
    return getattr(annotation, "__name__", str(annotation))


def _matches(value: object, annotation: object) -> bool | object:
    """True / False, or ``_NOT_CHECKED`` for annotations this module does not judge."""
    if annotation is Any or annotation is object:
        return _NOT_CHECKED
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *extras = typing.get_args(annotation)
        verdict = _matches(value, base)
        if verdict is not True:
            return verdict
        # the base matched, so a bounded value is a number
        return all(b.holds(float(cast("float", value))) for b in extras if isinstance(b, Bound))
    if origin is Literal:
        return any(value == c and type(value) is type(c) for c in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        results = [_matches(value, a) for a in typing.get_args(annotation)]
        if any(r is True for r in results):
            return True
        return _NOT_CHECKED if any(r is _NOT_CHECKED for r in results) else False
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, typing.Sequence) or annotation in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(args) == 1:
            inner = [_matches(v, args[0]) for v in value]
            return not any(r is False for r in inner)
        return True
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            return False
        pair = typing.get_args(annotation)
        if len(pair) == 2:
            inner = [_matches(v, pair[1]) for v in value.values()]
            return not any(r is False for r in inner)
        return True
    return _NOT_CHECKED


def _hint(value: object, annotation: object) -> str:
    if isinstance(value, str):
        if _matches(True, annotation) is True and value.lower() in {
            "yes",
            "no",
            "on",
            "off",
            "y",
            "n",
        }:
            return f" (write true or false, not {value!r})"
        try:
            float(value)
        except ValueError:
            return ""
        return f" (the string {value!r} is not a number: write it with a dot, e.g. 1.0e-4)"
    if isinstance(value, float) and _matches(1, annotation) is True and value.is_integer():
        return f" (write {int(value)}, without a decimal point)"
    return ""


def config_class(annotation: object) -> type | None:
    """The config dataclass an annotation names, if any: ``KLConfig | Mapping[str, Any] |
    None`` -> ``KLConfig`` (the first one of a union)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return config_class(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = config_class(arg)
            if found is not None:
                return found
        return None
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    return None


def check_config_mapping(value: dict[str, Any], cls: type, where: str) -> dict[str, Any]:
    """A mapping written for the config dataclass ``cls``: no unknown key, every value checked."""
    accepted = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in value if not str(k).startswith("_") and k not in accepted)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown} for {cls.__name__}; accepted keys are {sorted(accepted)}"
        )
    return check_fields(value, cls, where)


def check_value(value: object, annotation: object, where: str) -> object:
    """``value`` if it fits ``annotation`` (an ``int`` for a ``float`` comes back as float)."""
    if isinstance(value, dict) and "_target_" in value:
        return value  # a nested component: checked as a block of its own
    if isinstance(value, dict):
        cls = config_class(annotation)
        if cls is not None:
            return check_config_mapping(value, cls, where)
    verdict = _matches(value, annotation)
    if verdict is False:
        raise ConfigError(
            f"{where} must be {_describe(annotation)}, got {value!r}{_hint(value, annotation)}"
        )
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def annotations_of(target: object) -> dict[str, object]:
    """Resolved parameter annotations of a dataclass, class (its ``__init__``) or function;
    names whose annotation cannot be resolved are left out (not checked). A class that
    declares a ``config_class`` (``unirl.config.component``) takes its knobs through
    ``**knobs``: their annotations are the config's fields."""
    if dataclasses.is_dataclass(target) and isinstance(target, type):
        func: object = target
        names = {f.name for f in dataclasses.fields(target) if f.init}
    else:
        func = target.__init__ if inspect.isclass(target) else target
        if not callable(func):  # inspect.signature refuses it too
            return {}
        try:
            params = inspect.signature(func).parameters
        except (TypeError, ValueError):
            return {}
        names = {n for n, p in params.items() if p.kind is not p.VAR_KEYWORD}
        knobs = config_class_of(target)
        if knobs is not None:
            return {**annotations_of(knobs), **_resolved(func, names)}
    return _resolved(func, names)


def _resolved(func: object, names: set[str]) -> dict[str, object]:
    """The annotations of ``func``'s parameters ``names``, resolved where they can be."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:  # an unresolvable forward reference: resolve one name at a time
        hints = {}
        raw = getattr(func, "__annotations__", {})
        module = inspect.getmodule(func)
        namespace = vars(module) if module is not None else {}
        for name, text in raw.items():
            try:
                hints[name] = eval(text, namespace) if isinstance(text, str) else text
            except Exception:
                continue
    return {k: v for k, v in hints.items() if k in names and k != "return"}


_Config = TypeVar("_Config")


def build_config(cls: type[_Config], values: Mapping[str, object]) -> _Config:
    """``cls(**values)``: a config dataclass built from recipe values that ``check_fields``
    has checked against its annotations (the check, not this signature, vouches for them)."""
    build: Callable[..., _Config] = cls
    return build(**values)


def check_fields(data: Mapping[str, object], target: object, where: str) -> dict[str, object]:
    """Every key of ``data`` that ``target`` annotates, checked (see ``check_value``)."""
    hints = annotations_of(target)
    out = dict(data)
    for key, value in data.items():
        if key in hints:
            out[key] = check_value(value, hints[key], f"{where}.{key}" if where else key)
    return out
