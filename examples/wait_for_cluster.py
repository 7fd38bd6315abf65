"""Wait until the Ray cluster at RAY_ADDRESS really has the expected nodes and devices.

Exits 0 once ``--nodes`` alive nodes with at least ``--gpus`` GPUs (and ``--cpus`` CPUs) are
registered; exits 1 with what is missing after ``--timeout`` seconds. No fixed sleeps.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=float, default=0)
    parser.add_argument("--cpus", type=float, default=0)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--poll", type=float, default=2.0)
    args = parser.parse_args()

    import ray

    deadline = time.monotonic() + args.timeout
    while True:  # the head may still be starting: retry until the deadline
        try:
            ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
            break
        except ConnectionError as exc:
            if time.monotonic() >= deadline:
                print(
                    f"[wait_for_cluster] no Ray cluster reachable after {args.timeout:g}s: {exc}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(args.poll)
    nodes = gpus = cpus = 0.0
    while time.monotonic() < deadline:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        nodes = len(alive)
        gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
        cpus = sum(n.get("Resources", {}).get("CPU", 0) for n in alive)
        if nodes >= args.nodes and gpus >= args.gpus and cpus >= args.cpus:
            print(
                f"[wait_for_cluster] ready: {nodes} nodes, {gpus:g} GPUs, {cpus:g} CPUs", flush=True
            )
            return 0
        time.sleep(args.poll)
    print(
        f"[wait_for_cluster] timed out after {args.timeout:g}s: have {nodes} nodes / {gpus:g} GPUs / "
        f"{cpus:g} CPUs, want {args.nodes} / {args.gpus:g} / {args.cpus:g}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
