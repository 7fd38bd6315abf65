"""Entrypoint machinery shared by the domain mains (``unirl.train_diffusion`` …).

Recipes live in ``<repo>/examples/<domain>/<name>.yaml`` and are addressed as
``--config-name=<domain>/<name>`` from any working directory. Every recipe starts with
``# @package _global_`` and ``defaults: [/unirl_run, _self_]``: the ``unirl_run`` node (built
from ``RunConfig``'s defaults) declares every top-level key, so ``dry_run=true`` or
``resume=...`` overrides work on any recipe. An override of a key the composed recipe lacks
is refused before Hydra runs, in one line with the close matches and the fix
(``override_refusal``).

``hydra_entry`` builds a domain's main: Hydra's flags in any position, one folder per
multirun job, and a failure reported in one line (the traceback goes to ``train.log``).
``--help`` prints Hydra's usage, then every key of the recipe with a line from its typed
config (:mod:`unirl.config.help`); a ``--config-dir`` recipe named like a bundled one is
refused (Hydra would load the bundled one).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from unirl.config.require import ConfigError, UserFacingError
from unirl.config.run import RunConfig
from unirl.config.secrets import redact_text, secret_values

# the recipes (and, beside them, ``datasets/``): the clone's, or the copy a wheel ships under
# ``unirl/_bundled/`` (setup.py) when the package runs from site-packages
CLONE_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUNDLED_EXAMPLES = Path(__file__).resolve().parents[1] / "_bundled" / "examples"
IN_CLONE = (CLONE_EXAMPLES.parent / "pyproject.toml").is_file() and CLONE_EXAMPLES.is_dir()
EXAMPLES_DIR = CLONE_EXAMPLES if IN_CLONE else BUNDLED_EXAMPLES

# Hydra writes nothing by itself: the trainer owns output_dir (resolved config, train.log).
# Added to the command line after the user's overrides (``hydra_command_line``), each only
# when the user did not set that key, so ``hydra.run.dir=...`` on the command line wins.
HYDRA_DEFAULTS = (
    ("hydra.run.dir", "."),
    ("hydra.output_subdir", "null"),
    ("hydra/job_logging", "none"),
    ("hydra/hydra_logging", "none"),
)
SWEEP_DIR_KEY = "hydra.sweep.dir"


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """The user's arguments as Hydra's own parser reads them: ``overrides`` (``key=value``,
    in order) and ``flags`` (every other argument with its value, in order)."""

    overrides: list[str]
    flags: list[str]
    multirun: bool
    config_name: str | None = None
    config_dir: str | None = None
    help: bool = False


def split_command_line(given: list[str]) -> CommandLine | None:
    """Split ``given`` with Hydra's parser, flags and overrides in any order
    (``k=v --cfg job``, ``--cfg job k=v``, ``k=v -m``, ``--info``); ``None`` when the parser
    refuses it or it asks for ``--version``: Hydra then reads the arguments as given and
    reports its own error."""
    from hydra._internal.utils import get_args_parser

    if "--version" in given:
        return None
    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        raise ValueError(message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        parsed = parser.parse_intermixed_args(given)
    except ValueError:
        return None
    overrides = list(parsed.overrides)
    flags, pending = [], list(overrides)
    for arg in given:  # the overrides are the positionals, in order; the rest are flags
        if pending and arg == pending[0]:
            pending.pop(0)
        else:
            flags.append(arg)
    return CommandLine(
        overrides=overrides,
        flags=flags,
        multirun=bool(parsed.multirun),
        config_name=parsed.config_name,
        config_dir=parsed.config_dir,
        help=bool(parsed.help),
    )


def override_key(override: str) -> str:
    """``backend.optimizer.lr`` of ``backend.optimizer.lr=1e-3`` (``+``/``++``/``~`` and a
    ``@package`` dropped); a config group keeps its ``/`` (``hydra/job_logging``)."""
    return override.lstrip("+~").split("=", 1)[0].split("@", 1)[0]


def hydra_command_line(line: CommandLine, *, sweep_dir: str | None = None) -> list[str]:
    """What Hydra parses: the user's overrides, then the defaults the user did not set, then
    the flags. Overrides before flags keep every flag working in any position (argparse
    takes one run of positionals, and ``--info`` would swallow an override after it)."""
    given = {override_key(o) for o in line.overrides}
    extra = [f"{key}={value}" for key, value in HYDRA_DEFAULTS if key not in given]
    if sweep_dir is not None and SWEEP_DIR_KEY not in given:
        extra.append(f"{SWEEP_DIR_KEY}='{sweep_dir}'")
    return [*line.overrides, *extra, *line.flags]


def swept_keys(overrides: list[str]) -> set[str]:
    """Keys a multirun sweeps over (``lr=1e-3,2e-3``, ``range(...)``, ``glob(...)``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra reports a malformed override itself
        return set()
    return {o.key_or_group for o in parsed if o.is_sweep_override()}


def job_output_dir(
    output_dir: str, job_num: int, job_overrides: list[str], swept: set[str]
) -> Path:
    """A multirun job's own folder: ``<output_dir>/<job num>_<its swept overrides>``
    (``0_backend.optimizer.lr=0.001``, values as Hydra formats them); just the number when nothing on the command line was
    swept. ``output_dir`` itself may be swept: it stays the parent and leaves the name."""
    chosen = [o for o in job_overrides if override_key(o) in swept - {"output_dir"}]
    label = re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(chosen))[:120]
    return Path(output_dir) / (f"{job_num}_{label}" if label else str(job_num))


