"""train.log: the console mirrored, a failure written in full, one line for the entrypoint."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from unirl.config import ConfigError
from unirl.config.entry import report_failure, run_reporting
from unirl.distributed.group.errors import RemoteCallError
from unirl.trainer.console import ConsoleLog, failure_line


def _body(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# unirl run started ")
    return lines[1:]


def test_console_is_mirrored_line_by_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "train.log"
    with ConsoleLog(log, append=False):
        print("[unirl] one")
        sys.stderr.write("\rbar 1/2")
        print("[unirl] two, while the bar is drawn")
        sys.stderr.write("\rbar 2/2")
        sys.stdout.write("\x1b[36m(Worker pid=1)\x1b[0m hello\n")  # Ray's coloured prefix
        sys.stderr.write("\rbar 2/2 done")  # left unfinished: written at the end
    assert _body(log) == [
        "[unirl] one",
        "[unirl] two, while the bar is drawn",
        "(Worker pid=1) hello",
        "bar 2/2 done",
    ]
    console = capsys.readouterr()
    assert console.out.startswith("[unirl] one\n[unirl] two, while the bar is drawn\n")
    assert "\rbar 1/2" in console.err  # the console gets exactly what was written
    assert log.stat().st_mode & 0o777 == 0o600
    with ConsoleLog(log, append=True):  # a resumed run appends
        print("[unirl] resumed")
    assert log.read_text().count("# unirl run started") == 2
    assert log.read_text().splitlines()[-1] == "[unirl] resumed"
    with ConsoleLog(log, append=False):  # a fresh run starts the file
        pass
    assert _body(log) == []


def test_a_failure_is_written_in_full_and_marked_for_the_entrypoint(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    stdout = sys.stdout
    with pytest.raises(RemoteCallError) as info, ConsoleLog(log, append=False):
        print("[unirl] before")
        raise RemoteCallError(
            "role 'bundle' method '__init__' failed on rank 0: OSError: no such model\n"
            "--- remote traceback (rank 0) ---\nTraceback ...\nOSError: no such model",
            role="bundle",
            method="__init__",
            ranks=[0],
        )
    assert sys.stdout is stdout
    exc = info.value
    line = "role 'bundle' method '__init__' failed on rank 0: OSError: no such model"
    assert exc.unirl_failure_line == line  # type: ignore[attr-defined]
    assert exc.unirl_train_log == str(log)  # type: ignore[attr-defined]
    body = _body(log)
    assert body[:3] == [
        "[unirl] before",
        f"[unirl] error: {line}",
        "Traceback (most recent call last):",
    ]
    assert "--- remote traceback (rank 0) ---" in body


def test_failure_line_names_the_problem_and_the_fix_it_suggests() -> None:
    assert failure_line(ValueError("bad value\nmore")) == "ValueError: bad value\n  more"
    remote = RemoteCallError(
        "role 'bundle' method '__init__' failed on rank 0: ModelSourceError: no model at x\n"
        "set bundle.path to a local folder or a hub id\n"
        "--- remote traceback (rank 0) ---\nTraceback ...",
        role="bundle",
        method="__init__",
        ranks=[0],
    )
    assert failure_line(remote) == (
        "role 'bundle' method '__init__' failed on rank 0: ModelSourceError: no model at x\n"
        "  set bundle.path to a local folder or a hub id"
    )
    long = failure_line(ValueError("\n".join(str(i) for i in range(20))))
    assert long.splitlines()[-1] == "  ... (12 more line(s) in train.log)"
    assert failure_line(ConfigError("stack.micro_batch_size: too big")) == (
        "stack.micro_batch_size: too big"
    )
    assert failure_line(KeyboardInterrupt()) == "KeyboardInterrupt"


def test_the_entrypoint_reports_one_line_then_where_the_traceback_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logged = RuntimeError("boom\ndetails")
    logged.unirl_failure_line = "RuntimeError: boom"  # type: ignore[attr-defined]
    logged.unirl_train_log = "/run/train.log"  # type: ignore[attr-defined]
    report_failure(logged)
    assert capsys.readouterr().err == (
        "[unirl] error: RuntimeError: boom\n[unirl] the full traceback is in /run/train.log\n"
    )

    def fails(data: dict[str, object]) -> int:
        raise KeyError("missing")

    assert run_reporting(fails, {}) == 1  # outside a run: the traceback on the console
    err = capsys.readouterr().err
    assert err.startswith("[unirl] error: KeyError: 'missing'\nTraceback (most recent call last):")

    def refused(data: dict[str, object]) -> int:
        raise ConfigError("batch_size: must divide")

    assert run_reporting(refused, {}) == 2
    assert capsys.readouterr().err == "[unirl] configuration error: batch_size: must divide\n"
