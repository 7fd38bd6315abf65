"""``RunConfig``: the typed top level of every recipe. Unknown top-level keys are errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from unirl.config.entrypoint import Entrypoint
from unirl.config.pool import PoolConfig
from unirl.config.require import ConfigError, require
from unirl.config.typecheck import (
    NonNegativeInt,
    PositiveInt,
    annotations_of,
    build_config,
    check_fields,
    config_class,
)

COMPONENT_BLOCKS = (
    "bundle",
    "pipeline",
    "backend",
    "rollout",
    "reward",
    "algorithm",
    "stack",
    "sync",
    "data_source",
    "sampling",
)


@dataclass(kw_only=True)
class AdvantageConfig:
    """How rewards become advantages (``unirl.algorithms.advantages.advantages_for``).

    Default: ``RolloutTrack.compute_advantages`` on the total reward (``scope``, ``std``).
    ``component_weights`` (``{component: weight >= 0}``) switches to GDPO-style per-component
    normalisation: each named reward component is standardised within its group, the weighted
    sum is then standardised over the batch when ``component_batch_norm``; ``scope`` and
    ``std`` are not used then. ``eps`` and ``clip`` apply to both.
    """

    scope: Literal["group", "global", "leave_one_out"] = "group"
    std: Literal["group", "batch", "none"] = "batch"
    eps: float = 1e-4
    clip: float | None = 5.0
    component_weights: dict[str, float] | None = None
    component_batch_norm: bool = True

    def __post_init__(self) -> None:
        require(
            self.scope in ("group", "global", "leave_one_out"),
            f"advantage.scope must be 'group', 'global' or 'leave_one_out' (RLOO), got "
            f"{self.scope!r}",
        )
        require(
            self.std in ("group", "batch", "none"),
            f"advantage.std must be 'group', 'batch' or 'none', got {self.std!r}",
        )
        require(self.eps >= 0, "advantage.eps must be >= 0")
        require(self.clip is None or self.clip > 0, "advantage.clip must be > 0 or null")
        require(
            isinstance(self.component_batch_norm, bool),
            "advantage.component_batch_norm must be true or false",
        )
        if self.component_weights is not None:
            self.component_weights = self._checked_weights(self.component_weights)
            require(
                self.scope == "group",
                "advantage.component_weights normalises each component within its group; "
                "set advantage.scope=group (or drop component_weights for scope=global)",
            )

    @staticmethod
    def _checked_weights(weights: Any) -> dict[str, float]:
        """A non-empty mapping of component names to finite weights >= 0, one at least > 0."""
        require(
            isinstance(weights, dict) and len(weights) > 0,
            "advantage.component_weights must be a non-empty mapping {reward component: weight} "
            f"or null, got {weights!r}",
        )
        out: dict[str, float] = {}
        for name, weight in weights.items():
            require(
                isinstance(name, str) and bool(name),
                f"advantage.component_weights: keys must be reward component names, got {name!r}",
            )
            number = isinstance(weight, int | float) and not isinstance(weight, bool)
            require(
                number and 0 <= weight < float("inf"),  # NaN fails both comparisons
                f"advantage.component_weights.{name} must be a finite weight >= 0, got {weight!r}",
            )
            out[name] = float(weight)
        require(
            any(w > 0 for w in out.values()),
            "advantage.component_weights: every weight is 0, so every advantage would be 0; "
            "give at least one component a weight > 0",
        )
        return out


@dataclass(kw_only=True)
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (``unirl.trainer.dynamic_sampling``): ``enabled`` drops every
    prompt group whose rewards are all equal (zero variance, zero advantage) and samples more
    prompts until ``batch_size`` groups with differing rewards are in hand, the batch trained
    on; ``max_rounds``: extra sampling rounds per rollout at most, past which the run stops
    with an error (text recipes, ``rollout.resident: false``)."""

    enabled: bool = False
    """Drop the groups whose rewards are all equal and refill the batch by sampling more."""
    max_rounds: PositiveInt = 4
    """Extra sampling rounds per rollout at most; past them the run stops with an error."""

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), "dynamic_sampling.enabled must be true or false")
        require(self.max_rounds >= 1, "dynamic_sampling.max_rounds must be >= 1")


