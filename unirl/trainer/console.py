"""The run's console, kept: ``ConsoleLog`` mirrors what the driver writes to ``sys.stdout`` and
``sys.stderr`` into ``<output_dir>/train.log`` and, when the run fails, writes the failure
there in full (one ``[unirl] error:`` line, then the traceback, remote traceback included).

The entrypoint prints only that line and where the log is (``unirl.config.entry``): a worker
failure leads with what went wrong (the role, method, rank and the remote error) instead of
ending a long Ray traceback with it. ``failure_line`` is that line.

Credentials never reach either side: every URL password (``scheme://user:TOKEN@host``) and
every credential of the recipe (``secrets``: :func:`unirl.config.secrets.secret_values`) is
masked on the console and in the log, the failure line included.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import traceback
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from unirl.config.require import UserFacingError
from unirl.config.secrets import redact_text
from unirl.distributed.group.errors import RemoteCallError

TRAIN_LOG = "train.log"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


_REMOTE_TRACEBACK = re.compile(r"^--- remote traceback|^Traceback \(most recent call last\)")
FAILURE_MAX_LINES = 8


def failure_line(exc: BaseException) -> str:
    """What names the problem: a remote failure's message (``role 'bundle' method '__init__'
    failed on rank 0 (pool rank 0, node …): ModelSourceError: …``), a user-facing error's
    message, else ``Type: message`` — the whole message up to any traceback it carries, so a
    fix it suggests on a later line reaches the console too; lines after the first are
    indented, and past ``FAILURE_MAX_LINES`` the rest is left to train.log."""
    lines: list[str] = []
    for text in str(exc).strip().splitlines():
        if _REMOTE_TRACEBACK.match(text):
            break
        lines.append(text)
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) > FAILURE_MAX_LINES:
        more = len(lines) - FAILURE_MAX_LINES
        lines = [*lines[:FAILURE_MAX_LINES], f"... ({more} more line(s) in {TRAIN_LOG})"]
    message = "\n".join([lines[0], *(f"  {t}" for t in lines[1:])]) if lines else ""
    if isinstance(exc, RemoteCallError | UserFacingError) and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class _LogFile:
    """The file side: whole lines, colour codes dropped, and of a line redrawn with ``\r``
    (a progress bar) only its last state, as a terminal would show it. Each stream keeps its
    own unfinished line, so a bar on stderr does not swallow a line printed to stdout."""

    def __init__(self, file: TextIO, secrets: frozenset[str] = frozenset()) -> None:
        self._file = file
        self._secrets = secrets  # masked in every line (redact_text)
        self._pending: dict[str, str] = {}
        self._lock = threading.Lock()  # Ray prints worker output from its own thread

    def write(self, text: str, stream: str = "stdout") -> None:
        with self._lock:
            if self._file.closed:  # a stream kept past the run (a thread's): console only
                return
            *done, self._pending[stream] = (self._pending.get(stream, "") + text).split("\n")
            for line in done:
                self._file.write(self._clean(line) + "\n")
            if done:
                self._file.flush()  # a killed run leaves its log up to date

    def end_lines(self) -> None:
        """Write every stream's unfinished line (a progress bar's last state)."""
        with self._lock:
            if self._file.closed:
                return
            for line in self._pending.values():
                if line:
                    self._file.write(self._clean(line) + "\n")
            self._pending.clear()
            self._file.flush()

    def _clean(self, line: str) -> str:
        return redact_text(_ANSI.sub("", line.rsplit("\r", 1)[-1]), self._secrets)

    def close(self) -> None:
        self.end_lines()
        with self._lock:
            self._file.close()


class _Tee:
    """A console stream that also writes to the log; everything else (``isatty``,
    ``fileno``, ``encoding``) is the console's, so progress bars decide as before."""

    def __init__(self, stream: TextIO, log: _LogFile, name: str) -> None:
        self._stream = stream
        self._log = log
        self._name = name

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text, self._log._secrets))
        self._log.write(text, self._name)
        return len(text)

    def write_log(self, text: str) -> None:
        """Into the log only: the per-rollout line a terminal shows as its progress bar
        (``unirl.logging.progress``), so ``train.log`` reads the same with or without one."""
        self._log.write(text, self._name)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class ConsoleLog:
    """``with ConsoleLog(path, append=...)``: the console mirrored into ``path`` (owner-only,
    like ``config.yaml``: it names hosts and paths); a fresh run starts the file, a resumed
    one appends to it. A failure is written in full and the exception is marked for the
    entrypoint: ``unirl_failure_line`` (:func:`failure_line`) and ``unirl_train_log``."""

    def __init__(
        self, path: Path, *, append: bool, secrets: set[str] | frozenset[str] = frozenset()
    ) -> None:
        self.path = Path(path)
        self.append = append
        self.secrets = frozenset(secrets)  # the recipe's credentials, masked in both streams
        self._log: _LogFile | None = None
        self._saved: tuple[TextIO, TextIO] | None = None

    def __enter__(self) -> ConsoleLog:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self.append else os.O_TRUNC)
        file = os.fdopen(os.open(self.path, flags, 0o600), "w", encoding="utf-8")
        self._log = _LogFile(file, self.secrets)
        started = datetime.now().astimezone().isoformat(timespec="seconds")
        self._log.write(f"# unirl run started {started} (pid {os.getpid()})\n")
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self._log, "stdout")  # type: ignore[assignment]
        sys.stderr = _Tee(sys.stderr, self._log, "stderr")  # type: ignore[assignment]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._log is not None and self._saved is not None
        with contextlib.suppress(Exception):  # the console's own buffer, before the record
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = self._saved
        self._log.end_lines()
        if exc is not None and not isinstance(exc, SystemExit):
            record = f"[unirl] error: {failure_line(exc)}\n"
            self._log.write(record + "".join(traceback.format_exception(exc)))
            if isinstance(exc, Exception):
                line = redact_text(failure_line(exc), self.secrets)
                exc.unirl_failure_line = line  # type: ignore[attr-defined]
                exc.unirl_train_log = str(self.path)  # type: ignore[attr-defined]
        self._log.close()
