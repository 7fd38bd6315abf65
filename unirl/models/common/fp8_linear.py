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
on entry (never silently). The weight cache lives for one context (one rollout) and is keyed
by each weight's identity, ``data_ptr`` and ``_version``, so an in-place update (an optimizer
step, ``load_state_dict``) or a moved / re-gathered weight is re-quantized.

The active context is process-global (one sampler per process on a trainside worker); a
second ``fp8_sampling`` while one is open is refused.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

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


@dataclass
class _QuantizedWeight:
    fingerprint: tuple[object, ...]
    w_q: torch.Tensor  # [N, K] float8_e4m3fn
    scale: torch.Tensor  # [1, N] fp32


def _fingerprint(weights: Sequence[torch.Tensor]) -> tuple[object, ...]:
    return tuple((w.data_ptr(), w._version, tuple(w.shape), w.device) for w in weights)


@dataclass
class Fp8Session:
    """The open ``fp8_sampling`` context: the quantized weights of this rollout and counters
    (``matmuls``: FP8 matmuls run; ``quantized``: weights (re)quantized)."""

    layers: frozenset[int] = frozenset()  # ids of the swapped nn.Linear modules
    matmuls: int = 0
    quantized: int = 0
    _weights: dict[tuple[int, ...], _QuantizedWeight] = field(default_factory=dict)

    def covers(self, layers: Sequence[nn.Module]) -> bool:
        """Whether every one of ``layers`` runs FP8 in this context (swapped, frozen base)."""
        return all(id(layer) in self.layers for layer in layers)

    def weight(self, weights: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_q[N, K], scale[1, N])`` of ``cat(weights)``, quantized once and re-quantized
        when any weight's storage or version changes."""
        key = tuple(id(w) for w in weights)
        fingerprint = _fingerprint(weights)
        cached = self._weights.get(key)
        if cached is None or cached.fingerprint != fingerprint:
            with torch.no_grad():
                parts = [quantize_rows(w.detach()) for w in weights]
                w_q = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
                scale = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
            cached = _QuantizedWeight(fingerprint, w_q, scale.reshape(1, -1).contiguous())
            self._weights[key] = cached
            self.quantized += 1
        return cached.w_q, cached.scale

    def project(
        self, x: torch.Tensor, layers: Sequence[nn.Linear], out_dtype: torch.dtype
    ) -> torch.Tensor:
        """``cat([x @ W_i^T for each layer], -1)`` in FP8, without biases, as ``out_dtype``;
        ``x[..., K]``."""
        w_q, w_scale = self.weight([layer.weight for layer in layers])
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] == 0:
            return x.new_zeros((*x.shape[:-1], w_q.shape[0]), dtype=out_dtype)
        x_q, x_scale = quantize_rows(rows)
        self.matmuls += 1
        out = scaled_matmul(x_q, x_scale, w_q, w_scale)
        return out.reshape(*x.shape[:-1], w_q.shape[0]).to(out_dtype)


def linear_out_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear`` would return for ``x`` here (autocast's, else ``x``'s)."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def active_session(layers: Sequence[nn.Module]) -> Fp8Session | None:
    """The open session when ``layers`` should run FP8 now: no grad, context open, every layer
    swapped, and ``x`` with a token dimension (the caller checks that)."""
    session = _ACTIVE
    if session is None or torch.is_grad_enabled() or not session.covers(layers):
        return None
    return session


class Fp8SamplingLinear(nn.Linear):
    """The class an eligible ``nn.Linear`` takes while ``fp8_sampling`` is open (the same
    module, parameters and state-dict keys; only ``forward`` differs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        session = active_session((self,)) if x.dim() >= 3 else None
        if session is None:
            return F.linear(x, self.weight, self.bias)
        out = session.project(x, (self,), linear_out_dtype(x))
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
    for layer in layers:
        layer.__class__ = Fp8SamplingLinear
    _ACTIVE = session
    try:
        yield session
    finally:
        _ACTIVE = None
        for layer in layers:
            layer.__class__ = nn.Linear
