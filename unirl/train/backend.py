"""``FSDPBackend``: the role that owns the trainable module on each train rank.

Construction applies, in this fixed order (torchtitan style, one function per step):

1. LoRA injection through peft on the plain module (seeded draw), plus frozen copies
   (``lora.extra_adapters``) — before any wrapping, so FSDP shards the adapter with its block;
2. precision: trainable parameters in fp32 (the master copy the optimizer updates), the frozen
   base in ``param_dtype``; then the module moves to ``device``;
3. activation checkpointing per block (``fsdp.activation_checkpointing``);
4. FSDP2 ``fully_shard`` per block, then the root — only when torch.distributed is initialised
   with world > 1 (gloo on CPU works as well as NCCL); then, with ``sequence_parallel_size``
   > 1, the SP groups and the bundle's Ulysses hooks (``bundle.enable_sequence_parallel``);
5. AdamW over the trainable parameters only, the LR schedule, the EMA shadows.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import torch
from torch import nn

from unirl.config import require
from unirl.config.precision import parse_dtype
from unirl.train import backend_checkpoint
from unirl.train.ema import EMAConfig, ParamEMA
from unirl.train.export import (
    base_model_reference,
    merged_state,
    write_lora_export,
    write_pretrained,
)
from unirl.train.lora import (
    LoraConfig,
    adapter_active,
    adapter_names,
    adapter_parameter_names,
    adapters_disabled,
    add_frozen_adapter,
    cast_adapters,
    cast_parameters,
    copy_adapter,
    inject_lora,
    validate_targets,
)
from unirl.train.optim import (
    LRScheduleConfig,
    OptimizerConfig,
    build_lr_scheduler,
    build_optimizer,
    grad_norm_and_clip,
)
from unirl.train.parallel import (
    FSDPConfig,
    all_reduce_grads,
    apply_activation_checkpointing,
    apply_compile,
    apply_fsdp,
    broadcast_module,
    compile_dynamic_of,
    find_blocks,
    full_tensor,
    local_tensor,
    new_sequence_parallel_group,
    reshard,
    world_info,
)

if TYPE_CHECKING:
    from peft import LoraConfig as PeftLoraConfig
    from torch.distributed.fsdp import FSDPModule

    from unirl.train.parallel import SequenceParallelGroup

_C = TypeVar("_C")


class TrainedBundle(Protocol):
    """What the backend needs of the model bundle it trains (a ``models`` bundle): where the
    policy version is published. Its trainable module, LoRA and FSDP defaults and export hooks
    are read with ``getattr`` (``trainable_module`` / ``trainable_attr``,
    ``lora_default_targets``, ``block_class_names``, ``enable_sequence_parallel``,
    ``save_pretrained``, ``postprocess_lora_export``)."""

    policy_version: int | None


def _as_config(value: object, cls: type[_C], field: str) -> _C | None:
    """Accept the dataclass itself or a mapping of its fields (a Hydra block)."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls(**{str(k): v for k, v in value.items() if k != "_target_"})
    require(
        False,
        f"backend.{field} must be a {cls.__name__} or a mapping of its fields, got {type(value).__name__}",
    )
    return None


def bundle_trainable_attr(bundle: object) -> str:
    """Where ``bundle`` keeps its trainable module: its ``trainable_attr``, else the first of
    its ``trainable_module_names``, else ``transformer`` (what ``backend.trainable_attr: null``
    means)."""
    attr = getattr(bundle, "trainable_attr", None)
    if attr:
        return str(attr)
    names = getattr(bundle, "trainable_module_names", None)
    return str(names[0]) if names else "transformer"


def _resolve_device(device: str) -> torch.device:
    name = str(device)
    require(
        name in ("cpu", "cuda", "auto") or name.startswith("cuda:"),
        f"backend.device must be cpu, cuda, cuda:N or auto, got {device!r}",
    )
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        require(
            torch.cuda.is_available(),
            f"backend.device={device} but no CUDA device is visible; set backend.device=cpu",
        )
        return (
            torch.device("cuda", torch.cuda.current_device())
            if name == "cuda"
            else torch.device(name)
        )
    return torch.device("cpu")