@dataclass(kw_only=True)
class EvalConfig:
    """Periodic evaluation on fixed prompts (ODE sampling, EMA weights when present).

    ``prompts_path``: a held-out prompt file; null holds the last ``num_prompts`` prompts of
    the training file out of training and evaluates on them. ``at_start``: evaluate before the
    first rollout too (the baseline at step 0)."""

    prompts_path: str | None = None
    num_prompts: PositiveInt = 8
    """How many eval prompts (the first of ``prompts_path``, or the held-out ones)."""
    samples_per_prompt: PositiveInt = 1
    """Images (or videos) drawn per eval prompt."""
    seed: NonNegativeInt = 1234
    """Seed of the eval rollouts' random draws (initial noise, token sampling) in place of the
    top-level ``seed``; the draws also depend on the sample ids, which include the step the
    eval runs at, so each eval draws afresh."""
    use_ema: bool = True
    """Sample the eval with the EMA weights when the backend keeps them (else the raw ones)."""
    at_start: bool = True

    def __post_init__(self) -> None:
        require(self.num_prompts >= 1, "eval.num_prompts must be >= 1")
        require(self.samples_per_prompt >= 1, "eval.samples_per_prompt must be >= 1")


@dataclass(kw_only=True)
class LoggingConfig:
    """Trackers and media. ``local`` (metrics.jsonl / metrics.csv) is always on."""

    trackers: list[str] = field(default_factory=lambda: ["local"])
    """Where metrics go: any of ``local``, ``tensorboard``, ``wandb`` (``local`` is always on)."""
    wandb_project: str | None = None
    """W&B project of the run (null: ``unirl``)."""
    wandb_run_name: str | None = None
    """W&B run name (null: W&B picks one)."""
    gallery_interval: NonNegativeInt = 1
    """Write a training contact sheet to ``samples/`` every this many rollouts (0: never)."""
    gallery_max_images: PositiveInt = 16
    """Samples drawn on one contact sheet at most."""
    progress: Literal["auto", "on", "off"] = "auto"
    """Console progress: ``on`` a bar, ``off`` one line per rollout, ``auto`` a bar only when
    stdout and stderr are terminals (and ``CI`` is unset)."""

    def __post_init__(self) -> None:
        known = {"local", "tensorboard", "wandb"}
        unknown = sorted(set(self.trackers) - known)
        require(
            not unknown,
            f"logging.trackers: unknown tracker(s) {unknown}; choose from {sorted(known)}",
        )
        require(
            self.gallery_interval >= 0,
            "logging.gallery_interval must be >= 0 (0 disables galleries)",
        )
        require(self.progress in ("auto", "on", "off"), "logging.progress must be auto, on or off")


@dataclass(kw_only=True)
class ParallelConfig:
    """Model parallelism inside the data-parallel mesh of the train ranks."""

    sequence_parallel_size: PositiveInt = 1
    """Ulysses sequence parallelism: the ranks of one SP group take the same rows and split
    each video's tokens (attention heads during attention) between them; data parallelism
    takes ``num_devices / sequence_parallel_size`` groups. Video families with a shard plan
    (Wan 2.1 / 2.2, HunyuanVideo 1.0 / 1.5), a trainside engine and ``unirl.train_diffusion``
    only; must divide ``num_devices`` and the model's attention heads (1: off)."""

    def __post_init__(self) -> None:
        require(
            self.sequence_parallel_size >= 1,
            "parallel.sequence_parallel_size must be >= 1 (1: no sequence parallelism)",
        )


