"""``StopRequest``: the first SIGINT / SIGTERM is a request the loop honours at the next
rollout boundary, the second stops at once; the entrypoint reports that in one line."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from unirl.config.entry import run_reporting
from unirl.trainer.stop import StopRequest, stop_line


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_requests_the_second_interrupts_and_handlers_come_back(
    sig: signal.Signals, capsys: pytest.CaptureFixture[str]
) -> None:
    before = signal.getsignal(sig)
    with StopRequest() as stop:
        assert stop.requested is None
        os.kill(os.getpid(), sig)  # delivered to the main thread before the next line
        assert stop.requested == sig.name
        assert stop.exit_code == 128 + int(sig)
        assert capsys.readouterr().err == (
            f"[unirl] {sig.name}: stopping after this rollout, with a checkpoint (send it "
            "again to stop at once, without one)\n"
        )
        with pytest.raises(KeyboardInterrupt, match=f"{sig.name} again: stopped at once"):
            os.kill(os.getpid(), sig)
    assert signal.getsignal(sig) is before


def test_the_last_line_says_where_it_stopped_and_how_to_continue(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints" / "step_000002"
    assert stop_line("SIGTERM", 2, ckpt, 5, tmp_path) == (
        f"[unirl] stopped by SIGTERM after rollout 2 of 5; checkpoint {ckpt}; continue with "
        "the same command and resume=auto"
    )
    assert stop_line("SIGINT", 3, None, 5, tmp_path) == (
        "[unirl] stopped by SIGINT before this run's first rollout (rollout 3 of 5); nothing "
        f"new to save; outputs in {tmp_path}"
    )


def test_an_interrupt_that_stops_at_once_is_one_line_and_exit_130(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(data: dict) -> int:
        raise KeyboardInterrupt("SIGINT again: stopped at once, without a checkpoint")

    assert run_reporting(run, {}) == 130
    assert capsys.readouterr().err == (
        "[unirl] stopped: SIGINT again: stopped at once, without a checkpoint; resume=auto "
        "continues from the last complete checkpoint\n"
    )
