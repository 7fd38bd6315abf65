"""``fsdp.inductor_options``: checked by name against ``torch._inductor.config`` when the
recipe is read, and set there before the blocks compile."""

from __future__ import annotations

import pytest
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
