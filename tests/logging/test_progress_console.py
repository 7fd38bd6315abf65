"""The per-rollout console: plain lines without a terminal, messages through the bar in one."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

from unirl.logging import progress
from unirl.logging.progress import RolloutProgress, format_eta, rollout_line

REPO = Path(__file__).resolve().parents[2]


class _FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_rollout_line_names_reward_losses_pace_and_eta():
    metrics = {
        "reward/mean": -0.28125,
        "train/loss": 0.00125,
        "train/approx_kl": 3.1e-5,
        "text/train/loss": 2.5,
        "train/grad_norm": 0.5,  # not on the line
    }
    line = rollout_line(12, 40, metrics, reward_key="reward/mean", s_per_rollout=0.5)
    assert line == (
        "[unirl] rollout 12/40 | reward -0.2812 | loss 0.0013 | approx_kl 3.10e-05 | "
        "text/loss 2.5000 | 0.50 s/rollout | ETA 0:00:14"
    )
    assert format_eta(3725.4) == "1:02:05"
    assert format_eta(float("nan")) == "?"


def test_without_a_terminal_one_line_per_rollout_and_no_bar(monkeypatch):
    out, err = io.StringIO(), io.StringIO()  # isatty() is False, as for a log file or Slurm
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("CI", raising=False)
    clock = _FakeClock(100.0)
    monkeypatch.setattr(progress.time, "perf_counter", clock)
    bar = RolloutProgress(4, initial=1, mode="auto", reward_key="reward/mean")  # resumed at 1
    assert bar.bar is None
    for done, reward in ((2, -0.5), (3, -0.25), (4, -0.125)):
        clock.now += 2.0
        bar.rollout_done(done, {"reward/mean": reward, "train/loss": 0.5})
    bar.close()
    assert out.getvalue().splitlines() == [
        "[unirl] rollout 2/4 | reward -0.5000 | loss 0.5000 | 2.00 s/rollout | ETA 0:00:04",
        "[unirl] rollout 3/4 | reward -0.2500 | loss 0.5000 | 2.00 s/rollout | ETA 0:00:02",
        "[unirl] rollout 4/4 | reward -0.1250 | loss 0.5000 | 2.00 s/rollout | ETA 0:00:00",
    ]
    assert "\r" not in out.getvalue()
    assert err.getvalue() == ""  # no redraw junk


class _TTYStringIO(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_takes_lines_when_stdout_is_redirected_or_ci(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _TTYStringIO())
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # `train ... > run.log`
    monkeypatch.delenv("CI", raising=False)
    assert not progress.progress_enabled("auto")
    monkeypatch.setattr(sys, "stdout", _TTYStringIO())
    assert progress.progress_enabled("auto")
    monkeypatch.setenv("CI", "true")
    assert not progress.progress_enabled("auto")
    assert progress.progress_enabled("on") and not progress.progress_enabled("off")


def test_bar_restores_the_streams_it_wrapped(monkeypatch):
    out, err = _TTYStringIO(), _TTYStringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    bar = RolloutProgress(2, initial=0, mode="on", reward_key="reward/mean")
    assert sys.stdout is not out and sys.stderr is not err
    print("half", end="")  # an unfinished line is written when the bar closes
    bar.close()
    bar.close()
    assert sys.stdout is out and sys.stderr is err
    assert out.getvalue().endswith("half\n")


# -- a real terminal: a pseudo-terminal, rendered as a terminal would show it ------------------

SCRIPT = """
import sys, warnings
from unirl.logging.progress import RolloutProgress
bar = RolloutProgress(3, initial=0, mode="auto", reward_key="reward/mean")
print("[unirl] eval after 0 rollouts: reward -0.3000", flush=True)
for done in (1, 2, 3):
    bar.rollout_done(done, {{"reward/mean": -0.3 + 0.05 * done}})
    {write}
    warnings.warn(f"careful {{done}}")
