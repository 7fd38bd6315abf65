"""``bundle.sdpa_backend=auto`` on a Hopper card sets torch's attention priority once for the
process, not around each transformer call: torch keeps the setting process-wide, so a per-call
switch changed the kernels a reward model picked while it scored in another thread
(``rollout.reward_overlap``, sixteenth session, call 18). The card is simulated; the priority
list is torch's own state."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from torch.nn.attention import SDPBackend

from unirl.models.common import bundle as common_bundle


@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch):
    kept: list[contextlib.AbstractContextManager[None]] = []
    before = torch._C._get_sdp_priority_order()
    monkeypatch.setattr(common_bundle, "_PROCESS_SDPA_ORDER", kept)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    yield kept
    for context in kept:
        context.__exit__(None, None, None)
    assert torch._C._get_sdp_priority_order() == before


def test_auto_sets_the_process_order_once_and_every_thread_sees_it(hopper) -> None:
    cuda = torch.device("cuda", 0)
    first = common_bundle.sdpa_context("auto", cuda)
    assert len(hopper) == 1  # set when asked, not when a context is entered
    order = torch._C._get_sdp_priority_order()
    assert order[:2] == [int(SDPBackend.CUDNN_ATTENTION), int(SDPBackend.FLASH_ATTENTION)]
    with first, common_bundle.sdpa_context("auto", cuda):
        assert torch._C._get_sdp_priority_order() == order
    assert torch._C._get_sdp_priority_order() == order  # leaving a call restores nothing
    assert len(hopper) == 1
    seen: list[list[int]] = []
    worker = threading.Thread(target=lambda: seen.append(torch._C._get_sdp_priority_order()))
    worker.start()
    worker.join()
    assert seen == [order]


def test_older_cards_and_cpu_keep_torchs_order(hopper, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch._C._get_sdp_priority_order()
    common_bundle.sdpa_context("auto", torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    common_bundle.sdpa_context("auto", torch.device("cuda", 0))
    common_bundle.sdpa_context("torch", torch.device("cuda", 0))
    assert hopper == [] and torch._C._get_sdp_priority_order() == before
