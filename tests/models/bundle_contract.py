"""Bundle checks every flow-matching family passes on its ``tiny`` preset, written once.

A family's bundle test module subclasses :class:`BundleContract` as
``Test<Family>BundleContract`` and fills in the hooks at the top; what is the family's own
(its config's bad fields, extra checks, the reference comparisons) stays in its module. On the
tiny preset, fp32 on CPU, the inherited tests prove:

- the bundle's constructor is its config taken whole (keyword-only fields with the config's
  defaults; a misspelt key and a non-config ``from_config`` argument are errors);
- ``check_config`` refuses an image size off the VAE x patch grid and a folder that is not
  the family's diffusers layout, and the default LoRA targets exist on the meta-built module;
- a hub id that is not cached fails fast offline with a message naming the presets;
- a Hydra ``_target_`` block builds it; offloaded frozen modules refuse to encode;
- the tiny decoder responds to latents strongly, smoothly and (optionally) monotonically.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from unirl.config import ConfigError
from unirl.models.common.presets import ModelSourceError


class BundleContract:
    """Subclass as ``Test<Family>BundleContract`` and fill in the hooks below."""

    # -- hooks ------------------------------------------------------------------------------

    bundle_class: ClassVar[type]
    # bundle fields set besides path / dtypes / device (e.g. max_sequence_length)
    bundle_fields: ClassVar[dict[str, Any]] = {}
    family_label: ClassVar[str]  # the family's ModelSources name ("Qwen-Image")
    arch_preset: ClassVar[str]  # its ``*-arch`` preset
    # the family's presets.resolve_model_source (set with staticmethod)
    resolve_model_source: ClassVar[Callable[[str], Any]]
    # the tiny decoder check: the per-sample latent dim holding the channels, the brightness
    # margin at ±2 along a unit latent direction, and whether a ±3 sweep must be monotone
    decoder_channel_dim: ClassVar[int] = 0
    decoder_margin: ClassVar[float] = 0.2
    decoder_monotone: ClassVar[bool] = False

    def make_bundle(self, **overrides: Any) -> Any:
        fields: dict[str, Any] = {
            "path": "tiny",
            "dtype": "fp32",
            "text_encoder_dtype": "fp32",
            "device": "cpu",
            **self.bundle_fields,
        }
        return self.bundle_class(**{**fields, **overrides})

    def check_built(self, built: Any) -> None:
        """Family checks on the bundle the Hydra block built (its ``bundle_fields`` set)."""

    # -- the contract ---------------------------------------------------------------------------

    def test_constructor_is_the_config_taken_whole(self) -> None:
        cls, config = self.bundle_class, self.bundle_class.config_class
        params = inspect.signature(cls.__init__).parameters
        kw = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
        assert kw == {f.name: f.default for f in dataclasses.fields(config)}
        with pytest.raises(TypeError):
            cls(path="tiny", dtpye="fp32")  # misspelt keys are errors
        with pytest.raises(TypeError, match=config.__name__):
            cls.from_config({"path": "tiny"})

    def test_check_config_refuses_sizes_and_foreign_folders(self, tmp_path: Any) -> None:
        cls = self.bundle_class
        recipe = type("Recipe", (), {"sampling": {"height": 72, "width": 64}})()
        with pytest.raises(ConfigError, match=r"sampling\.height=72 is not a multiple of 16"):
            cls.check_config({"path": "tiny"}, recipe)
        (tmp_path / "empty").mkdir()
        with pytest.raises(
            ConfigError, match=f"not a diffusers {re.escape(self.family_label)} layout"
        ):
            cls.check_config({"path": str(tmp_path / "empty")}, recipe)
        from unirl.train.lora import validate_targets

        module = cls.trainable_on_meta({"path": "tiny"})
        validate_targets(module, list(cls.lora_default_targets), where="lora.targets")

    def test_hub_id_offline_fails_fast_naming_the_presets(self, monkeypatch: Any) -> None:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        start = time.perf_counter()
        with pytest.raises(ModelSourceError) as info:
            type(self).resolve_model_source("unirl-tests/definitely-not-cached-model")
        assert time.perf_counter() - start < 5.0
        needles = ("path=tiny", f"toy {self.family_label}", self.arch_preset, "PRETRAINED_MODEL")
        for needle in (*needles, "HF_HUB_OFFLINE=1"):
            assert needle in str(info.value), needle

    def test_offload_and_hydra_block(self) -> None:
        hydra = pytest.importorskip("hydra.utils", reason="hydra-core not installed")
        cls = self.bundle_class
        block = {
            "_target_": f"{cls.__module__}.{cls.__qualname__}",
            "path": "tiny",
            "dtype": "fp32",
            "text_encoder_dtype": "fp32",
            "device": "cpu",
            **self.bundle_fields,
        }
        built = hydra.instantiate(block, _convert_="object")
        assert isinstance(built, cls)
        assert all(getattr(built.config, k) == v for k, v in self.bundle_fields.items())
        self.check_built(built)
        built.offload()
        with pytest.raises(RuntimeError, match="onload"):
            built.encode_prompts(["a cat"])
        built.onload()
        assert len(built.encode_prompts(["a cat"])) == 1
        assert built.trainable_module is built.transformer

    @torch.no_grad()
    def test_tiny_decoder_responds_strongly_and_smoothly(self) -> None:
        """The random-decoder trap: decoded brightness must move with the latents."""
        bundle = self.make_bundle()
        gen = torch.Generator().manual_seed(0)
        latents = torch.randn(16, *bundle.latent_shape(64, 64), generator=gen)
        pixels = bundle.decode(latents)
        assert pixels.std(dim=0).mean() > 0.15
        lo, hi = pixels.flatten().quantile(torch.tensor([0.05, 0.95])).tolist()
        assert hi - lo > 0.6 and abs(pixels.mean().item() - 0.5) < 0.1, (lo, hi)
        shape = [1] * (latents.ndim - 1)
        shape[self.decoder_channel_dim] = latents.shape[1:][self.decoder_channel_dim]
        shift = torch.zeros(shape, requires_grad=True)
        with torch.enable_grad():
            bundle.decode(latents[:4] + shift).mean().backward()
        direction = shift.grad / shift.grad.norm()
        a = torch.randn(16, generator=gen)
        # per-sample mean brightness (images [B, 3, H, W], videos [B, T, 3, H, W])
        along = a.view(-1, *([1] * len(shape))) * direction
        moved = bundle.decode(latents + along).flatten(1).mean(1)
        base = pixels.flatten(1).mean(1)
        assert torch.corrcoef(torch.stack([a, moved - base]))[0, 1] > 0.9
        if self.decoder_monotone:
            sweep = torch.stack(
                [
                    bundle.decode(latents[:8] + t * direction).mean()
                    for t in torch.linspace(-3, 3, 7)
                ]
            )
            assert bool((sweep.diff() > 0).all()), sweep  # monotone along the direction
            darker, brighter = sweep[1], sweep[5]  # t = -2, +2
        else:
            darker, brighter = (
                bundle.decode(latents[:8] + t * direction).mean() for t in (-2.0, 2.0)
            )
        margin = self.decoder_margin
        assert darker + margin < pixels[:8].mean() < brighter - margin, (darker, brighter)
