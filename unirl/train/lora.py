"""LoRA through peft on any ``nn.Module``: config, target validation, seeded injection, and the
adapter switches the algorithms need (disable for the frozen reference, activate another adapter,
copy / blend one adapter into another).

Everything here runs on the injected module itself (``peft.functional``), never on a
``PeftModel`` wrapper, so FSDP2 can shard the same module afterwards and parameter names stay
``<module path>.lora_A.<adapter>.weight``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from unirl.config import require
from unirl.config.typecheck import NonNegativeFloat, PositiveFloat, PositiveInt
from unirl.train.parallel import local_tensor

if TYPE_CHECKING:
    import peft
    from peft.tuners.tuners_utils import BaseTunerLayer

_ADAPTER_DICT_NAMES = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


@dataclass(kw_only=True)
class LoraConfig:
    """One trained LoRA adapter (plus optional frozen copies) on the trainable module.

    ``targets`` are module-name suffixes (``"to_q"`` matches ``...attn.to_q``; ``"to_out.0"``
    matches ``...attn.to_out.0``); ``None`` takes the bundle's ``lora_default_targets``.
    ``init_lora_weights``: ``"gaussian"`` (A ~ N(0, 1/rank), B = 0) or ``True`` (peft's default,
    Kaiming-uniform A, B = 0); either way the adapter starts as the identity. The draw is seeded
    by the backend's ``seed``. ``extra_adapters`` are frozen copies of the trained adapter made
    before FSDP wrapping (DiffusionNFT's ``"old"`` policy).
    """

    rank: PositiveInt = 32
    """LoRA rank r (A is ``[r, d_in]``, B is ``[d_out, r]``)."""
    alpha: PositiveFloat = 64.0
    """LoRA alpha: the update is scaled by ``alpha / rank``."""
    dropout: NonNegativeFloat = 0.0
    """Dropout probability on the adapter's input (peft's ``lora_dropout``), in [0, 1)."""
    targets: list[str] | None = None
    init_lora_weights: str | bool = "gaussian"
    adapter_name: str = "default"
    """peft name of the trained adapter."""
    extra_adapters: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        require(self.rank >= 1, f"lora.rank must be >= 1, got {self.rank}")
        require(self.alpha > 0, f"lora.alpha must be > 0, got {self.alpha}")
        require(0.0 <= self.dropout < 1.0, f"lora.dropout must be in [0, 1), got {self.dropout}")
        if self.targets is not None:
            self.targets = [str(t) for t in self.targets]
            require(
                bool(self.targets),
                "lora.targets must list module-name suffixes (or be null for the bundle's)",
            )
        require(
            self.init_lora_weights in ("gaussian", True),
            f"lora.init_lora_weights must be 'gaussian' or true, got {self.init_lora_weights!r}",
        )
        self.extra_adapters = [str(a) for a in self.extra_adapters]
        for name in (self.adapter_name, *self.extra_adapters):
            require(
                bool(name) and "." not in name,
                f"lora adapter name {name!r} must be non-empty without dots",
            )
        require(
            len(set(self.extra_adapters)) == len(self.extra_adapters)
            and self.adapter_name not in self.extra_adapters,
            f"lora.extra_adapters {self.extra_adapters} must be unique and differ from "
            f"lora.adapter_name={self.adapter_name!r}",
        )

    def to_peft(self, targets: Sequence[str]) -> peft.LoraConfig:
        """The equivalent ``peft.LoraConfig`` with ``targets`` resolved."""
        import peft

        return peft.LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # peft annotates int; a float scales too
            lora_dropout=self.dropout,
            target_modules=list(targets),
            init_lora_weights=self.init_lora_weights,  # type: ignore[arg-type]  # peft checks the name
        )


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


_LORA_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)


def _target_suffix(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def validate_targets(
    module: nn.Module, targets: Sequence[str], *, where: str = "lora.targets"
) -> None:
    """Every target must match at least one layer LoRA can adapt (``Linear``, ``Conv``,
    ``Embedding``), as peft matches list targets; a target that names only containers (an
    attention block, a ``ModuleList``) or nothing is refused before an adapter is built.

    Raises ``ConfigError`` naming the unmatched targets and the layer names available.
    """
    layers = [n for n, m in module.named_modules() if n and isinstance(m, _LORA_LAYERS)]
    unmatched = [t for t in targets if not any(_matches(n, t) for n in layers)]
    if unmatched:
        available: list[str] = []
        for n in layers:
            suffix = _target_suffix(n)
            if suffix not in available:
                available.append(suffix)
        require(
            False,
            f"{where}: {unmatched} match no Linear / Conv / Embedding layer of "
            f"{type(module).__name__}, so the adapter would train nothing there; layer names "
            f"available as targets: {available[:40]}",
        )


def tuner_layers(module: nn.Module) -> list[BaseTunerLayer]:
    """The peft LoRA layers injected in ``module``."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in module.modules() if isinstance(m, BaseTunerLayer)]


