"""Rewrite a recipe of upstream UniRL into this project's shape, and say what could not be.

    python -m unirl.tools.port_recipe OLD.yaml [-o NEW.yaml]

Upstream recipes do not compose here: they lack ``defaults: [/unirl_run, _self_]``, use
top-level keys this project does not have (``run:``, ``evaluation:``, ``model:``,
``prompts_per_rollout``) and name classes by paths that were renamed
(``unirl.train.backend.fsdp.FSDPBackend`` -> ``unirl.train.FSDPBackend``, ``fsdp_cfg`` ->
``fsdp``, ``DiffusionGRPO`` -> ``FlowGRPO``, ...). This tool maps every field it has a rule
for, checks each ported block against the signature of the class it now names (the rule the
validator applies), and lists every field it could not carry over — with the field's path in
the old recipe and why — in its report and at the top of the new file. Nothing is dropped
without a line in that list. docs/migration.md has the table.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from unirl.config.require import ConfigError
from unirl.config.run import COMPONENT_BLOCKS, RunConfig


@dataclass(frozen=True)
class Gap:
    """One field of the old recipe that the new one does not carry: ``path`` is its dotted
    path in the old recipe (``defaults[0]`` for a list entry)."""

    path: str
    why: str


@dataclass(frozen=True)
class TargetRule:
    """How a component class of upstream maps onto ours: the new ``_target_``, its renamed
    keys (a dotted new key nests: ``block_class_names`` -> ``fsdp.block_class_names``), the
    values of an old key renamed (``fsdp_mode: full`` -> ``data_parallel: shard``), and the
    ``_target_`` of sub-blocks a dotted key creates."""

    new: str
    keys: dict[str, str] = field(default_factory=dict)
    values: dict[str, dict[Any, Any]] = field(default_factory=dict)
    sub_targets: dict[str, str] = field(default_factory=dict)


_MODEL_KEYS = {
    "pretrained_model_name_or_path": "path",
    "pretrained_model_path": "path",
    "model_path": "path",
    "torch_dtype": "dtype",
}
_SCORER_KEYS = {"base_device": "device"}

# Upstream class name (the last part of its ``_target_``) -> rule. Keyed by class name, not
# path: upstream moved modules between releases, and our own paths map onto themselves.
TARGET_RULES: dict[str, TargetRule] = {
    "FSDPBackend": TargetRule(
        new="unirl.train.FSDPBackend",
        keys={
            "fsdp_cfg": "fsdp",
            "optimizer_cfg": "optimizer",
            "lora_cfg": "lora",
            "ema_cfg": "ema",
            "lr_scheduler_cfg": "lr_schedule",
            "block_class_names": "fsdp.block_class_names",
        },
        sub_targets={"fsdp": "unirl.train.FSDPConfig"},
    ),
    "FSDPConfig": TargetRule(
        new="unirl.train.FSDPConfig",
        keys={"fsdp_mode": "data_parallel"},
        values={"fsdp_mode": {"full": "shard", "no_shard": "replicate"}},
    ),
    "OptimizerConfig": TargetRule(
        new="unirl.train.OptimizerConfig",
        keys={"learning_rate": "lr", "adam_epsilon": "eps", "adam_eps": "eps"},
    ),
    "LoraConfig": TargetRule(
        new="unirl.train.LoraConfig",
        keys={
            "r": "rank",
            "lora_alpha": "alpha",
            "lora_dropout": "dropout",
            "target_modules": "targets",
        },
    ),
    "EmaLoraConfig": TargetRule(new="unirl.train.EMAConfig", keys={"ema_decay": "decay"}),
    "EmaFullConfig": TargetRule(new="unirl.train.EMAConfig", keys={"ema_decay": "decay"}),
    "EMAConfig": TargetRule(new="unirl.train.EMAConfig", keys={"ema_decay": "decay"}),
    "LrSchedulerConfig": TargetRule(
        new="unirl.train.LRScheduleConfig", keys={"scheduler_type": "kind", "name": "kind"}
    ),
    "LRScheduleConfig": TargetRule(new="unirl.train.LRScheduleConfig"),
    "TrainStack": TargetRule(new="unirl.train.TrainStack"),
    "DiffusionGRPO": TargetRule(
        new="unirl.algorithms.FlowGRPO",
        keys={"kl_beta": "kl.beta", "beta": "kl.beta"},
        sub_targets={"kl": "unirl.algorithms.KLConfig"},
    ),
    "FlowGRPO": TargetRule(new="unirl.algorithms.FlowGRPO"),
    "DiffusionSamplingParams": TargetRule(
        new="unirl.types.DiffusionSamplingParams", keys={"noise_level": "eta"}
    ),
    "FlowSDEStrategy": TargetRule(new="unirl.sde.FlowSDE", keys={"noise_level": "eta"}),
    "DanceSDEStrategy": TargetRule(new="unirl.sde.DanceSDE", keys={"noise_level": "eta"}),
    "CPSSDEStrategy": TargetRule(new="unirl.sde.CPS", keys={"noise_level": "eta"}),
    "RewardService": TargetRule(new="unirl.reward.RewardService"),
    "OCRRewardScorer": TargetRule(new="unirl.reward.local.OCRScorer", keys=_SCORER_KEYS),
    "OCRScorer": TargetRule(new="unirl.reward.local.OCRScorer", keys=_SCORER_KEYS),
    "PickScoreRewardScorer": TargetRule(new="unirl.reward.local.PickScore", keys=_SCORER_KEYS),
    "RemoteRewardBackend": TargetRule(
        new="unirl.reward.RemoteRewardBackend", keys={"base_url": "url"}
    ),
    "MultimodalRLDataSource": TargetRule(
        new="unirl.data.PromptFileSource", keys={"data_path": "path"}
    ),
    "PromptFileSource": TargetRule(new="unirl.data.PromptFileSource"),
    "TrainsideEngine": TargetRule(new="unirl.rollout.TrainsideEngine"),
    "TrainsideEngineConfig": TargetRule(new="unirl.rollout.TrainsideEngine"),
    "TrainSideEngine": TargetRule(new="unirl.rollout.TrainsideEngine"),
}

# Specific reasons for fields that the signature check drops (new class, new key) -> why; a
# field not listed here gets "<class> takes no '<key>'".
KNOWN_WHY: dict[tuple[str, str], str] = {
    ("unirl.reward.local.OCRScorer", "device"): (
        "OCRScorer has no device: RapidOCR runs on the CPU (engine=easyocr follows the reward "
        "worker's device)"
    ),
    ("unirl.reward.local.OCRScorer", "batch_size"): (
        "OCRScorer reads one image at a time; it has no batch size"
    ),
    ("unirl.reward.RemoteRewardBackend", "required_rewards"): (
        "RemoteRewardBackend names the served reward with `reward` and its parts with "
        "`components`; set them by hand"
    ),
    ("unirl.reward.RemoteRewardBackend", "reward_weights"): (
        "the reward service weighs its components itself (WeightedRewardBackend in its config)"
    ),
    ("unirl.reward.RemoteRewardBackend", "input_kind"): (
        "RemoteRewardBackend sends what the track holds (images or frames); there is no switch"
    ),
}

# keys a block keeps for a moment because the recipe pass moves them elsewhere
RELOCATED = {("unirl.types.DiffusionSamplingParams", "sde_strategy"): "pipeline.strategy"}

TOP_LEVEL_WHY = {
    "transfer_queue": (
        "this project has no TransferQueue: rollout outputs travel through the trainer's own "
        "tensor transport"
    ),
    "zero_copy": "a TransferQueue setting; this project has no TransferQueue",
}

# upstream's ``run:`` / ``evaluation:`` blocks: old key -> new dotted path
RUN_KEYS = {
    "seed": "seed",
    "output_dir": "output_dir",
    "data_path": "data_source.path",
    "eval_data_path": "eval.prompts_path",
    "resume": "resume",
    "resume_from": "resume",
    "num_devices": "num_devices",
}
EVALUATION_KEYS = {"eval_steps": "eval_interval"}
TOP_LEVEL_RENAMES = {"prompts_per_rollout": "batch_size", "model": "bundle"}
OUR_DEFAULTS = ["/unirl_run", "_self_"]
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


@dataclass
class Ported:
    """The new recipe (a plain mapping, our key order), what could not be carried over, and
    what was renamed or moved (old dotted path -> new dotted path, for the report)."""

    recipe: dict[str, Any]
    gaps: list[Gap] = field(default_factory=list)
    moved: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _locate(path: str) -> Any | None:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _accepted(target: Any) -> set[str] | None:
    """Keyword names the validator accepts for ``target``; ``None`` when it takes ``**kwargs``."""
    from unirl.config.validate import _signature_params  # the validator's own rule

    names, var_kw = _signature_params(target)
    return None if var_kw else names


def _family_class(old_target: str, suffix: str) -> str | None:
    """Our ``unirl.models.<family>.<X><suffix>`` for an upstream model target under
    ``unirl.models.<family>.``: the one class the family exports whose name ends in
    ``suffix`` (``Bundle`` / ``Pipeline``)."""
    parts = old_target.split(".")
    if len(parts) < 3 or parts[:2] != ["unirl", "models"]:
        return None
    package = f"unirl.models.{parts[2]}"
    try:
        module = importlib.import_module(package)
    except ImportError:
        return None
    found = [n for n in getattr(module, "__all__", dir(module)) if n.endswith(suffix)]
    return f"{package}.{found[0]}" if len(found) == 1 else None


class _Porter:
    def __init__(self) -> None:
        self.gaps: list[Gap] = []
        self.moved: dict[str, str] = {}
        self.notes: list[str] = []

    def gap(self, path: str, why: str) -> None:
        self.gaps.append(Gap(path, why))

    # -- one component block ------------------------------------------------------------------

    def new_target(self, old: str, old_path: str, block_name: str) -> str | None:
        name = old.rpartition(".")[2]
        if block_name in ("bundle", "pipeline") and old.startswith("unirl.models."):
            ours = _family_class(old, "Bundle" if block_name == "bundle" else "Pipeline")
            if ours is not None:
                return ours
        rule = TARGET_RULES.get(name)
        if rule is not None:
            return rule.new
        if _locate(old) is not None:  # already one of ours (or a user's own class)
            return old
        self.gap(f"{old_path}._target_", f"{old} has no counterpart here (no rule, no such class)")
        return None

    def block(self, block: Any, old_path: str, new_path: str, block_name: str) -> Any:
        """Port ``block`` (found at ``old_path``, going to ``new_path``); ``None`` when it
        cannot be carried (the gap is recorded)."""
        if isinstance(block, list):
            out = []
            for i, item in enumerate(block):
                ported = self.block(item, f"{old_path}[{i}]", f"{new_path}[{i}]", block_name)
                if ported is not None:
                    out.append(ported)
            return out
        if not isinstance(block, dict):
            self.moved[old_path] = new_path
            return block
        if "_target_" not in block:
            out = {}
            for key, value in block.items():
                ported = self.block(value, f"{old_path}.{key}", f"{new_path}.{key}", key)
                if ported is not None:
                    out[key] = ported
            self.moved[old_path] = new_path
            return out
        old_target = str(block["_target_"])
        target = self.new_target(old_target, old_path, block_name)
        if target is None:
            return None
        rule = TARGET_RULES.get(old_target.rpartition(".")[2], TargetRule(new=target))
        if block_name in ("bundle", "pipeline") and old_target.startswith("unirl.models."):
            rule = TargetRule(new=target, keys=_MODEL_KEYS)
        cls = _locate(target)
        if cls is None:
            raise ConfigError(f"port_recipe's rule names {target}, which does not import")
        accepted = _accepted(cls)
        out: dict[str, Any] = {"_target_": target}
        self.moved[old_path] = new_path
        items = list(block.items())
        # a nested spec (``config: {_target_: ...Spec, ...}``) whose class our target does not
        # take: its fields become the block's own (ours are flat)
        spec = block.get("config")
        if isinstance(spec, dict) and accepted is not None and "config" not in accepted:
            items = [(k, v) for k, v in items if k != "config"]
            items += [(f"config.{k}", v) for k, v in spec.items() if k != "_target_"]
            self.moved[f"{old_path}.config"] = new_path
        for key, value in items:
            if key == "_target_":
                continue
            if key.startswith("_"):  # Hydra's own keys (_recursive_, _convert_, _partial_)
                out[key] = value
                self.moved[f"{old_path}.{key}"] = f"{new_path}.{key}"
                continue
            old_key_path = f"{old_path}.{key}"
            plain = key.rpartition(".")[2]
            new_key = rule.keys.get(plain, plain)
            head = new_key.split(".")[0]
            if accepted is not None and head not in accepted and (target, head) not in RELOCATED:
                why = KNOWN_WHY.get((target, head), f"{target} takes no {head!r}")
                self.gap(old_key_path, why)
                continue
            if plain in rule.values and not isinstance(value, dict):
                if value not in rule.values[plain]:
                    choices = ", ".join(f"{a} -> {b}" for a, b in rule.values[plain].items())
                    self.gap(
                        old_key_path, f"{plain}={value!r} has no counterpart here (maps {choices})"
                    )
                    continue
                value = rule.values[plain][value]
            goes_to = RELOCATED.get((target, head), f"{new_path}.{new_key}")
            sub = self.block(value, old_key_path, goes_to, head)
            if sub is None and value is not None:
                continue
            self._put(out, new_key, sub, rule)
            self.moved[old_key_path] = goes_to
        return out

    @staticmethod
    def _put(out: dict[str, Any], dotted: str, value: Any, rule: TargetRule) -> None:
        parts = dotted.split(".")
        node = out
        for part in parts[:-1]:
            if part not in node:
                node[part] = (
                    {"_target_": rule.sub_targets[part]} if part in rule.sub_targets else {}
                )
            node = node[part]
        last = parts[-1]
        if isinstance(node.get(last), dict) and isinstance(value, dict):  # nested key came first
            kept = {k: v for k, v in node[last].items() if k != "_target_"}
            value = {**value, **kept}
        node[last] = value

    # -- the whole recipe ---------------------------------------------------------------------

    def recipe(self, old: dict[str, Any]) -> dict[str, Any]:
        known = {f.name for f in dataclasses.fields(RunConfig)}
        new: dict[str, Any] = {}
        later: list[tuple[str, str, Any]] = []  # (old path, new dotted path, value)
        for key, value in old.items():
            if key == "defaults":
                self.defaults(value)
                continue
            if key == "hydra":
                new[key] = value
                continue
            if key in ("run", "evaluation") and isinstance(value, dict):
                table = RUN_KEYS if key == "run" else EVALUATION_KEYS
                for sub, sub_value in value.items():
                    if sub in table:
                        later.append((f"{key}.{sub}", table[sub], sub_value))
                    else:
                        why = f"no counterpart of {key}.{sub} here (RunConfig has no such field)"
                        self.gap(f"{key}.{sub}", why)
                continue
            name = TOP_LEVEL_RENAMES.get(key, key)
            if key in TOP_LEVEL_WHY:
                self.gap(key, TOP_LEVEL_WHY[key])
                continue
            if name not in known:
                self.gap(key, f"no top-level key {key!r} here (RunConfig has no such field)")
                continue
            if name in COMPONENT_BLOCKS:
                ported = self.block(value, key, name, name)
                if ported is not None:
                    new[name] = ported
            else:
                new[name] = copy.deepcopy(value)
                self.moved[key] = name
        self.sde_strategy_to_pipeline(new)
        for old_path, dotted, value in later:
            self.put_later(new, old_path, dotted, value)
        return new

    def defaults(self, entries: Any) -> None:
        for i, entry in enumerate(entries or []):
            if entry in ("_self_", "/unirl_run"):
                continue
            group = next(iter(entry)) if isinstance(entry, dict) else str(entry)
            why = TOP_LEVEL_WHY.get(str(group).lstrip("/+"))
            self.gap(
                f"defaults[{i}]",
                f"{entry!r}: {why}" if why else f"{entry!r}: no such config group here",
            )

    def sde_strategy_to_pipeline(self, new: dict[str, Any]) -> None:
        """Upstream keeps the SDE strategy under ``sampling.sde_strategy``; ours is the
        pipeline's ``strategy``. Without a ``pipeline`` block, build the bundle family's."""
        sampling = new.get("sampling")
        strategy = sampling.pop("sde_strategy", None) if isinstance(sampling, dict) else None
        pipeline = new.get("pipeline")
        if pipeline is None and isinstance(new.get("bundle"), dict):
            family = _family_class(str(new["bundle"].get("_target_", "")), "Pipeline")
            if family is not None:
                pipeline = new["pipeline"] = {"_target_": family}
                self.notes.append(f"pipeline: built as {family} (the old recipe has none)")
                if strategy is None:
                    strategy = {"_target_": "unirl.sde.FlowSDE"}
                    self.notes.append(
                        "pipeline.strategy: unirl.sde.FlowSDE (the old recipe names none)"
                    )
        if strategy is None:
            return
        if not isinstance(pipeline, dict) or "strategy" in pipeline:
            self.gap("sampling.sde_strategy", "no pipeline block to hold it, or it names its own")
            return
        pipeline["strategy"] = strategy
        eta = isinstance(sampling, dict) and "eta" in sampling
        if eta and isinstance(strategy, dict) and "eta" not in strategy:
            strategy["eta"] = "${sampling.eta}"

    def put_later(self, new: dict[str, Any], old_path: str, dotted: str, value: Any) -> None:
        head, _, rest = dotted.partition(".")
        if not rest:
            new[head] = value
        elif head == "data_source":
            source = new.get("data_source")
            if not isinstance(source, dict):
                self.gap(old_path, "the recipe has no data_source block to carry the path")
                return
            if rest in source and source[rest] != value:
                self.gap(old_path, f"data_source.{rest} is set too ({source[rest]!r}); kept it")
                return
            source[rest] = value
        else:
            new.setdefault(head, {})[rest] = value
        self.moved[old_path] = dotted

    # -- interpolations -----------------------------------------------------------------------

    def interpolations(self, node: Any, path: str, dropped: set[str]) -> Any:
        """Rewrite ``${old.path}`` to where that field went; a field that interpolates a
        field not carried over is dropped and listed."""
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                ported = self.interpolations(value, f"{path}.{key}" if path else key, dropped)
                if ported is not _DROP:
                    out[key] = ported
            return out
        if isinstance(node, list):
            items = [self.interpolations(v, f"{path}[{i}]", dropped) for i, v in enumerate(node)]
            return [v for v in items if v is not _DROP]
        if not isinstance(node, str) or "${" not in node:
            return node
        missing: list[str] = []

        def swap(match: re.Match[str]) -> str:
            ref = match.group(1)
            for cut in range(len(ref.split(".")), 0, -1):
                prefix = ".".join(ref.split(".")[:cut])
                if prefix in self.moved:
                    rest = ref[len(prefix) :]
                    return "${" + self.moved[prefix] + rest + "}"
                if prefix in dropped:
                    missing.append(ref)
                    return match.group(0)
            return match.group(0)

        text = _INTERPOLATION.sub(swap, node)
        if missing:
            self.gap(path, f"interpolates {', '.join(missing)}, which was not carried over")
            return _DROP
        return text


_DROP = object()


def port_recipe(old: dict[str, Any]) -> Ported:
    """Map an upstream recipe (a plain mapping) onto this project's recipe shape."""
    if not isinstance(old, dict):
        raise ConfigError("port_recipe: the old recipe must be a YAML mapping at its top level")
    porter = _Porter()
    new = porter.recipe(old)
    # the old path of each interpolation; ``moved`` maps old -> new
    dropped = {g.path.removesuffix("._target_") for g in porter.gaps}
    new = porter.interpolations(new, "", dropped)
    ordered: dict[str, Any] = {"defaults": list(OUR_DEFAULTS)}
    blocks = [k for k in COMPONENT_BLOCKS if k in new]
    ordered.update({k: v for k, v in new.items() if k not in blocks})
    ordered.update({k: new[k] for k in blocks})
    return Ported(recipe=ordered, gaps=porter.gaps, moved=porter.moved, notes=porter.notes)


