"""FP8 (e4m3) matmuls for a frozen base's linear layers, in no-grad sampling forwards only.

``fp8_sampling(modules)`` is entered around a rollout's denoise loop (``bundle.fp8_sampling``;
``FlowMatchingPipeline.generate``). While it is open, every frozen ``nn.Linear`` of
``modules`` (peft's ``base_layer`` under a LoRA layer included; the LoRA ``A`` / ``B`` layers
excluded) computes ``x @ W^T`` as

    x ≈ x_q · s_x   (per token row: s_x[M, 1] = absmax(x_m) / 448, dynamic)
    W ≈ W_q · s_w   (per output row: s_w[N] = absmax(W_n) / 448, once per weight)
    y = torch._scaled_mm(x_q, W_q^T, s_x, s_w^T, out_dtype=bf16) + bias

with ``x_q``, ``W_q`` in ``float8_e4m3fn``. SD3's fused q / k / v projections
(``fused_linear.fused_projections``) take the same path over the concatenated weights (the
per-row scales of a concatenation are the concatenation of the per-row scales); a LoRA ``A``
riding in that matmul is computed beside it in the base dtype.

Where it applies: only when ``torch.is_grad_enabled()`` is False and the context is open, and
only for inputs with a token dimension (``x.dim() >= 3``): the per-sample vectors (timestep /
pooled-text embeddings, AdaLN modulation: one row per sample) stay in the base precision, as
FP8 buys no time there and their error would reach every token. Training forwards and the
π_old replay never enter the context, so they run in bf16 bit for bit as without it. Outside
the context the layers are plain ``nn.Linear`` again (their class is swapped back).

Devices: CUDA needs compute capability >= 8.9 (Ada / Hopper float8 tensor cores) and a
working rowwise ``_scaled_mm`` (probed once per device on entry). On CPU, the installed
torch (2.13) runs ``torch._scaled_mm`` itself with rowwise scales, equal to the emulation
``(x_q·s_x) @ (W_q·s_w)^T`` in float32 (tested), so CPU runs the same code as CUDA, up to
accumulation order. The relative error of one matmul against fp32 is ~3-4% (e4m3 keeps 3
mantissa bits; ``tests/models/test_fp8_linear.py`` pins the measured figure).

Shape constraints: CUDA's ``_scaled_mm`` needs ``in_features`` and ``out_features`` to be
multiples of 16. A layer that is not stays in its precision, with one warning per layer name
on entry (never silently).

Weights: entering the context quantizes every swapped layer's weight once and attaches it to
the layer (``fp8_weight`` / ``fp8_scale``, plain attributes removed on exit), so the forward
is tensor attributes and tensor ops only, which ``torch.compile`` traces without a graph break
and without a guard on any Python value of one layer: a compiled block gets one FP8 graph,
shared by every block of the model and reused by every later context. A fused group's
concatenated weight is concatenated on each call (nothing cached per group). Each context
re-quantizes on entry, so a weight changed between rollouts is picked up; inside an open
context, an eager forward also re-quantizes a weight whose ``data_ptr`` or ``_version`` moved
(an in-place update, a re-gathered weight), a compiled one does not look (rollouts do not
change weights).

The active context is process-global (one sampler per process on a trainside worker); a
second ``fp8_sampling`` while one is open is refused.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
MIN_CAPABILITY = (8, 9)
SHAPE_MULTIPLE = 16

_ACTIVE: Fp8Session | None = None
_WARNED: set[str] = set()
_PROBED: dict[torch.device, str | None] = {}  # device -> None (works) or the probe's error


def fp8_device_problem(device: torch.device) -> str | None:
    """Why ``device`` cannot run the FP8 sampling matmuls (None: it can). CUDA below compute
    capability 8.9 has no float8 tensor cores; CPU runs ``torch._scaled_mm`` (torch >= 2.13)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < MIN_CAPABILITY:
            return (
                f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}; "
                "float8 matmuls need 8.9 or newer (Ada, Hopper)"
            )
        return None
    if device.type == "cpu":
        return None
    return f"FP8 sampling matmuls are built for CUDA (and CPU for tests), not {device.type}"


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t_q[R, K] float8_e4m3fn, scale[R, 1] fp32)`` with ``t ≈ t_q · scale`` for
    ``t[R, K]``: each row's absmax maps to e4m3's largest value, 448."""
    t32 = t.float()
    scale = t32.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (t32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def scaled_matmul(
    x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale_row: torch.Tensor
) -> torch.Tensor:
    """``bf16[M, N] = (x_q[M, K] · x_scale[M, 1]) @ (w_q[N, K] · w_scale_row[1, N]^T)^T``,
    accumulated in fp32 by ``torch._scaled_mm`` (autocast off around it)."""
    with torch.autocast(device_type=x_q.device.type, enabled=False):
        return torch._scaled_mm(
            x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale_row, out_dtype=torch.bfloat16
        )


def _fingerprint(weight: torch.Tensor) -> tuple[object, ...]:
    return (weight.data_ptr(), weight._version, tuple(weight.shape), weight.device)


@dataclass
class Fp8Session:
    """The open ``fp8_sampling`` context and its counters, kept by eager forwards only (a
    compiled graph does not touch the session): ``matmuls``, FP8 matmuls run; ``quantized``,
    weights (re)quantized (every swapped layer once on entry, again when its weight changed)."""

    layers: frozenset[int] = frozenset()  # ids of the swapped nn.Linear modules
    matmuls: int = 0
    quantized: int = 0

    def covers(self, layers: Sequence[nn.Module]) -> bool:
        """Whether every one of ``layers`` runs FP8 in this context (swapped, frozen base)."""
        return all(id(layer) in self.layers for layer in layers)


# What a swapped layer carries while the context is open (removed on exit): its quantized
# weight ``fp8_weight[N, K]`` and scales ``fp8_scale[1, N]``, and the fingerprint of the weight
# they were made from.
_LAYER_ATTRS = ("fp8_weight", "fp8_scale", "_fp8_fingerprint")


def _quantize_layer(layer: nn.Linear) -> None:
    """Attach ``layer.weight`` quantized (``fp8_weight``, ``fp8_scale``) to ``layer``."""
    with torch.no_grad():
        w_q, scale = quantize_rows(layer.weight.detach())
    layer.fp8_weight = w_q
    layer.fp8_scale = scale.reshape(1, -1).contiguous()
    layer._fp8_fingerprint = _fingerprint(layer.weight)
    if _ACTIVE is not None:
        _ACTIVE.quantized += 1


def _layer_weight(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_q[N, K], scale[1, N])`` of ``layer``. An eager forward re-quantizes a weight that
    changed in place or moved since (``data_ptr`` / ``_version``); a compiled forward reads the
    attributes only (no Python-side lookup in the graph), so under ``torch.compile`` a weight
    changed while the context is open is re-quantized at the next context's entry."""
    if not torch.compiler.is_compiling() and layer._fp8_fingerprint != _fingerprint(layer.weight):
        _quantize_layer(layer)
    return layer.fp8_weight, layer.fp8_scale