def adapter_parameter_names(module: nn.Module, adapter: str | None = None) -> list[str]:
    """Names of LoRA parameters (of ``adapter``, or of every adapter), in module order."""
    out = []
    for name, _ in module.named_parameters():
        parts = name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part in _ADAPTER_DICT_NAMES and (adapter is None or parts[i + 1] == adapter):
                out.append(name)
                break
    return out


def inject_lora(module: nn.Module, cfg: LoraConfig, targets: Sequence[str], *, seed: int) -> None:
    """Freeze ``module`` and inject ``cfg.adapter_name`` on ``targets`` with a seeded draw.

    The global RNG is left untouched (``torch.random.fork_rng``).
    """
    from peft.functional import inject_adapter_in_model

    validate_targets(module, targets, where="backend.lora.targets")
    module.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(cfg.to_peft(targets), module, adapter_name=cfg.adapter_name)
    trainable = adapter_parameter_names(module, cfg.adapter_name)
    require(bool(trainable), f"peft injected no LoRA parameters for targets {list(targets)}")


def add_frozen_adapter(
    module: nn.Module, cfg: LoraConfig, targets: Sequence[str], name: str, copy_from: str
) -> None:
    """Add adapter ``name`` shaped like the others, copy ``copy_from``'s values into it, keep
    it frozen and the previously active adapter(s) active (peft would make the newcomer active
    and trainable). Only before FSDP wrapping."""
    from peft.functional import inject_adapter_in_model, set_adapter, set_requires_grad

    present = adapter_names(module)
    require(name not in present, f"adapter {name!r} already exists; present: {present}")
    require(
        copy_from in present,
        f"adapter {copy_from!r} to copy from is not on the module; present: {present}",
    )
    previous = active_adapters(module)
    with preserved_requires_grad(module), warnings.catch_warnings():
        # Several adapters on one module is the point here; peft warns about it.
        warnings.filterwarnings("ignore", message=".*multiple adapters.*")
        inject_adapter_in_model(cfg.to_peft(targets), module, adapter_name=name)
        set_adapter(module, previous)  # peft made the newcomer the active adapter
    set_requires_grad(module, name, requires_grad=False)
    copy_adapter(module, src=copy_from, dst=name, decay=0.0)


def adapter_names(module: nn.Module) -> list[str]:
    """Adapters present on ``module`` (sorted)."""
    names: set[str] = set()
    for layer in tuner_layers(module):
        for attr in _ADAPTER_DICT_NAMES:
            names.update(getattr(layer, attr, {}).keys())
    return sorted(names)


def active_adapters(module: nn.Module) -> list[str]:
    layers = tuner_layers(module)
    require(bool(layers), "the module has no LoRA layers")
    return list(layers[0].active_adapters)


def _adapter_tensors(entry: nn.Module | nn.Parameter) -> list[torch.Tensor]:
    return [entry] if isinstance(entry, nn.Parameter) else list(entry.parameters())