def run_defaults() -> dict[str, Any]:
    """Every top-level key with its ``RunConfig`` default (component blocks ``None``)."""
    return dataclasses.asdict(RunConfig())


def register_run_defaults() -> None:
    """The ``unirl_run`` defaults node and the ``${unirl_root:}`` resolver (the repo root, so
    recipes can name bundled files whatever the working directory)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="unirl_run", node=run_defaults(), package="_global_")
    if not OmegaConf.has_resolver("unirl_root"):
        OmegaConf.register_new_resolver("unirl_root", lambda: str(EXAMPLES_DIR.parent))
    if not OmegaConf.has_resolver("mul"):  # batch geometry scaled by num_devices
        OmegaConf.register_new_resolver("mul", lambda *xs: math.prod(int(x) for x in xs))


def examples_dir() -> Path:
    if not EXAMPLES_DIR.is_dir():
        raise FileNotFoundError(
            f"recipe folder {EXAMPLES_DIR} not found: this unirl was installed without its "
            "recipes; reinstall the wheel (pip install unirl-mm), or install editable from a "
            "clone (pip install -e .) so the examples/ tree is next to the package"
        )
    return EXAMPLES_DIR


def compose_recipe(name: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Compose recipe ``<domain>/<name>`` with ``overrides`` exactly as the entrypoints do
    (same search path and ``unirl_run`` defaults), resolved to a plain dict."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_run_defaults()
    with initialize_config_dir(config_dir=str(examples_dir()), version_base=None):
        cfg = compose(config_name=name, overrides=list(overrides or []))
    data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(data, dict)
    return data  # type: ignore[return-value]


def shadowed_recipe(config_name: str, config_dir: str | None) -> str | None:
    """The one-line refusal when ``--config-dir`` holds a recipe named like a bundled one:
    Hydra searches ``examples/`` first, so it would silently load ours instead."""
    if config_dir is None:
        return None
    name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
    theirs = Path(config_dir).expanduser().resolve() / name
    ours = EXAMPLES_DIR / name
    if not (theirs.is_file() and ours.is_file()) or theirs == ours.resolve():
        return None
    stem = name.removesuffix(".yaml")
    return (
        f"--config-dir recipe {theirs} has the same name as the bundled {ours}, which Hydra "
        f"would load instead (examples/ is searched first); rename yours (e.g. "
        f"{stem}_mine.yaml) and pass --config-name={stem}_mine"
    )


def _compose_line(line: CommandLine, default_config: str, overrides: list[str]) -> Any:
    """The recipe of ``line`` composed with ``overrides`` on the entrypoint's search path
    (``examples/``, then a ``--config-dir`` where Hydra puts it), Hydra's own node dropped."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import open_dict

    search_path = create_config_search_path(f"file://{examples_dir()}")
    if line.config_dir is not None:
        extra = Path(line.config_dir).expanduser().resolve()
        search_path.prepend("command-line", f"file://{extra}", SearchPathQuery(provider="schema"))
    GlobalHydra.instance().clear()
    try:
        hydra = Hydra.create_main_hydra2(task_name="check", config_search_path=search_path)
        cfg = hydra.compose_config(
            config_name=line.config_name or default_config,
            overrides=[o for o in overrides if not override_key(o).startswith("hydra")],
            run_mode=RunMode.RUN,
        )
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):  # Hydra's own node (its sweep keys need a running job to resolve)
        cfg.pop("hydra", None)
    return cfg


def help_keys(line: CommandLine, default_config: str) -> str:
    """The ``== Keys ==`` section of ``--help`` (:mod:`unirl.config.help`) for the recipe and
    overrides of ``line``."""
    from omegaconf import OmegaConf

    from unirl.config.help import recipe_help

    cfg = _compose_line(line, default_config, line.overrides)
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation help cannot resolve: show the values as written
        data = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(data, dict)
    return recipe_help(data)  # type: ignore[arg-type]