@dataclass(kw_only=True)
class RunConfig(PoolConfig):
    """Run-level facts: the device pool (the fields of :class:`PoolConfig`, which this class
    derives, so a recipe sets them at its top level), batch geometry, cadence, outputs.
    Component blocks stay as ``_target_`` configs (validated by signature in
    ``unirl.config.validate``, which also builds their typed configs)."""

    entrypoint: Entrypoint | None = None
    """The module that runs the recipe (``unirl.train_diffusion``, ``unirl.train_vlm``,
    ``unirl.train_pe``, ``unirl.train_unified_model``); another entrypoint refuses it before
    anything is built. Every bundled recipe declares it."""
    batch_size: PositiveInt = 8
    """Prompts per rollout; each is sampled ``sampling.samples_per_prompt`` times (one group)."""
    layout: Literal["colocate", "separate"] = "colocate"
    """``colocate``: every role on every worker; ``separate``: a dedicated engine on its own devices."""
    train_fraction: float = 1.0
    """With ``layout=separate``: the share of ``num_devices`` that trains (the rest samples)."""
    num_rollouts: PositiveInt = 100
    """Rollouts (loop iterations) the run makes in all, a resumed run included."""
    save_interval: NonNegativeInt = 0
    """Write a checkpoint every this many rollouts and at the end (0: never)."""
    keep_last: NonNegativeInt = 0
    """After each checkpoint, keep the newest ``keep_last`` complete ones (0: keep every one)."""
    eval_interval: NonNegativeInt = 0
    """Evaluate every this many rollouts and at the end (0: never); see ``eval``."""
    sync_interval: NonNegativeInt = 1
    """Sync weights to a dedicated engine every this many rollouts (a ``sync`` block may override)."""
    output_dir: str = "outputs/run"
    """The folder the run writes (config, logs, metrics, samples, checkpoints, LoRA)."""
    resume: str | None = None
    """``auto`` (the newest checkpoint that verifies) or a ``checkpoints/step_XXXXXX`` folder."""
    overwrite: bool = False
    """Clear an earlier run in ``output_dir`` instead of refusing to start."""
    seed: NonNegativeInt = 0
    """The run's seed: sampling noise and SDE-step draws; recipes pass ``${seed}`` to the data order,
    LoRA init and shuffling."""
    dry_run: bool = False
    """Compose and validate, print the placement plan and batch geometry, start nothing."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # component blocks (``_target_`` dicts); ``sync`` only for dedicated engines
    bundle: Any = None
    pipeline: Any = None
    backend: Any = None
    rollout: Any = None
    reward: Any = None
    algorithm: Any = None
    stack: Any = None
    sync: Any = None
    data_source: Any = None
    sampling: Any = None
    # a prompt enhancer's drawer and how its stages are tied (``unirl.trainer.pe.PEConfig``,
    # read by ``unirl.train_pe`` only)
    pe: Any = None
    # a unified model's image stage and how its two losses meet (``unirl.trainer.unified_model``,
    # read by ``unirl.train_unified_model`` only)
    unified: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()  # the pool fields
        require(self.batch_size >= 1, "batch_size (prompts per rollout) must be >= 1")
        require(
            self.layout in ("colocate", "separate"),
            f"layout must be 'colocate' or 'separate', got {self.layout!r}",
        )
        require(0.0 < self.train_fraction <= 1.0, "train_fraction must be in (0, 1]")
        require(self.num_rollouts >= 1, "num_rollouts must be >= 1")
        require(
            isinstance(self.output_dir, str) and self.output_dir.strip() != "",
            "output_dir is empty; give the folder the run writes to (output_dir=outputs/<name> "
            "or OUTPUT_DIR=...)",
        )
        for name in ("save_interval", "eval_interval", "sync_interval"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0 (0 disables it)")

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RunConfig:
        """Build from a plain dict; unknown keys raise ``ConfigError`` listing the known ones."""
        data = {k: v for k, v in data.items() if k != "hydra"}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown top-level key(s) {unknown}; known keys are {sorted(known)} "
                "(check the spelling, or put component settings inside their block)"
            )
        kwargs = check_fields(data, cls, "")
        for name, hint in annotations_of(cls).items():  # advantage, eval, logging, …
            klass = config_class(hint)
            if klass is None or name not in kwargs:
                continue
            block = kwargs[name]
            if block is None:
                kwargs.pop(name)
                continue
            kwargs[name] = _typed_block(klass, block, name)
        return build_config(cls, kwargs)

    def slab_sizes(self) -> tuple[int, int]:
        """``(train devices, rollout devices)``: the data-parallel sizes of the two slabs
        (``layout=separate``: ``train_fraction`` of the devices train, the rest sample;
        ``colocate``: both are every device; with ``parallel.sequence_parallel_size`` > 1,
        trainside only, each is the device count over the SP size). The one place this
        arithmetic lives."""
        sp = self.parallel.sequence_parallel_size
        if sp > 1:  # trainside and colocated (validate refuses the rest): one slab
            return self.num_devices // sp, self.num_devices // sp
        if self.layout == "separate":
            train = round(self.num_devices * self.train_fraction)
            return train, self.num_devices - train
        return self.num_devices, self.num_devices


def _typed_block(klass: type, block: object, name: str) -> object:
    if not isinstance(block, dict):
        raise ConfigError(f"{name} must be a mapping of its keys, got {block!r}")
    known = {f.name for f in dataclasses.fields(klass)}
    unknown = sorted(set(block) - known)
    if unknown:
        raise ConfigError(f"{name}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    return build_config(klass, check_fields(block, klass, name))