@torch.no_grad()
def copy_adapter(module: nn.Module, *, src: str, dst: str, decay: float = 0.0) -> None:
    """``dst ← decay·dst + (1 − decay)·src`` for every LoRA tensor; ``decay=0`` copies.

    Works shard by shard (both adapters are sharded the same way), no communication.
    """
    require(0.0 <= decay < 1.0, f"copy_adapter: decay must be in [0, 1), got {decay}")
    present = adapter_names(module)
    require(
        src in present and dst in present,
        f"copy_adapter: adapters {src!r}/{dst!r} not in {present}",
    )
    for layer in tuner_layers(module):
        for attr in _ADAPTER_DICT_NAMES:
            table = getattr(layer, attr, None)
            if table is None or src not in table:
                continue
            for a, b in zip(
                _adapter_tensors(table[src]), _adapter_tensors(table[dst]), strict=True
            ):
                la, lb = local_tensor(a), local_tensor(b)
                if decay == 0.0:
                    lb.copy_(la)
                else:
                    lb.mul_(decay).add_(la.to(lb.dtype), alpha=1.0 - decay)


@contextlib.contextmanager
def preserved_requires_grad(module: nn.Module) -> Iterator[Callable[[], None]]:
    """Restore every parameter's ``requires_grad`` on exit (peft's switches rewrite them);
    yields the restore function to call earlier as well."""
    flags = [(p, p.requires_grad) for p in module.parameters()]

    def restore() -> None:
        for p, flag in flags:
            if p.requires_grad != flag:
                p.requires_grad_(flag)

    try:
        yield restore
    finally:
        restore()


@contextlib.contextmanager
def adapters_disabled(module: nn.Module) -> Iterator[None]:
    """Run the frozen base: every LoRA layer bypasses its adapters (peft ``disable_adapter``
    semantics on the injected module). ``requires_grad`` flags are the same inside and after."""
    layers = tuner_layers(module)
    require(bool(layers), "adapter_disabled needs LoRA layers on the module")
    was_disabled = [layer.disable_adapters for layer in layers]
    with preserved_requires_grad(module) as restore:
        for layer in layers:
            layer.enable_adapters(False)
        restore()  # peft froze the adapters; what trains is the optimizer's business
        try:
            yield
        finally:
            for layer, disabled in zip(layers, was_disabled, strict=True):
                layer.enable_adapters(not disabled)


@contextlib.contextmanager
def adapter_active(module: nn.Module, name: str) -> Iterator[None]:
    """Make ``name`` the only active adapter inside the block; restores the previous active
    adapter(s) on exit. ``requires_grad`` flags are the same inside and after."""
    from peft.functional import set_adapter

    present = adapter_names(module)
    require(name in present, f"adapter {name!r} not on the module; present: {present}")
    previous = active_adapters(module)
    with preserved_requires_grad(module) as restore:
        set_adapter(module, name, inference_mode=True)
        restore()
        try:
            yield
        finally:
            set_adapter(module, previous, inference_mode=True)


def cast_parameters(
    module: nn.Module,
    *,
    trainable_dtype: torch.dtype,
    frozen_dtype: torch.dtype,
    buffer_dtype: torch.dtype | None,
) -> None:
    """Trainable parameters to ``trainable_dtype`` (fp32 master), frozen ones to
    ``frozen_dtype``, floating buffers to ``buffer_dtype`` (``None``: as they are).
    Only before wrapping (plain tensors)."""
    for p in module.parameters():
        dtype = trainable_dtype if p.requires_grad else frozen_dtype
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    if buffer_dtype is not None:
        for b in module.buffers():
            if b.is_floating_point() and b.dtype != buffer_dtype:
                b.data = b.data.to(buffer_dtype)


def cast_adapters(module: nn.Module, dtype: torch.dtype) -> None:
    """Every LoRA parameter (all adapters) to ``dtype``; peft creates them in the base's dtype."""
    names = set(adapter_parameter_names(module))
    for name, p in module.named_parameters():
        if name in names and p.dtype != dtype:
            p.data = p.data.to(dtype)