class FSDPBackend:
    """Owns ``bundle.trainable_module``: LoRA / EMA injection, FSDP2, AdamW, LR schedule,
    clipping, offload, checkpoints and LoRA export. See the module docstring for the order.

    ``bundle``: any object with ``trainable_module`` (or the attribute ``trainable_attr``);
    the wrapped module is set back as ``bundle.<trainable_attr>``. ``trainable_attr=None``
    (the default) takes the bundle's own: its ``trainable_attr`` (Wan: ``transformer``,
    ``transformer_2`` or ``experts``), else the first of its ``trainable_module_names``, else
    ``transformer``; an explicit value wins. ``lora=None`` trains every parameter.
    ``optimizer``: the AdamW block (null: its defaults); ``lr_schedule``: the multiplier on
    ``optimizer.lr`` over optimizer steps (null: constant); ``ema``: an EMA of the trainable
    weights, which eval samples with and export writes beside the raw ones (null: none);
    ``fsdp``: data parallelism, sharding, compile and activation checkpointing (null: its
    defaults).
    ``device``: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA when visible).
    ``param_dtype`` is the storage dtype of frozen parameters (and, with LoRA, of floating
    buffers); trainable ones are always fp32. ``seed`` seeds the LoRA draw only.
    ``sequence_parallel_size``: Ulysses SP groups of that many consecutive ranks (the trainer
    passes ``parallel.sequence_parallel_size``; the ranks of a group hold the same rows); the
    bundle's transformer then splits each video's tokens over its group in every forward,
    sampling and training alike. 1: off.
    """

    def __init__(
        self,
        *,
        bundle: TrainedBundle,
        lora: LoraConfig | Mapping[str, object] | None = None,
        optimizer: OptimizerConfig | Mapping[str, object] | None = None,
        lr_schedule: LRScheduleConfig | Mapping[str, object] | None = None,
        ema: EMAConfig | Mapping[str, object] | None = None,
        fsdp: FSDPConfig | Mapping[str, object] | None = None,
        param_dtype: str = "bf16",
        device: str = "cpu",
        seed: int = 0,
        trainable_attr: str | None = None,
        sequence_parallel_size: int = 1,
    ) -> None:
        self.lora = _as_config(lora, LoraConfig, "lora")
        self.optimizer_config = (
            _as_config(optimizer, OptimizerConfig, "optimizer") or OptimizerConfig()
        )
        self.lr_schedule_config = (
            _as_config(lr_schedule, LRScheduleConfig, "lr_schedule") or LRScheduleConfig()
        )
        self.ema_config = _as_config(ema, EMAConfig, "ema")
        self.fsdp_config = _as_config(fsdp, FSDPConfig, "fsdp") or FSDPConfig()
        self.param_dtype = parse_dtype(param_dtype, "backend.param_dtype")
        self._device = _resolve_device(device)
        self.seed = int(seed)
        self.trainable_attr = (
            trainable_attr if trainable_attr is not None else bundle_trainable_attr(bundle)
        )
        self.rank, self.world_size = world_info()
        replicate = self.fsdp_config.data_parallel == "replicate"
        self.is_sharded = self.world_size > 1 and not replicate
        self.is_replicated = self.world_size > 1 and replicate
        self._grads_reduced = False
        require(
            not self.fsdp_config.cpu_offload or (self.is_sharded and self._device.type == "cuda"),
            "fsdp.cpu_offload needs a sharded CUDA run (torch.distributed with world > 1 and "
            "fsdp.data_parallel=shard); in one process call backend.offload() / onload() "
            "between phases instead",
        )
        module = self._module_of(bundle)

        # 1. LoRA through peft before wrapping (seeded), then the frozen copies.
        self._lora_targets: list[str] = []
        if self.lora is not None:
            self._lora_targets = list(
                self.lora.targets
                or self._bundle_default(bundle, "lora_default_targets", "lora.targets")
            )
            inject_lora(module, self.lora, self._lora_targets, seed=self.seed)
            for name in self.lora.extra_adapters:
                add_frozen_adapter(
                    module, self.lora, self._lora_targets, name, copy_from=self.lora.adapter_name
                )
        else:
            module.requires_grad_(True)

        # 2. fp32 master copy of what trains; the frozen base in param_dtype; then the device.
        cast_parameters(
            module,
            trainable_dtype=torch.float32,
            frozen_dtype=self.param_dtype,
            buffer_dtype=self.param_dtype if self.lora is not None else None,
        )
        if self.lora is not None:
            cast_adapters(module, torch.float32)  # frozen copies stay exact copies of the master
        module.to(self._device)

        # 3. activation checkpointing, 3b. regional torch.compile per block, 4. FSDP2 per
        # block then root (torchtitan's order: AC -> compile -> FSDP).
        blocks: list[nn.Module] = []
        if self.fsdp_config.activation_checkpointing or self.is_sharded or self.fsdp_config.compile:
            names = self.fsdp_config.block_class_names or list(
                self._bundle_default(bundle, "block_class_names", "fsdp.block_class_names")
            )
            blocks = find_blocks(module, names)
        if self.fsdp_config.activation_checkpointing:
            apply_activation_checkpointing(blocks)
        self.compile_dynamic = compile_dynamic_of(self.fsdp_config, bundle)
        # the family's knob against recompiles, for the compile watch's warning
        hint = getattr(bundle, "recompile_hint", None)
        self.recompile_hint: str | None = hint() if callable(hint) else None
        if self.fsdp_config.compile:
            apply_compile(blocks, self.fsdp_config.inductor_options, dynamic=self.compile_dynamic)
        if self.is_sharded:
            apply_fsdp(module, blocks, self.fsdp_config, self._device)
        elif self.is_replicated:
            broadcast_module(module)  # one starting point for every rank
        setattr(bundle, self.trainable_attr, module)
        self.module = module
        # 4b. sequence parallelism: the SP groups, then the family's hooks on the module
        self.sequence_parallel: SequenceParallelGroup | None = None
        self._sp_handles: list[object] = []  # whatever the bundle's hooks return
        if sequence_parallel_size > 1:
            enable = getattr(bundle, "enable_sequence_parallel", None)
            require(
                enable is not None,
                f"sequence_parallel_size={sequence_parallel_size}: the bundle "
                f"({type(bundle).__name__}) has no enable_sequence_parallel; set "
                "parallel.sequence_parallel_size=1",
            )
            assert enable is not None  # the require above refuses a bundle without it
            self.sequence_parallel = new_sequence_parallel_group(int(sequence_parallel_size))
            self._sp_handles = list(enable(self.sequence_parallel))
            if self.rank == 0:
                print(
                    f"[unirl] sequence parallelism: {self.world_size // sequence_parallel_size} "
                    f"group(s) of {sequence_parallel_size} consecutive ranks; "
                    f"{len(self._sp_handles)} trained module(s) split",
                    flush=True,
                )

        # 5. optimizer over the trainable parameters only; schedule; EMA.
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._trainable_names = [n for n, _ in named]
        self._trainable = [p for _, p in named]
        self.optimizer = build_optimizer(self._trainable, self.optimizer_config)
        self.scheduler = build_lr_scheduler(self.optimizer, self.lr_schedule_config)
        self._ema = (
            ParamEMA(self._trainable, self.ema_config) if self.ema_config is not None else None
        )
        self.step = 0
        # the version of the trained weights: bumped at every optimizer step and checkpoint
        # load, published as ``bundle.policy_version`` (None while another weight view is
        # swapped in), so a rollout's recorded unconditional velocity is reused only by the
        # policy that computed it
        self._bundle = bundle
        self.policy_version = 0
        self._publish_version(self.policy_version)
        self.moved_bytes: dict[str, int] = {"offload": 0, "onload": 0}

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """Before anything is built: every LoRA target names a layer of the model (read from
        its config on the meta device when the bundle can say so)."""
        lora = block.get("lora")
        if not isinstance(lora, Mapping):
            return
        bundle_block = getattr(recipe, "bundle", None)
        if not isinstance(bundle_block, Mapping) or "_target_" not in bundle_block:
            return
        from unirl.config.validate import locate

        bundle_cls = locate(str(bundle_block["_target_"]), "bundle")
        on_meta = getattr(bundle_cls, "trainable_on_meta", None)
        module = on_meta(dict(bundle_block)) if on_meta is not None else None
        if module is None:
            return  # checked when the bundle loads (inject_lora), before any rollout
        pipeline_block = getattr(recipe, "pipeline", None)
        if isinstance(pipeline_block, Mapping) and pipeline_block.get("value_head") is True:
            module.value_head = nn.Linear(1, 1, device="meta")  # the pipeline attaches one (PPO)
        targets = lora.get("targets") or getattr(bundle_cls, "lora_default_targets", None)
        if targets:
            validate_targets(module, [str(t) for t in targets], where="backend.lora.targets")

    # -- construction helpers ------------------------------------------------------------------

    def _module_of(self, bundle: object) -> nn.Module:
        module = getattr(bundle, "trainable_module", None)
        if module is None:
            module = getattr(bundle, self.trainable_attr, None)
        require(
            isinstance(module, nn.Module),
            f"backend.bundle ({type(bundle).__name__}) must expose the trainable nn.Module as "
            f"`trainable_module` or `{self.trainable_attr}` (backend.trainable_attr)",
        )
        assert isinstance(module, nn.Module)  # the require above refuses anything else
        return module

    @staticmethod
    def _bundle_default(bundle: object, attr: str, field: str) -> Iterable[str]:
        value: Iterable[str] | None = getattr(bundle, attr, None)
        require(
            value,
            f"{field} is null and the bundle ({type(bundle).__name__}) has no `{attr}`; set {field}",
        )
        assert value is not None  # the require above refuses it
        return value

    # -- what trains ---------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def has_lora(self) -> bool:
        return self.lora is not None

    @property
    def has_ema(self) -> bool:
        return self._ema is not None

    @property
    def ema(self) -> ParamEMA | None:
        """The EMA shadows of the trainable parameters (``None`` without ``backend.ema``)."""
        return self._ema

    @property
    def adapters(self) -> list[str]:
        """Every adapter on the module (sorted); empty without LoRA."""
        return adapter_names(self.module) if self.lora is not None else []

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer updates (DTensor shards under FSDP)."""
        return list(self._trainable)

    def named_trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return list(zip(self._trainable_names, self._trainable, strict=True))

    def num_trainable_params(self) -> int:
        """Global element count of the trainable parameters (unsharded)."""
        return int(sum(p.numel() for p in self._trainable))

    def full_trainable_state(self) -> dict[str, torch.Tensor]:
        """Unsharded copies of the trainable parameters on every rank (a collective)."""
        return {n: full_tensor(p) for n, p in self.named_trainable_parameters()}

    # -- one optimizer step --------------------------------------------------------------------

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._grads_reduced = False

    def _reduce_grads(self) -> None:
        """Replicate mode: average the gradients over ranks, once per optimizer step."""
        if self.is_replicated and not self._grads_reduced:
            all_reduce_grads(self._trainable)
            self._grads_reduced = True

    def clip_grad_norm(self, max_norm: float | None) -> float:
        """Total gradient norm across ranks, then clip to ``max_norm`` (``None``: measure only).
        inf / nan come back as they are and the gradients are not touched."""
        return float(self.grad_norm_clipped(max_norm))

    def grad_norm_clipped(self, max_norm: float | None) -> torch.Tensor:
        """:meth:`clip_grad_norm` without a host sync: the norm as a 0-dim device tensor."""
        require(
            max_norm is None or max_norm > 0,
            f"clip_grad_norm: max_norm must be > 0 or None, got {max_norm}",
        )
        self._reduce_grads()
        return grad_norm_and_clip(self._trainable, max_norm)

    def _publish_version(self, version: int | None) -> None:
        self._bundle.policy_version = version

    @contextlib.contextmanager
    def _other_weights(self) -> Iterator[None]:
        """Inside: the module holds a view other than the trained policy (no version)."""
        self._publish_version(None)
        try:
            yield
        finally:
            self._publish_version(self.policy_version)

    def bump_policy_version(self) -> int:
        """The trained weights changed: a new ``policy_version`` (returned)."""
        self.policy_version += 1
        self._publish_version(self.policy_version)
        return self.policy_version

    def optimizer_step(self) -> None:
        """AdamW step, LR schedule step, ``step += 1``, ``policy_version += 1``, EMA update."""
        self._reduce_grads()
        self.optimizer.step()
        self._grads_reduced = False
        self.scheduler.step()
        self.step += 1
        self.bump_policy_version()
        if self._ema is not None:
            self._ema.update(self.step)

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.optimizer.param_groups[0]["lr"])

    # -- weight views --------------------------------------------------------------------------

    def _require_lora(self, what: str) -> LoraConfig:
        require(
            self.lora is not None,
            f"{what} needs LoRA (backend.lora); this backend trains the full module",
        )
        assert self.lora is not None
        return self.lora

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """The frozen base model (every adapter bypassed) inside the block, without a copy."""
        self._require_lora("adapter_disabled")
        with self._other_weights(), adapters_disabled(self.module):
            yield

    @contextlib.contextmanager
    def set_active_adapter(self, name: str) -> Iterator[None]:
        """Run with adapter ``name`` (e.g. NFT's ``"old"``) instead of the trained one."""
        self._require_lora("set_active_adapter")
        with self._other_weights(), adapter_active(self.module, name):
            yield

    def add_adapter(
        self, name: str, *, copy_from: str | None = None, trainable: bool = False
    ) -> None:
        """Add a frozen adapter ``name`` holding a copy of ``copy_from`` (default: the trained
        adapter). Under FSDP list it in ``lora.extra_adapters`` instead: adapters must exist
        before wrapping."""
        lora = self._require_lora("add_adapter")
        require(
            not trainable,
            "add_adapter: only frozen adapters can be added; the optimizer trains lora.adapter_name",
        )
        require(
            not self.is_sharded,
            f"add_adapter({name!r}) after FSDP wrapping is not possible; list it in lora.extra_adapters",
        )
        add_frozen_adapter(
            self.module, lora, self._lora_targets, name, copy_from=copy_from or lora.adapter_name
        )
        cast_adapters(self.module, torch.float32)

    def sync_adapter(self, dst: str, *, src: str | None = None, decay: float = 0.0) -> None:
        """``dst ← decay·dst + (1 − decay)·src`` (``src`` defaults to the trained adapter);
        ``decay=0`` copies. Shard-local, no communication."""
        lora = self._require_lora("sync_adapter")
        if (src or lora.adapter_name) != lora.adapter_name and dst == lora.adapter_name:
            self.bump_policy_version()
        reshard(self.module)
        copy_adapter(self.module, src=src or lora.adapter_name, dst=dst, decay=decay)

    @contextlib.contextmanager
    def gathered_for_sampling(self) -> Iterator[None]:
        """Inside, with ``fsdp.gather_for_sampling`` on a sharded run: the first forward
        all-gathers the module's parameters (every block's and the root's own) and they stay
        gathered for every later forward (FSDP2's reshard-after-forward off); resharded on
        the way out, so nothing gathered outlives the block. Anything else: nothing changes."""
        if not (self.is_sharded and self.fsdp_config.gather_for_sampling):
            yield
            return
        module = cast("FSDPModule", self.module)  # apply_fsdp shards the root too
        module.set_reshard_after_forward(False, recurse=True)
        try:
            yield
        finally:
            module.set_reshard_after_forward(self.fsdp_config.reshard_after_forward, recurse=True)
            reshard(self.module)

    @contextlib.contextmanager
    def ema_weights(self) -> Iterator[None]:
        """The trainable parameters hold their EMA inside the block; restored exactly after."""
        require(self._ema is not None, "ema_weights needs backend.ema")
        assert self._ema is not None
        reshard(self.module)  # the next forward gathers the EMA values, not a stale copy
        with self._other_weights(), self._ema.swapped_in():
            try:
                yield
            finally:
                reshard(self.module)

    # -- memory --------------------------------------------------------------------------------

    def offload(self) -> int:
        """Parameters, buffers, optimizer state and EMA to CPU; returns (and records in
        ``moved_bytes['offload']``) the bytes that changed device (0 when already on CPU)."""
        return self._move_all(torch.device("cpu"), "offload")

    def onload(self) -> int:
        """Inverse of :meth:`offload`, back to ``device``."""
        return self._move_all(self._device, "onload")

    def _move_all(self, target: torch.device, what: str) -> int:
        reshard(self.module)
        moved = 0
        for t in [*self.module.parameters(), *self.module.buffers()]:
            local = local_tensor(t)
            if local.device != target:
                moved += local.numel() * local.element_size()
        self.module.to(target)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and value.dim() > 0 and value.device != target:
                    local = local_tensor(value)
                    moved += local.numel() * local.element_size()
                    state[key] = value.to(target)
        if self._ema is not None:
            moved += self._ema.to(target)
        self.moved_bytes[what] = moved
        return moved

    # -- checkpoints and export ----------------------------------------------------------------

    def save_checkpoint(
        self, path: str | Path, *, extra: Mapping[str, object] | None = None
    ) -> Path:
        """Write a checkpoint to ``path`` atomically (rank 0 writes; call on every rank).
        ``extra`` must be ``torch.load(weights_only=True)``-safe: tensors, numbers, strings,
        lists, tuples, dicts. See ``backend_checkpoint.py``."""
        return backend_checkpoint.save_checkpoint(self, path, extra=extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, object]:
        """Restore parameters, optimizer, schedule, EMA, step and RNG from ``path`` (rank 0
        reads, then broadcasts and shards); returns the saved ``extra`` on every rank."""
        extra = backend_checkpoint.load_checkpoint(self, path)
        self.bump_policy_version()
        return extra

    def adapter_state_dict(self, adapter: str | None = None) -> dict[str, torch.Tensor]:
        """Full tensors of one adapter under peft's names (adapter name removed, e.g.
        ``transformer_blocks.0.attn.to_q.lora_A.weight``) on every rank (a collective)."""
        from peft.functional import get_peft_model_state_dict

        lora = self._require_lora("adapter_state_dict")
        adapter = adapter or lora.adapter_name
        require(
            adapter in self.adapters,
            f"adapter {adapter!r} not on the module; present: {self.adapters}",
        )
        named = dict(self.module.named_parameters())
        full = {n: full_tensor(named[n]) for n in adapter_parameter_names(self.module, adapter)}
        return get_peft_model_state_dict(self.module, state_dict=full, adapter_name=adapter)

    def export_lora(self, path: str | Path, *, adapter: str | None = None) -> Path:
        """Write ``adapter`` (default: the trained one) for diffusers
        (``pytorch_lora_weights.safetensors``) and peft (``adapter_config.json`` +
        ``adapter_model.safetensors``), then lets the bundle reshape the folder for its
        pipeline (``postprocess_lora_export``). Call on every rank; rank 0 writes."""
        lora = self._require_lora("export_lora")
        adapter = adapter or lora.adapter_name
        state = self.adapter_state_dict(adapter)
        # set on the module by peft's injection
        peft_configs = cast("Mapping[str, PeftLoraConfig]", self.module.peft_config)
        peft_config = peft_configs[adapter]
        backend_checkpoint.run_on_rank0(
            self.rank, lambda: self._write_export(path, state, peft_config)
        )
        return Path(path)

    def export_pretrained(self, path: str | Path) -> Path:
        """The whole trained module — a full fine-tune, or the base with the trained LoRA
        fused in — as a ``save_pretrained`` folder with the bundle's tokenizer (or processor),
        which plain transformers loads; a bundle whose module is not a transformers model
        writes it by its own ``save_pretrained(path, state, write_pretrained)`` (the writer is
        passed down: ``models`` never imports ``train``). Call on every rank (the state is
        gathered); rank 0 writes."""
        adapter = self.lora.adapter_name if self.lora is not None else None
        state = merged_state(self.module, adapter, full_tensor)
        bundle = self._bundle
        own = getattr(bundle, "save_pretrained", None)

        def write() -> Path:
            if own is not None:
                return Path(own(path, state, write_pretrained))
            tokenizer = getattr(bundle, "processor", None) or getattr(bundle, "tokenizer", None)
            return write_pretrained(path, self.module, state, tokenizer)

        backend_checkpoint.run_on_rank0(self.rank, write)
        return Path(path)

    def _write_export(
        self, path: str | Path, state: dict[str, torch.Tensor], peft_config: PeftLoraConfig
    ) -> Path:
        """Rank 0: both formats, then the family's reshaping of the folder
        (``bundle.postprocess_lora_export``, when the bundle has one: Wan 2.2 training both
        experts splits the export into the per-expert folders diffusers loads)."""
        from transformers import PreTrainedModel

        peft_config = copy.copy(peft_config)  # the module's own config stays as it was
        peft_config.base_model_name_or_path = base_model_reference(self._bundle)
        if isinstance(self.module, PreTrainedModel) and self.module.can_generate():
            peft_config.task_type = "CAUSAL_LM"  # AutoPeftModelForCausalLM loads it
        folder = write_lora_export(path, state, peft_config)
        postprocess = getattr(self._bundle, "postprocess_lora_export", None)
        if postprocess is not None:
            postprocess(folder)
        return folder
