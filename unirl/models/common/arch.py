"""What every family's ``<family>-arch`` preset does alike, written once.

An arch preset is random weights at a released model's shapes, built in memory on the
target device (never saved): speed does not depend on the weights' values, so it measures
what a real checkpoint would cost without downloading one. A family declares its shapes in
an :class:`ArchSpec` subclass (plain dicts, as in the released ``config.json`` files) and
builds its modules with :func:`build_seeded` (each module seeded, directly on the device, in
its own dtype); :func:`count_params_on_meta` counts parameters without allocating.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from unirl.models.common.config_dict import ConfigDict

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ModuleFactory = Callable[[], torch.nn.Module]  # a module constructor


@dataclass(kw_only=True, frozen=True)
class ArchSpec:
    """Configs of one architecture preset: the ``transformer`` and ``vae`` configs every
    family has (what ``ModelSources.architecture_configs`` reads) and the scheduler's; a
    family's subclass adds its text encoders (and sets its scheduler default)."""

    name: str
    transformer: ConfigDict
    vae: ConfigDict
    scheduler: ConfigDict = field(default_factory=dict)


@contextlib.contextmanager
def built_as(seed: int, device: torch.device, dtype: torch.dtype | None = None) -> Iterator[None]:
    """Seeded construction directly on ``device``, in ``dtype`` (None: the current default
    dtype); the global RNG and the default dtype are restored afterwards."""
    previous = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        if dtype is not None:
            torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                yield
        finally:
            torch.set_default_dtype(previous)


def build_seeded(
    parts: Sequence[tuple[str, ModuleFactory, torch.dtype]],
    *,
    device: torch.device,
    seed: int,
) -> dict[str, torch.nn.Module]:
    """``{name: module}`` in eval mode: part ``i`` built by its factory with seed ``seed + i``
    directly on ``device`` in its dtype (a 20 B-parameter transformer never exists in fp32)."""
    modules: dict[str, torch.nn.Module] = {}
    for offset, (name, factory, dtype) in enumerate(parts):
        with built_as(seed + offset, device, dtype):
            modules[name] = factory().eval()
    return modules


SpecT = TypeVar("SpecT", bound=ArchSpec)


@dataclass(frozen=True, kw_only=True)
class SingleEncoderArch(Generic[SpecT]):
    """How a family with one transformer, one VAE and one text encoder (Qwen-Image, FLUX.2,
    Z-Image) builds the modules of its arch specs: constructors of the spec's modules and of
    the tokenizer (the tiny preset's, valid in the real vocabulary)."""

    transformer: Callable[[SpecT], torch.nn.Module]
    vae: Callable[[SpecT], torch.nn.Module]
    text_encoder: Callable[
        [SpecT, int | None], torch.nn.Module
    ]  # (spec, pad_token_id; None on meta)
    tokenizer: Callable[[], PreTrainedTokenizerBase]

    def count_params(self, spec: SpecT) -> dict[str, int]:
        """Parameter counts of the transformer and the text encoder, built on the meta device
        (no allocation)."""
        return count_params_on_meta(
            {
                "transformer": lambda: self.transformer(spec),
                "text_encoder": lambda: self.text_encoder(spec, None),
            }
        )

    def build(
        self,
        spec: SpecT,
        *,
        device: torch.device,
        dtype: torch.dtype,
        text_encoder_dtype: torch.dtype,
        vae_dtype: torch.dtype,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Random-init modules of ``spec`` on ``device``, each built in its own dtype
        (:func:`build_seeded`: transformer, VAE, text encoder), the tokenizer and the spec's
        scheduler config."""
        tokenizer = self.tokenizer()
        modules = build_seeded(
            [
                ("transformer", lambda: self.transformer(spec), dtype),
                ("vae", lambda: self.vae(spec), vae_dtype),
                (
                    "text_encoder",
                    lambda: self.text_encoder(spec, tokenizer.pad_token_id),
                    text_encoder_dtype,
                ),
            ],
            device=device,
            seed=seed,
        )
        return {**modules, "tokenizer": tokenizer, "scheduler_config": dict(spec.scheduler)}


def model_from_config(model_class: Any, config: Mapping[str, Any]) -> torch.nn.Module:
    """``model_class.from_config`` of a ``config.json`` read as a dict (its private keys,
    ``_class_name`` and the like, dropped): a module from an architecture, no weights."""
    return model_class.from_config({k: v for k, v in config.items() if not k.startswith("_")})


def count_params_on_meta(factories: Mapping[str, ModuleFactory]) -> dict[str, int]:
    """Parameter count of each module, built on the meta device (no allocation)."""
    with torch.device("meta"):
        return {
            name: sum(p.numel() for p in factory().parameters())
            for name, factory in factories.items()
        }
