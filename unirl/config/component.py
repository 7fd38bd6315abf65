"""Typed component configs: how a component built from a recipe block owns its knobs.

The pattern (``README.md`` next to this file, "Extending it"):

- A component's knobs are one ``@dataclass(kw_only=True)`` next to it (``TrainStackConfig``
  next to ``TrainStack``), typed with the bounds of :mod:`unirl.config.typecheck`
  (``PositiveInt``, ``PositiveFloat``, ...) and validated in ``__post_init__`` with
  ``require``. The field list and the defaults exist there and nowhere else.
- The component names it in the class attribute ``config_class`` and takes it whole: its
  constructor receives the sibling roles it is handed (``backend``, ``algorithm``, ...) by
  name and every knob through ``**knobs``, builds ``self.config = self.config_class(**knobs)``
  once and reads ``self.config.<knob>`` from then on.
- The recipe block stays flat (``stack: {_target_: unirl.train.TrainStack,
  micro_batch_size: 8}``). The validators read the knobs' names and annotations from the
  config class (:func:`config_class_of`; a misspelt key is an error, ``shuffle=no`` is
  refused) and build the same config from the block (:func:`component_config`), so
  cross-component checks and ``dry_run`` read typed attributes instead of re-reading the
  block by string with copied defaults.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping

from unirl.config.require import ConfigError


def config_class_of(target: object) -> type | None:
    """The config dataclass a component class declares as ``config_class``, else ``None``
    (a plain class, a function, a config dataclass itself)."""
    if not inspect.isclass(target) or dataclasses.is_dataclass(target):
        return None
    cls = getattr(target, "config_class", None)
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


def config_field_names(config_cls: type) -> set[str]:
    """The names a config dataclass takes as keyword arguments."""
    return {f.name for f in dataclasses.fields(config_cls) if f.init}


def component_config(target: object, block: Mapping[str, object], where: str) -> object:
    """Component class -> its config class -> the instance of ``block``'s knobs.

    ``block`` holds the recipe's values (already type-checked); keys that are not fields of
    the config (``_target_``, sibling roles) are left out. The config's own ``__post_init__``
    runs, so its messages (which name ``<block>.<field>``) come through unchanged.
    """
    config_cls = config_class_of(target)
    if config_cls is None:
        raise ConfigError(
            f"{where}: {getattr(target, '__name__', target)} declares no config_class; a "
            "component read by the validators takes its knobs as one typed config"
        )
    fields = config_field_names(config_cls)
    knobs = {str(k): v for k, v in block.items() if k in fields}
    try:
        return config_cls(**knobs)
    except TypeError as exc:  # a required field missing
        raise ConfigError(f"{where}: {exc}") from exc
