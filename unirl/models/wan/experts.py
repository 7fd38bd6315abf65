"""Wan's experts as one module, and the split of a two-expert LoRA export into diffusers' form.

Wan 2.1 has one transformer; Wan 2.2 (A14B) has two, ``transformer`` for high noise (σ at or
above ``boundary_ratio``) and ``transformer_2`` for low noise. :class:`WanExperts` holds them
under those names. When both train it is the module the training backend wraps (LoRA on both,
one optimizer, FSDP over every block of both), so the adapter's parameter names start with
``transformer.`` or ``transformer_2.``; :func:`split_expert_lora` turns that export into the
two folders diffusers loads, ``pipe.load_lora_weights(folder / "transformer")`` and
``pipe.load_lora_weights(folder / "transformer_2", load_into_transformer_2=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

EXPERT_NAMES = ("transformer", "transformer_2")
DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"


class WanExperts(torch.nn.Module):
    """``transformer`` (high noise) and, for two-expert models, ``transformer_2`` (low noise).

    ``experts(name, **kwargs)`` runs the expert ``name``. The bundle calls through the
    container when both experts train: the backend then wraps it as one FSDP root, whose
    hooks gather the parameters outside the blocks (patch embedding, condition embedder,
    output head) only when the root itself is called. Otherwise the bundle calls the expert
    directly.
    """

    def __init__(
        self, transformer: torch.nn.Module, transformer_2: torch.nn.Module | None = None
    ) -> None:
        super().__init__()
        self.transformer = transformer
        self.transformer_2 = transformer_2

    def experts(self) -> dict[str, torch.nn.Module]:
        """The experts present, by diffusers' component name."""
        return {
            name: module
            for name in EXPERT_NAMES
            if (module := getattr(self, name, None)) is not None
        }

    def enable_gradient_checkpointing(self) -> None:
        for module in self.experts().values():
            module.enable_gradient_checkpointing()  # type: ignore[operator]

    def forward(self, expert: str, *args: Any, **kwargs: Any) -> Any:
        """The expert ``expert`` (``transformer`` | ``transformer_2``) on the arguments."""
        module = getattr(self, expert, None) if expert in EXPERT_NAMES else None
        if module is None:
            raise ValueError(
                f"WanExperts has no expert {expert!r}; present: {sorted(self.experts())} (call "
                "bundle.predict_velocity, which picks the expert of each σ)"
            )
        # FSDP hooks the root's outputs for backward; an in-place op on a view would drop the
        # hook, so views (diffusers' last reshape) leave as their own tensors
        return tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) and t._base is not None else t,
            module(*args, **kwargs),
        )


def split_expert_lora(folder: str | Path) -> dict[str, Path]:
    """Split a LoRA export of :class:`WanExperts` (``folder/pytorch_lora_weights.safetensors``
    with keys ``transformer.transformer.*`` and ``transformer.transformer_2.*``) into
    ``folder/transformer`` and ``folder/transformer_2``, each a diffusers LoRA of one expert
    (keys ``transformer.*``, the export's metadata kept). Returns the folders written."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(folder)
    source = folder / DIFFUSERS_LORA_FILE
    if not source.is_file():
        raise FileNotFoundError(f"split_expert_lora: no {DIFFUSERS_LORA_FILE} in {folder}")
    with safe_open(str(source), framework="pt") as handle:
        metadata = handle.metadata() or {}
        state = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    written: dict[str, Path] = {}
    for name in EXPERT_NAMES:
        prefix = f"transformer.{name}."
        part = {
            "transformer." + k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)
        }
        if not part:
            continue
        out = folder / name
        out.mkdir(parents=True, exist_ok=True)
        save_file(part, str(out / DIFFUSERS_LORA_FILE), metadata=metadata)
        written[name] = out
    if not written:
        raise ValueError(
            f"split_expert_lora: {source} holds no 'transformer.transformer.' or "
            "'transformer.transformer_2.' keys; it is not an export of both Wan experts"
        )
    return written
