"""The typed readers of ``config.json``-shaped dicts (``models/common/config_dict.py``) and the
single-token lookup of ``models/common/text_encode.py``: values pass through exactly, and a
value of the wrong kind is refused naming its key."""

from __future__ import annotations

import pytest

from unirl.models.common.config_dict import ConfigDict, config_dict, config_float, config_int
from unirl.models.common.text_encode import token_id


def test_config_int_and_float_read_the_value_or_the_default() -> None:
    config: ConfigDict = {"num_train_timesteps": 1000, "flow_shift": 5, "shift": "3.5"}
    assert config_int(config, "num_train_timesteps", 7) == 1000
    assert config_int(config, "absent", 7) == 7
    assert config_float(config, "flow_shift", 1.0) == 5.0
    assert isinstance(config_float(config, "flow_shift", 1.0), float)
    assert config_float(config, "shift", 1.0) == 3.5
    assert config_float(config, "absent", 1.25) == 1.25


@pytest.mark.parametrize("value", [None, True, [1000], {"n": 1}])
def test_config_int_refuses_a_value_that_is_not_a_number(value: object) -> None:
    config: ConfigDict = {"num_train_timesteps": value}  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="'num_train_timesteps'"):
        config_int(config, "num_train_timesteps", 1000)
    with pytest.raises(TypeError, match="'num_train_timesteps'"):
        config_float(config, "num_train_timesteps", 1.0)


def test_config_dict_copies_the_nested_config() -> None:
    config: ConfigDict = {"text_config": {"hidden_size": 8}, "model_type": "qwen2_5_vl"}
    text = config_dict(config, "text_config")
    assert text == {"hidden_size": 8}
    text["pad_token_id"] = 0  # a copy: the spec's own dict is unchanged
    assert config["text_config"] == {"hidden_size": 8}
    with pytest.raises(TypeError, match="'model_type' must hold a dict, got str"):
        config_dict(config, "model_type")


def test_token_id_is_the_vocabulary_id_of_one_token() -> None:
    from unirl.models.qwen_vl.tiny import TinyQwenVLSpec, build_tokenizer

    tokenizer = build_tokenizer(TinyQwenVLSpec())
    pad = "<|image_pad|>"
    assert token_id(tokenizer, pad) == tokenizer.get_vocab()[pad]

    class Splits:
        def convert_tokens_to_ids(self, token: str) -> list[int]:
            return [1, 2]

    with pytest.raises(TypeError, match="maps 'ab' to \\[1, 2\\], not to one token id"):
        token_id(Splits(), "ab")  # type: ignore[arg-type]
