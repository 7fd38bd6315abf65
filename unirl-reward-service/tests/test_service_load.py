"""Bounded load test on loopback: 8 concurrent clients x 25 requests, each with its own images.

Every answer is checked against scores computed in-process beforehand for that request's
images (JPEG: exact; brightness: ``abs=1e-6`` since cross-request batches change the batch a
mean is reduced in), so a lost, duplicated or swapped result fails the test. Prints
requests/s and p50/p99 latency (``pytest -s``); the README quotes a run of it.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import numpy as np
import pytest
import torch
from unirl.reward.local import BrightnessTarget, JpegCompressibility

from unirl_reward_service import create_app
from unirl_reward_service.codec import encode_png
from unirl_reward_service.testing import serve_in_thread

CLIENTS = 8
REQUESTS_PER_CLIENT = 25
IMAGES_PER_REQUEST = 4
SIZE = 32


def request_images(client: int, index: int) -> torch.Tensor:
    """Distinct random ``uint8`` images per (client, request) as float32 k/255."""
    g = torch.Generator().manual_seed(1000 * client + index)
    pixels = torch.randint(0, 256, (IMAGES_PER_REQUEST, 3, SIZE, SIZE), generator=g)
    return pixels.to(torch.uint8).float() / 255.0


def test_concurrent_clients_get_every_result_back():
    config = {
        "server": {"batch_wait_ms": 2, "require_auth": False},
        "rewards": {
            "jpeg": {
                "_target_": "unirl.reward.local.JpegCompressibility",
                "replicas": 2,
                "max_batch_size": 16,
            },
            "brightness": {
                "_target_": "unirl.reward.local.BrightnessTarget",
                "replicas": 2,
                "max_batch_size": 16,
            },
        },
    }
    jobs: dict[tuple[int, int], tuple[dict, list[float], list[float]]] = {}
    prompts = [""] * IMAGES_PER_REQUEST
    metadata = [{}] * IMAGES_PER_REQUEST
    for c in range(CLIENTS):
        for r in range(REQUESTS_PER_CLIENT):
            images = request_images(c, r)
            arrays = images.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
            body = {
                "rewards": ["jpeg", "brightness"],
                "images": [encode_png(np.ascontiguousarray(a)) for a in arrays],
            }
            jpeg = JpegCompressibility().score(images, prompts, metadata)
            bright = BrightnessTarget().score(images, prompts, metadata)
            jobs[(c, r)] = (
                body,
                jpeg.scores["jpeg_compressibility"].tolist(),
                bright.scores["brightness"].tolist(),
            )

    latencies: list[float] = []
    mismatches: list[str] = []
    failures: list[str] = []
    done: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def client(c: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for r in range(REQUESTS_PER_CLIENT):
                body, want_jpeg, want_bright = jobs[(c, r)]
                started = time.perf_counter()
                try:
                    answer = http.post("/score", json=body)
                except httpx.HTTPError as exc:
                    with lock:
                        failures.append(f"{c}/{r}: {exc!r}")
                    continue
                elapsed = time.perf_counter() - started
                problems = []
                if answer.status_code != 200:
                    problems.append(f"{c}/{r}: HTTP {answer.status_code} {answer.text[:200]}")
                else:
                    results = answer.json()["results"]
                    got_jpeg = [s["score"] for s in results["jpeg"]["samples"]]
                    got_bright = [s["score"] for s in results["brightness"]["samples"]]
                    if got_jpeg != want_jpeg:
                        problems.append(f"{c}/{r}: jpeg {got_jpeg} != {want_jpeg}")
                    if got_bright != pytest.approx(want_bright, abs=1e-6):
                        problems.append(f"{c}/{r}: brightness {got_bright} != {want_bright}")
                with lock:
                    latencies.append(elapsed)
                    mismatches.extend(problems)
                    done.add((c, r))

    app = create_app(config)
    with serve_in_thread(app) as url:
        httpx.post(url + "/score", json=jobs[(0, 0)][0], timeout=60)  # warm-up
        threads = [threading.Thread(target=client, args=(c, url)) for c in range(CLIENTS)]
        wall_start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        wall = time.perf_counter() - wall_start
        health = httpx.get(url + "/health", timeout=10).json()

    total = CLIENTS * REQUESTS_PER_CLIENT
    assert not failures, failures[:5]
    assert not mismatches, mismatches[:5]
    assert len(done) == total and len(latencies) == total
    for name in ("jpeg", "brightness"):  # every image scored exactly once (plus the warm-up)
        assert health["rewards"][name]["scored_samples"] == (total + 1) * IMAGES_PER_REQUEST
        assert health["rewards"][name]["failed_samples"] == 0
    ordered = sorted(latencies)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    batches = health["rewards"]["jpeg"]["batches"]
    print(
        f"\nload: {CLIENTS} clients x {REQUESTS_PER_CLIENT} requests x {IMAGES_PER_REQUEST} "
        f"images {SIZE}x{SIZE}, 2 rewards: {total / wall:.1f} requests/s, "
        f"{total * IMAGES_PER_REQUEST / wall:.1f} images/s, p50 {1000 * p50:.1f} ms, "
        f"p99 {1000 * p99:.1f} ms, wall {wall:.2f} s, "
        f"mean jpeg batch {(total + 1) * IMAGES_PER_REQUEST / batches:.1f} images"
    )