def _group_weight(layers: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_q, scale)`` of ``cat(layer.weight for layer in layers)``: the concatenation of
    the layers' own (row-wise quantization commutes with concatenating rows), built on every
    call. The copy is the FP8 weight once (SD3.5-M's q / k / v: 7 MB, microseconds); a cache
    kept on the layers would put Python values into a compiled block's guards, and those
    differ per block (measured: a recompile per block up to dynamo's limit, then eager)."""
    parts = [_layer_weight(layer) for layer in layers]
    return torch.cat([w for w, _ in parts]), torch.cat([s for _, s in parts], dim=1)


def fp8_applies(x: torch.Tensor, layers: Sequence[nn.Module]) -> bool:
    """Whether ``layers`` run FP8 on ``x`` now: no grad, ``x`` with a token dimension, and every
    layer swapped (``fp8_sampling`` open). Type checks only: dynamo guards on them."""
    if torch.is_grad_enabled() or x.dim() < 3:
        return False
    return all(type(layer) is Fp8SamplingLinear for layer in layers)


def fp8_project(
    x: torch.Tensor, layers: Sequence[nn.Linear], out_dtype: torch.dtype
) -> torch.Tensor:
    """``cat([x @ W_i^T for each layer], -1)`` in FP8, without biases, as ``out_dtype``;
    ``x[..., K]``; the ``layers`` are swapped (:func:`fp8_applies`)."""
    w_q, w_scale = _layer_weight(layers[0]) if len(layers) == 1 else _group_weight(layers)
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 0:
        return x.new_zeros((*x.shape[:-1], w_q.shape[0]), dtype=out_dtype)
    x_q, x_scale = quantize_rows(rows)
    if not torch.compiler.is_compiling() and _ACTIVE is not None:
        _ACTIVE.matmuls += 1
    out = scaled_matmul(x_q, x_scale, w_q, w_scale)
    return out.reshape(*x.shape[:-1], w_q.shape[0]).to(out_dtype)


def linear_out_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear`` would return for ``x`` here (autocast's, else ``x``'s)."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class Fp8SamplingLinear(nn.Linear):
    """The class an eligible ``nn.Linear`` takes while ``fp8_sampling`` is open (the same
    module, parameters and state-dict keys; only ``forward`` differs, and the quantized
    weight rides along as plain attributes). The forward reads only the module's own
    attributes and tensor ops, so ``torch.compile`` traces it without a graph break."""

    fp8_weight: torch.Tensor
    fp8_scale: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dim() < 3:
            return F.linear(x, self.weight, self.bias)
        out = fp8_project(x, (self,), linear_out_dtype(x))
        return out if self.bias is None else out + self.bias.to(out.dtype)


def _is_lora_part(name: str) -> bool:
    """A module under peft's ``lora_A`` / ``lora_B`` / ``lora_embedding_*`` dicts."""
    return any(part.startswith("lora_") for part in name.split("."))


def _eligible_linears(modules: Iterable[nn.Module]) -> list[nn.Linear]:
    found: list[nn.Linear] = []
    for root in modules:
        for name, module in root.named_modules():
            if type(module) is not nn.Linear or _is_lora_part(name):
                continue
            if module.weight.requires_grad:  # trained weights are not the frozen base
                continue
            if module.in_features % SHAPE_MULTIPLE or module.out_features % SHAPE_MULTIPLE:
                key = f"{type(root).__name__}.{name}"
                if key not in _WARNED:
                    _WARNED.add(key)
                    warnings.warn(
                        f"[unirl] bundle.fp8_sampling: {key} is [{module.out_features}, "
                        f"{module.in_features}], not multiples of {SHAPE_MULTIPLE} (what "
                        "torch._scaled_mm takes); it samples in its own precision",
                        stacklevel=3,
                    )
                continue
            found.append(module)
    return found


def _probe(device: torch.device) -> str | None:
    """Run one tiny rowwise ``_scaled_mm`` on ``device`` once; its error, or None."""
    if device not in _PROBED:
        try:
            x = torch.ones(16, 16, device=device)
            x_q, s = quantize_rows(x)
            scaled_matmul(x_q, s, x_q, s.reshape(1, -1).contiguous())
            _PROBED[device] = None
        except (RuntimeError, NotImplementedError) as exc:
            _PROBED[device] = str(exc).splitlines()[0]
    return _PROBED[device]


@contextlib.contextmanager
def fp8_sampling(modules: Iterable[nn.Module], device: torch.device) -> Iterator[Fp8Session]:
    """Run the frozen linear layers of ``modules`` in FP8 for no-grad forwards until exit.

    Refuses (``RuntimeError``, naming ``bundle.fp8_sampling``) a device that cannot (see
    :func:`fp8_device_problem`, then a probe matmul), modules with no frozen ``nn.Linear``
    (full fine-tuning: nothing is a frozen base), and nesting.
    """
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("fp8_sampling is already open; it does not nest")
    problem = fp8_device_problem(device) or _probe(device)
    if problem is not None:
        raise RuntimeError(f"bundle.fp8_sampling=true: {problem}; set bundle.fp8_sampling=false")
    modules = list(modules)
    layers = _eligible_linears(modules)
    if not layers:
        names = ", ".join(type(m).__name__ for m in modules)
        raise RuntimeError(
            f"bundle.fp8_sampling=true found no frozen nn.Linear in {names} (it quantizes a "
            "frozen base under LoRA; full fine-tuning trains every weight); set "
            "bundle.fp8_sampling=false"
        )
    session = Fp8Session(layers=frozenset(id(layer) for layer in layers))
    _ACTIVE = session
    try:
        for layer in layers:
            _quantize_layer(layer)
            layer.__class__ = Fp8SamplingLinear
        yield session
    finally:
        _ACTIVE = None
        for layer in layers:
            layer.__class__ = nn.Linear
            for name in _LAYER_ATTRS:
                layer.__dict__.pop(name, None)