def override_refusal(line: CommandLine, default_config: str, entry: str) -> str | None:
    """One line for an override that sets a key the composed recipe lacks, or None.

    Hydra refuses such an override in several lines and suggests ``+key=value``, which is
    right only for a key the component accepts but the recipe leaves at its default. This
    line names the override and the missing key, the closest keys that exist there, and the
    fix for each case: ``+`` for a component default, ``~`` then ``+`` to replace a block
    (a mapping given on the command line is merged into the recipe's block, key by key).
    Swept (``-m``) values and anything else Hydra refuses are left to Hydra's own report."""
    import difflib

    from hydra.errors import ConfigCompositionException
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    swept = swept_keys(line.overrides)
    plain = [
        o
        for o in line.overrides
        if not o.startswith(("+", "~"))
        and not override_key(o).startswith("hydra")
        and override_key(o) not in swept
    ]
    if not plain:
        return None
    try:
        unswept = [o for o in line.overrides if override_key(o) not in swept]
        _compose_line(line, default_config, unswept)
        return None
    except ConfigCompositionException as exc:
        match = re.match(r"Could not override '([^']+)'", str(exc))
        cause = exc.__cause__
        if match is None or not isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            return None
        key, missing = match.group(1), str(getattr(cause, "full_key", "") or "")
    except Exception:  # a recipe or value Hydra reports in its own words
        return None
    merged = missing.startswith(f"{key}.")  # a mapping merged into the block
    if not missing or not (merged or missing == key or key.startswith(f"{missing}.")):
        return None
    given = next((o for o in plain if override_key(o) == key), key)
    try:
        recipe = _compose_line(line, default_config, [])
    except Exception:
        return None
    node: Any = recipe
    parts = missing.split(".")
    where: list[str] = []
    for part in parts[:-1]:
        if not isinstance(node, DictConfig) or part not in node:
            break
        node, where = node[part], [*where, part]
    absent = parts[len(where)]
    known = sorted(str(k) for k in node) if isinstance(node, DictConfig) else []
    close = [] if merged else difflib.get_close_matches(absent, known, n=3, cutoff=0.6)
    at = f"under '{'.'.join(where)}'" if where else "at the top level"
    if close:
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)"
    else:
        hint = f" (keys {at}: {known})" if known else ""
    help_cmd = f"python -m {entry} --config-name={line.config_name or default_config} --help"
    if merged:
        fix = (
            f"a mapping on the command line is merged into the recipe's '{key}' block; to "
            f"replace the block write '~{key}' '+{key}={{...}}'"
        )
    elif not where:  # every top-level key is declared (unirl_run): nothing to add there
        fix = f"{help_cmd} lists every key"
    elif close and absent not in _accepted_keys(node):  # a typo: '+' would add the typo
        fixed = ".".join([*where, close[0]])
        value = given.partition("=")[2]
        fix = f"write '{fixed}={value}'" if value else f"write '{fixed}'"
    else:
        fix = (
            f"if it is a default the recipe leaves out, add it with '+{key}=...' ({help_cmd} "
            "lists the keys, marking those with '+')"
        )
    return f"override '{given}': the recipe has no key '{missing}'{hint}; {fix}"


def _accepted_keys(node: Any) -> set[str]:
    """The keyword names the class of a recipe block (its ``_target_``) takes; empty when the
    block names none or the class does not import."""
    from omegaconf import DictConfig

    from unirl.config.validate import _signature_params

    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if not isinstance(target, str):
        return set()
    module, _, name = target.rpartition(".")
    try:
        import importlib

        names, _ = _signature_params(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError, ValueError):
        return set()
    return names


def report_failure(exc: Exception, secrets: set[str] | frozenset[str] = frozenset()) -> None:
    """One ``[unirl] error:`` line first, then where the traceback is. A failure inside a run
    arrives with ``unirl_failure_line`` and ``unirl_train_log`` set by the trainer's console
    log (which knows remote failures: role, method, rank and the remote error in one line);
    anything else gets ``Type: first line`` and its traceback here. URL passwords and the
    recipe's credentials (``secrets``) are masked in both."""
    line = getattr(exc, "unirl_failure_line", None)
    if not line:
        first = next(iter(str(exc).strip().splitlines()), "")
        line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    print(f"[unirl] error: {redact_text(line, secrets)}", file=sys.stderr, flush=True)
    log = getattr(exc, "unirl_train_log", None)
    if log:
        print(f"[unirl] the full traceback is in {log}", file=sys.stderr, flush=True)
    else:
        text = "".join(traceback.format_exception(exc))
        print(redact_text(text, secrets), file=sys.stderr, end="", flush=True)


