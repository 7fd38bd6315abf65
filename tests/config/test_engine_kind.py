"""``engine_kind`` reads the kind the rollout class declares, never its ``_target_`` spelling."""

from __future__ import annotations

import pytest

import unirl.rollout
from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.run import RunConfig
from unirl.config.validate import ENGINE_KINDS, engine_kind, validate


class DedicatedLookingEngine:
    """Its name holds "dedicated"; its declaration says trainside."""

    engine_kind = "trainside"


class UndeclaredEngine:
    """No ``engine_kind`` at all."""


class MisdeclaredEngine:
    engine_kind = "remote"


def _cfg(target: str) -> RunConfig:
    data = compose_recipe("diffusion/sd3_tiny_trainside", [f"rollout._target_={target}"])
    return RunConfig.from_dict(data)


def test_every_engine_declares_its_kind() -> None:
    kinds = {name: getattr(unirl.rollout, name).engine_kind for name in unirl.rollout.__all__}
    assert kinds == {
        "DedicatedEngine": "dedicated",
        "SGLangEngine": "sglang",
        "TrainsideEngine": "trainside",
        "VllmOmniEngine": "vllm_omni",
    }
    assert set(kinds.values()) == set(ENGINE_KINDS)


def test_the_declaration_decides_not_the_target_name() -> None:
    assert engine_kind(_cfg(f"{__name__}.DedicatedLookingEngine")) == "trainside"
    assert engine_kind(_cfg("unirl.rollout.TrainsideEngine")) == "trainside"


@pytest.mark.parametrize(
    ("cls", "declared"), [("UndeclaredEngine", "None"), ("MisdeclaredEngine", "'remote'")]
)
def test_a_class_without_a_known_kind_is_refused(cls: str, declared: str) -> None:
    target = f"{__name__}.{cls}"
    with pytest.raises(ConfigError) as info:
        validate(compose_recipe("diffusion/sd3_tiny_trainside", [f"rollout._target_={target}"]))
    message = str(info.value)
    assert message.startswith(f"rollout._target_={target} declares engine_kind={declared}; ")
    assert "trainside, dedicated, sglang, vllm_omni" in message and "\n" not in message