bar.close()
print("[unirl] finished", flush=True)
"""


def _render(raw: str) -> list[str]:
    """The screen a terminal shows for ``raw``: ``\\r`` returns to column 0, ``\\n`` starts a
    line, text overwrites in place, cursor-up moves a line up; other escapes are dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[(\d*)([A-Za-z])|(\r)|(\n)|([^\x1b\r\n]+)", raw):
        count, code, cr, lf, text = token
        if cr:
            col = 0
        elif lf:
            row += 1
            col = 0
            if row == len(lines):
                lines.append("")
        elif code == "A":
            row = max(row - int(count or 1), 0)
        elif text:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + text + line[col + len(text) :]
            col += len(text)
    return [line.rstrip() for line in lines]


def _run_in_terminal(write: str) -> list[str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.format(write=write))],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=REPO,
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError("the terminal script printed nothing for 60 s")
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    return _render(b"".join(chunks).decode(errors="replace"))


def test_in_a_terminal_messages_go_through_the_bar():
    screen = _run_in_terminal('print(f"[unirl] message {done}", flush=True)')
    # every message whole on its own line, in order; the bar once, below them all
    assert screen[:-3] == [
        "[unirl] eval after 0 rollouts: reward -0.3000",
        "[unirl] message 1",
        "<string>:9: UserWarning: careful 1",
        "[unirl] message 2",
        "<string>:9: UserWarning: careful 2",
        "[unirl] message 3",
        "<string>:9: UserWarning: careful 3",
    ], screen
    assert re.fullmatch(r"rollouts: 100%\|█+\| 3/3 \[.*, reward=-0\.1500\]", screen[-3]), screen
    assert screen[-2:] == ["[unirl] finished", ""]


def test_the_terminal_check_sees_a_message_written_over_the_bar():
    """Control: a line written past the wrapper (the raw stream) lands on the bar's line."""
    screen = _run_in_terminal('sys.__stdout__.write(f"[unirl] message {done}\\n")')
    broken = [line for line in screen if "[unirl] message" in line and "rollouts:" in line]
    assert broken, screen


def test_off_gives_lines_even_in_a_terminal(monkeypatch):
    out = _TTYStringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", _TTYStringIO())
    bar = RolloutProgress(1, initial=0, mode="off", reward_key="reward/mean")
    bar.rollout_done(1, {"reward/mean": 1.0})
    bar.close()
    assert out.getvalue().startswith("[unirl] rollout 1/1 | reward 1.0000 | ")


def test_train_log_gets_the_rollout_lines_while_the_terminal_shows_a_bar(tmp_path, monkeypatch):
    from unirl.trainer.console import TRAIN_LOG, ConsoleLog

    out, err = _TTYStringIO(), _TTYStringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("CI", raising=False)
    clock = _FakeClock(10.0)
    monkeypatch.setattr(progress.time, "perf_counter", clock)
    with ConsoleLog(tmp_path / TRAIN_LOG, append=False):
        bar = RolloutProgress(2, initial=0, mode="auto", reward_key="reward/mean")
        assert bar.bar is not None
        for done in (1, 2):
            clock.now += 2.0
            bar.rollout_done(done, {"reward/mean": 0.5})
            print(f"[unirl] eval after {done} rollouts: reward 0.5000")
        bar.close()
    log = (tmp_path / TRAIN_LOG).read_text().splitlines()[1:]  # after the start line
    assert log[:4] == [
        "[unirl] rollout 1/2 | reward 0.5000 | 2.00 s/rollout | ETA 0:00:02",
        "[unirl] eval after 1 rollouts: reward 0.5000",
        "[unirl] rollout 2/2 | reward 0.5000 | 2.00 s/rollout | ETA 0:00:00",
        "[unirl] eval after 2 rollouts: reward 0.5000",
    ]
    assert len(log) == 5 and log[4].startswith("rollouts: 100%|")  # the bar's last state
    assert "[unirl] rollout" not in out.getvalue()  # on screen: the bar, not the lines
    assert "rollouts: 100%" in err.getvalue()
