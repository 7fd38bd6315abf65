"""Wall time of ``dry_run=true`` for every shipped recipe, each in a fresh process.

    python -m unirl.tools.dry_run_times                    # every recipe under examples/
    python -m unirl.tools.dry_run_times --only llm/ --limit 20 --json times.json

A dry run composes the recipe, validates every block and prints the placement plan without
loading weights or starting Ray; a user runs it before every real run, so it should answer
within seconds. Each recipe runs as ``python -m <its entrypoint> --config-name=<name>
dry_run=true`` (the recipe's ``entrypoint:`` key, else its folder's default), and the table
lists the wall time and the CPU time (user + system, the child's own) of each, slowest
first. On a busy machine the wall time measures the neighbours; ``--measure cpu`` checks the
limit on the CPU time instead (on an idle machine the two agree within a second: a dry run
is one process on one core). Exit status 1 when a dry run fails or takes longer than
``--limit`` seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOMAIN_ENTRYPOINTS = {
    "diffusion": "unirl.train_diffusion",
    "llm": "unirl.train_vlm",
    "vlm": "unirl.train_vlm",
    "pe": "unirl.train_pe",
    "unified_model": "unirl.train_unified_model",
}
_ENTRYPOINT = re.compile(r"^entrypoint:\s*([\w.]+)", re.MULTILINE)


def recipes(examples: Path, only: str | None = None) -> list[tuple[str, str]]:
    """``(config name, entrypoint module)`` of every recipe under ``examples/<domain>/``."""
    out = []
    for domain, default in DOMAIN_ENTRYPOINTS.items():
        for path in sorted((examples / domain).glob("*.yaml")):
            name = f"{domain}/{path.stem}"
            if only and not name.startswith(only):
                continue
            found = _ENTRYPOINT.search(path.read_text())
            out.append((name, found.group(1) if found else default))
    return out


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_dry_run(name: str, entrypoint: str, timeout_s: float) -> tuple[float, float, int, str]:
    """``(wall seconds, CPU seconds, exit status, the failing line)`` of one dry run in a
    fresh process."""
    cmd = [sys.executable, "-m", entrypoint, f"--config-name={name}", "dry_run=true"]
    t0, cpu0 = time.perf_counter(), _children_cpu()
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, math.nan, 124, f"timed out after {timeout_s:g} s"
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    lines = (done.stdout + done.stderr).strip().splitlines()
    failed = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "")
    return seconds, cpu, done.returncode, "" if done.returncode == 0 else failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="config-name prefix, e.g. llm/ or diffusion/sd3")
    ap.add_argument("--limit", type=float, default=20.0, help="seconds one dry run may take")
    ap.add_argument(
        "--measure", choices=("wall", "cpu"), default="wall", help="what --limit checks"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="kill a dry run after this many seconds of wall time (default: 3 x --limit, at "
        "least 60; raise it on a busy machine)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the times here")
    args = ap.parse_args(argv)
    found = recipes(ROOT / "examples", args.only)
    if not found:
        print(f"[dry_run_times] no recipe matches {args.only!r}", file=sys.stderr)
        return 1
    rows: list[dict[str, Any]] = []
    for name, entrypoint in found:
        timeout_s = args.timeout or max(args.limit * 3, 60)
        wall, cpu, status, why = time_dry_run(name, entrypoint, timeout_s)
        rows.append(
            {"recipe": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "status": status}
            | ({"why": why} if why else {})
        )
        state = "ok  " if status == 0 else "FAIL"
        print(f"  wall {wall:6.2f} s  cpu {cpu:6.2f} s  {state}  {name}", flush=True)
    key = f"{args.measure}_s"
    rows.sort(key=lambda r: -r[key] if math.isfinite(r[key]) else -math.inf)
    failed = [r for r in rows if r["status"] != 0]
    slow = [r for r in rows if r["status"] == 0 and r[key] > args.limit]
    times = sorted(r[key] for r in rows if r["status"] == 0) or [math.nan]
    slowest = next((r["recipe"] for r in rows if r["status"] == 0), "-")
    print(
        f"[dry_run_times] {len(rows)} recipes, {args.measure} time: slowest {times[-1]:.2f} s "
        f"({slowest}), median {times[len(times) // 2]:.2f} s; {len(failed)} failed, "
        f"{len(slow)} over {args.limit:g} s"
    )
    for r in failed:
        print(f"  FAIL {r['recipe']}: {r['why']}")
    if args.json:
        summary = {"limit_s": args.limit, "measure": args.measure, "rows": rows}
        args.json.write_text(json.dumps(summary, indent=2))
    return 1 if failed or slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
