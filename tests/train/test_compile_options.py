"""``fsdp.inductor_options``: checked by name against ``torch._inductor.config`` when the
recipe is read, and set there before the blocks compile."""

from __future__ import annotations

import os

import pytest
import torch
import torch._inductor.config as inductor_config

from unirl.config.require import ConfigError
from unirl.train.parallel import FSDPConfig, apply_compile


def test_inductor_options_are_checked_by_name_and_applied_before_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = FSDPConfig(compile=True, inductor_options={"combo_kernels": True})
    assert cfg.inductor_options == {"combo_kernels": True}
    with pytest.raises(ConfigError, match=r"\['combo_kernel'\].*spelling"):
        FSDPConfig(compile=True, inductor_options={"combo_kernel": True})
    with pytest.raises(ConfigError, match=r"fsdp\.compile is false"):
        FSDPConfig(inductor_options={"combo_kernels": True})
    monkeypatch.setattr(inductor_config, "combo_kernels", False)  # restored after the test
    apply_compile([], cfg.inductor_options)
    assert inductor_config.combo_kernels is True


@pytest.mark.parametrize("dynamic", [False, None, True])
def test_compile_dynamic_reaches_every_block(
    monkeypatch: pytest.MonkeyPatch, dynamic: bool | None
) -> None:
    """``fsdp.compile_dynamic`` is the ``dynamic`` each block compiles with (``null``: dynamo's
    automatic dynamic shapes, what a text model's changing widths need)."""
    import torch

    seen: list[tuple[int, bool | None]] = []

    def record(self: torch.nn.Module, *args: object, **kwargs: object) -> None:
        seen.append((id(self), kwargs.get("dynamic", "missing")))  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.Module, "compile", record)
    blocks = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    cfg = FSDPConfig(compile=True, compile_dynamic=dynamic)
    apply_compile(blocks, None, dynamic=cfg.compile_dynamic)
    assert seen == [(id(blocks[0]), dynamic), (id(blocks[1]), dynamic)]


def test_compile_dynamic_family_is_the_bundles() -> None:
    """``family`` (the default) takes the bundle's ``compile_dynamic``: symbolic shapes for
    the families whose sequence length follows the prompt, fixed shapes for the others and
    for a bundle that declares nothing; an explicit value wins; anything else is refused."""
    from unirl.models.flux2 import Flux2KleinBundle
    from unirl.models.qwen_image import QwenImageBundle
    from unirl.models.sd3 import SD3Bundle
    from unirl.models.wan import WanBundle
    from unirl.models.z_image import ZImageBundle
    from unirl.train.parallel import compile_dynamic_of

    family = FSDPConfig(compile=True)
    assert family.compile_dynamic == "family"
    for bundle, dynamic in [
        (QwenImageBundle, True),
        (ZImageBundle, True),
        (SD3Bundle, False),
        (Flux2KleinBundle, False),
        (WanBundle, False),
        (object(), False),
    ]:
        assert compile_dynamic_of(family, bundle) is dynamic, bundle
    for explicit in (False, None, True):
        cfg = FSDPConfig(compile=True, compile_dynamic=explicit)
        assert compile_dynamic_of(cfg, QwenImageBundle) is explicit
    with pytest.raises(
        ConfigError, match=r"fsdp\.compile_dynamic must be true, false, null or family"
    ):
        FSDPConfig(compile=True, compile_dynamic="auto")


@pytest.mark.skipif(
    os.environ.get("UNIRL_SLOW") != "1", reason="compiles a tiny Qwen-Image on CPU (~30 s)"
)
def test_family_compile_keeps_one_graph_over_prompt_lengths() -> None:
    """The tiny Qwen-Image's blocks compiled as the family says: prompts of 7 to 85 text
    tokens run on the graphs the first prompt compiled (with ``dynamic=False`` instead, each
    new length added one: 1, 2, 3, 4, 5)."""
    from torch._dynamo.utils import counters

    from unirl.models.qwen_image import QwenImageBundle
    from unirl.train.parallel import compile_dynamic_of, find_blocks

    bundle = QwenImageBundle(path="tiny", device="cpu", dtype="fp32")
    bundle.load()
    blocks = find_blocks(bundle.transformer, QwenImageBundle.block_class_names)
    apply_compile(blocks, None, dynamic=compile_dynamic_of(FSDPConfig(compile=True), bundle))
    latents = torch.randn(1, *bundle.latent_shape(64, 64))
    graphs, lengths = [], set()
    for text in ["a cat", "a red house by the lake " * 3, "x " * 40, "a dog", "b " * 70]:
        conditions = bundle.encode_unique([text])
        lengths.add(conditions.prompt_embeds.shape[1])
        with torch.no_grad():
            bundle.predict_velocity(latents, torch.tensor([0.5]), conditions)
        graphs.append(counters["stats"]["unique_graphs"])
    assert len(lengths) == 5
    assert graphs[1:] == [graphs[0]] * 4
