"""Credentials are masked on the console, in train.log and in the failure line: every URL
password and every value the recipe holds under a credential key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from unirl.config.secrets import REDACTED, redact_text, secret_values
from unirl.trainer.console import ConsoleLog

RECIPE = {
    "reward": {"backend": {"url": "http://bob:hunter2-pw@rewards:8000", "token": "tok-abc123"}},
    "logging": {"wandb_project": "p"},
    "bundle": {"eos_token": "</s>"},  # a tokenizer's token, not a credential
}


def test_secret_values_and_redact_text() -> None:
    assert secret_values(RECIPE) == {"hunter2-pw", "tok-abc123"}
    line = "POST http://bob:hunter2-pw@rewards:8000/score failed; token tok-abc123 rejected"
    assert redact_text(line, secret_values(RECIPE)) == (
        f"POST http://bob:{REDACTED}@rewards:8000/score failed; token {REDACTED} rejected"
    )
    # a URL password is masked even when the recipe did not name it
    assert redact_text("see https://u:p4ss@h/x") == f"see https://u:{REDACTED}@h/x"


def test_console_log_masks_both_streams_and_the_failure_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "train.log"
    console_log = ConsoleLog(log, append=False, secrets=secret_values(RECIPE))
    with pytest.raises(RuntimeError) as info, console_log:
        print("[unirl] reward at http://bob:hunter2-pw@rewards:8000 (token tok-abc123)")
        print("progress\r", end="", file=sys.stderr)
        raise RuntimeError("401 from http://bob:hunter2-pw@rewards:8000 with tok-abc123")
    console = capsys.readouterr()
    text = log.read_text()
    for where in (console.out, console.err, text, info.value.unirl_failure_line):  # type: ignore[attr-defined]
        assert "hunter2-pw" not in where and "tok-abc123" not in where
    assert f"[unirl] reward at http://bob:{REDACTED}@rewards:8000 (token {REDACTED})" in text
    assert info.value.unirl_failure_line == (  # type: ignore[attr-defined]
        f"RuntimeError: 401 from http://bob:{REDACTED}@rewards:8000 with {REDACTED}"
    )
