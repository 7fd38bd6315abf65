"""Credentials never reach ``config.yaml`` or a tracker's config; the file is owner-only."""

from __future__ import annotations

import stat
from pathlib import Path

from unirl.config.entry import compose_recipe
from unirl.config.secrets import REDACTED, is_secret_key, redact_secrets
from unirl.trainer.output import OutputDir


def test_secret_keys_and_what_is_kept() -> None:
    for key in ("token", "auth_token", "api_key", "HF_TOKEN", "password", "aws_secret_key"):
        assert is_secret_key(key), key
    for key in ("token_env", "auth_token_env", "max_new_tokens", "pad_token", "eos_token", "path"):
        assert not is_secret_key(key), key
    data = {
        "reward": {"backend": {"token": "s3cr3t", "token_env": "REWARD_TOKEN", "url": "http://h"}},
        "hub": ["https://alice:pa55@host.example/x", "https://host.example/y"],
        "empty_token": None,
    }
    out = redact_secrets(data)
    assert out["reward"]["backend"] == {
        "token": REDACTED,
        "token_env": "REWARD_TOKEN",
        "url": "http://h",
    }
    assert out["hub"] == [f"https://alice:{REDACTED}@host.example/x", "https://host.example/y"]
    assert out["empty_token"] is None
    assert data["reward"]["backend"]["token"] == "s3cr3t"  # a copy: the run keeps its token


def test_inline_token_is_not_written_and_config_is_owner_only(tmp_path: Path) -> None:
    data = compose_recipe(
        "diffusion/sd3_trainside_reward_service",
        ["+reward.backend.token=inline-s3cr3t-value"],
    )
    assert data["reward"]["backend"]["token"] == "inline-s3cr3t-value"
    out = OutputDir(tmp_path / "run")
    (out.root / "config.yaml").write_text("old")
    (out.root / "config.yaml").chmod(0o644)
    out.write_config(data)
    text = (out.root / "config.yaml").read_text()
    assert "inline-s3cr3t-value" not in text and REDACTED in text
    assert stat.S_IMODE((out.root / "config.yaml").stat().st_mode) == 0o600