def run_reporting(run: Callable[[dict[str, Any]], int | None], data: dict[str, Any]) -> int:
    """``run(data)``'s exit code; a failure is reported (see :func:`report_failure`), not
    raised: 2 for a configuration or user-facing error (one line, no traceback), 130 for an
    interrupt that stopped at once (one line), else 1."""
    secrets = secret_values(data)  # never printed: masked in every line below
    try:
        return run(data) or 0
    except ConfigError as exc:
        line = redact_text(str(exc), secrets)
        print(f"[unirl] configuration error: {line}", file=sys.stderr, flush=True)
        return 2
    except UserFacingError as exc:  # a refused resume, a model path that resolves to nothing
        print(f"[unirl] error: {redact_text(str(exc), secrets)}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C before the loop's handler, or a second one
        why = str(exc) or "interrupted"
        print(
            f"[unirl] stopped: {why}; resume=auto continues from the last complete checkpoint",
            file=sys.stderr,
            flush=True,
        )
        return 130
    except Exception as exc:
        report_failure(exc, secrets)
        return 1


def _entry_module(run: Callable[..., Any]) -> str:
    """``unirl.train_diffusion`` for the ``run`` of that module, also under ``python -m``."""
    name = run.__module__
    if name == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        name = getattr(spec, "name", None) or "unirl.train_diffusion"
    return name


def hydra_entry(
    default_config: str, run: Callable[[dict[str, Any]], int | None]
) -> Callable[[], None]:
    """A Hydra main for one domain: composes the recipe, resolves it and calls ``run``.

    Hydra's flags work in any position; ``-m`` runs each job into its own folder under
    ``output_dir`` (:func:`job_output_dir`), and a failed job is reported and the sweep goes
    on, exiting non-zero at the end (as Hydra's own launcher does)."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    register_run_defaults()
    swept: set[str] = set()
    failed_jobs: list[str] = []

    @hydra.main(config_path=str(examples_dir()), config_name=default_config, version_base=None)
    def _main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        job = HydraConfig.get()
        multirun = job.mode == RunMode.MULTIRUN
        if multirun:
            folder = job_output_dir(
                str(cfg.output_dir), int(job.job.num), list(job.overrides.task), swept
            )
            cfg.output_dir = str(folder)
            print(f"[unirl] multirun job {job.job.num}: output_dir {folder}", flush=True)
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        assert isinstance(data, dict)
        code = run_reporting(run, data)  # type: ignore[arg-type]
        if code and multirun:
            failed_jobs.append(f"job {job.job.num} ({cfg.output_dir}): exit code {code}")
        elif code:
            sys.exit(code)

    def main() -> None:
        given = sys.argv[1:]
        line = split_command_line(given)
        os.environ.setdefault("HYDRA_FULL_ERROR", "0")
        if line is None:  # Hydra reads the arguments as given and reports its own error
            sys.argv = [sys.argv[0], *given]
            _main()
            return
        refused = shadowed_recipe(line.config_name or default_config, line.config_dir)
        if refused is None and not line.help:
            refused = override_refusal(line, default_config, _entry_module(run))
        if refused is not None:
            values = {override_key(o): o.split("=", 1)[-1] for o in line.overrides if "=" in o}
            line_secrets = secret_values({k.rsplit(".", 1)[-1]: v for k, v in values.items()})
            refused = redact_text(refused, line_secrets)
            print(f"[unirl] configuration error: {refused}", file=sys.stderr, flush=True)
            sys.exit(2)
        swept.update(swept_keys(line.overrides))
        # a multirun's sweep folder (Hydra writes the unredacted multirun.yaml there) is a
        # temporary one unless the user names it; each job writes to its own output_dir
        named = any(override_key(o) == SWEEP_DIR_KEY for o in line.overrides)
        sweep_dir = tempfile.mkdtemp(prefix="unirl-sweep-") if line.multirun and not named else None
        sys.argv = [sys.argv[0], *hydra_command_line(line, sweep_dir=sweep_dir)]
        try:
            _main()
        except SystemExit as done:  # Hydra ends --help with exit 0: our key listing follows
            if not line.help or done.code not in (0, None):
                raise
            print(help_keys(line, default_config), flush=True)
            raise
        finally:
            if sweep_dir is not None:
                shutil.rmtree(sweep_dir, ignore_errors=True)
        if failed_jobs:
            for failure in failed_jobs:
                print(f"[unirl] multirun: {failure}", file=sys.stderr, flush=True)
            sys.exit(1)

    return main
