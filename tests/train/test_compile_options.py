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
