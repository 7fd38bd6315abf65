"""The per-rollout console: a progress bar in a terminal, one plain line per rollout elsewhere.

In a terminal (stdout and stderr both TTYs, ``CI`` unset, or ``logging.progress=on``) a tqdm
bar sits on stderr and everything printed while it is up (``[unirl]`` messages, warnings,
Ray's worker output) is written *through* it: the bar is cleared, the whole line written, the
bar redrawn, so no message lands in the middle of the bar. Elsewhere (a log file, Slurm, CI,
a pipe, or ``logging.progress=off``) there is no bar and no redraw junk: one line per rollout,

    [unirl] rollout 12/40 | reward -0.2812 | loss 0.0012 | approx_kl 3.1e-05 | 0.54 s/rollout | ETA 0:00:15
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

# the losses the plain line shows, by metric suffix (each trained stage's prefix kept)
LINE_LOSSES = ("train/loss", "train/approx_kl")


def progress_enabled(mode: str) -> bool:
    """``on``: always a bar; ``off``: never; ``auto``: when stdout and stderr are terminals
    and ``CI`` is unset (a redirected stdout gets plain lines, not a bar it cannot show)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return sys.stderr.isatty() and sys.stdout.isatty() and not os.environ.get("CI")


def format_eta(seconds: float) -> str:
    """``H:MM:SS`` (``?`` before anything was timed)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = int(seconds + 0.5)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}"
    return f"{value:.2e}"


def rollout_line(
    done: int, total: int, metrics: dict[str, float], *, reward_key: str, s_per_rollout: float
) -> str:
    """The plain line of one rollout: ``done/total``, the reward, each trained stage's loss and
    approx KL (labelled without ``train/``), seconds per rollout and the ETA."""
    parts = [f"[unirl] rollout {done}/{total}"]
    if reward_key in metrics:
        parts.append(f"reward {_number(float(metrics[reward_key]))}")
    for key, value in metrics.items():
        if any(key == s or key.endswith("/" + s) for s in LINE_LOSSES):
            parts.append(f"{key.replace('train/', '')} {_number(float(value))}")
    parts.append(f"{s_per_rollout:.2f} s/rollout")
    parts.append(f"ETA {format_eta(s_per_rollout * (total - done))}")
    return " | ".join(parts)


class _ThroughBar:
    """A console stream while the bar is up: each whole line is written with the bar cleared
    and redrawn after it (under tqdm's lock, since Ray prints from its own thread); an
    unfinished line waits for its newline. Everything else is the stream's own."""

    def __init__(self, stream: TextIO, bar: tqdm) -> None:
        self._stream = stream
        self._bar = bar
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            head, sep, self._pending = (self._pending + text).rpartition("\n")
            if sep:
                self._emit(head + sep)
        return len(text)

    def _emit(self, text: str) -> None:
        with self._bar.get_lock():
            self._bar.clear(nolock=True)
            self._stream.write(text)
            self._stream.flush()
            self._bar.refresh(nolock=True)

    def flush(self) -> None:
        self._stream.flush()

    def finish(self) -> None:
        """Write an unfinished last line (the bar is closing)."""
        with self._lock:
            if self._pending:
                self._emit(self._pending + "\n")
                self._pending = ""

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


class RolloutProgress:
    """``rollout_done(done, metrics)`` after each rollout; ``close()`` at the end (twice is
    fine). With a bar, ``sys.stdout`` and ``sys.stderr`` are written through it until
    ``close``, which puts back the streams it found."""

    def __init__(
        self, total: int, *, initial: int, mode: str, reward_key: str, desc: str = "rollouts"
    ) -> None:
        self.total = total
        self.reward_key = reward_key
        self._first = initial
        self._start = time.perf_counter()
        self._streams: tuple[TextIO, TextIO] | None = None
        self.bar: tqdm | None = None
        if progress_enabled(mode):
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit="rollout",
                file=sys.stderr,
                dynamic_ncols=True,
            )
            self._streams = (sys.stdout, sys.stderr)
            sys.stdout = _ThroughBar(sys.stdout, self.bar)  # type: ignore[assignment]
            sys.stderr = _ThroughBar(sys.stderr, self.bar)  # type: ignore[assignment]

    def s_per_rollout(self, done: int) -> float:
        """Wall seconds per rollout since this process started the loop (evals and
        checkpoints included, so the ETA holds)."""
        ran = done - self._first
        return (time.perf_counter() - self._start) / ran if ran > 0 else math.nan

    def rollout_done(self, done: int, metrics: dict[str, float]) -> None:
        line = rollout_line(
            done,
            self.total,
            metrics,
            reward_key=self.reward_key,
            s_per_rollout=self.s_per_rollout(done),
        )
        if self.bar is None:
            print(line, flush=True)
            return
        self.bar.update(done - self.bar.n)
        if self.reward_key in metrics:
            self.bar.set_postfix(reward=f"{float(metrics[self.reward_key]):.4f}")
        # a console that keeps a log (``trainer.console.ConsoleLog``) gets the line for the
        # log alone: train.log has one line per rollout with a bar on screen too
        write_log = getattr(self._streams[0] if self._streams else None, "write_log", None)
        if write_log is not None:
            write_log(line + "\n")

    def close(self) -> None:
        if self._streams is not None:
            for wrapped in (sys.stdout, sys.stderr):
                if isinstance(wrapped, _ThroughBar):
                    wrapped.finish()
            out, err = self._streams
            if isinstance(sys.stdout, _ThroughBar):
                sys.stdout = out
            if isinstance(sys.stderr, _ThroughBar):
                sys.stderr = err
            self._streams = None
        if self.bar is not None:
            self.bar.close()