def render(ported: Ported, source: str) -> str:
    """The new recipe as YAML: our package header, the gaps as comments, then the keys."""
    lines = [
        "# @package _global_",
        f"# Ported from upstream UniRL ({source}) by unirl.tools.port_recipe.",
    ]
    if ported.gaps:
        lines.append("# Not carried over (old field: why) -- set these by hand if they matter:")
        lines += [f"#   {g.path}: {g.why}" for g in ported.gaps]
    else:
        lines.append("# Every field was carried over.")
    body = yaml.safe_dump(ported.recipe, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(lines) + "\n" + body


def report(ported: Ported) -> str:
    lines = [f"could not map {len(ported.gaps)} field(s):" if ported.gaps else "every field mapped"]
    lines += [f"  {g.path}: {g.why}" for g in ported.gaps]
    lines += [f"note: {n}" for n in ported.notes]
    return "\n".join(lines)


def _same_name_as_ours(out: Path) -> Path | None:
    from unirl.config.entry import EXAMPLES_DIR

    hits = sorted(EXAMPLES_DIR.glob(f"*/{out.stem}.yaml"))
    return hits[0] if hits else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m unirl.tools.port_recipe",
        description="Rewrite an upstream UniRL recipe to this project's shape; lists what it "
        "could not map.",
    )
    parser.add_argument("old", type=Path, help="the upstream recipe (YAML)")
    parser.add_argument("-o", "--out", type=Path, help="where to write it (default: stdout)")
    args = parser.parse_args(argv)
    try:
        old = yaml.safe_load(args.old.read_text())
        ported = port_recipe(old)
    except (OSError, yaml.YAMLError, ConfigError) as exc:
        print(f"[unirl] port_recipe: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    text = render(ported, args.old.name)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
        clash = _same_name_as_ours(args.out)
        if clash is not None:
            print(
                f"note: {clash.relative_to(clash.parents[1])} is also one of this project's "
                "recipes; give the ported file another name so --config-name cannot mean ours",
                file=sys.stderr,
            )
    print(report(ported), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
