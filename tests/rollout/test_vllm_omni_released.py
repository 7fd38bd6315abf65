"""unirl's vLLM-Omni worker extension reached through vLLM-Omni 0.30.0's own RPC layer: the
released ``WorkerWrapperBase`` mixes it into the worker class and ``collective_rpc`` calls its
methods (recorded by ``tests/fixtures/engines/record_vllm_omni.py`` with the released code,
the engine core below replaced by a stand-in worker); here the recorded results are checked
against what the trainer sent, the extension is run in-process on the same stand-in, and
``OmniBackend`` routes its calls through ``Omni.engine.collective_rpc``."""

from __future__ import annotations

import json
import os
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest
import released_cases as cases
import torch
from torch import nn

from unirl.distributed.weight_sync import WeightSyncError, tensor_checksum
from unirl.rollout.engine.vllm_omni.backend import WORKER_EXTENSION, OmniBackend, rpc_results
from unirl.rollout.engine.vllm_omni.worker_ext import QUALNAME, UnirlWorkerExtension

RECORD = json.loads((cases.VLLM_OMNI_DIR / "worker_extension_rpc.json").read_text())


class TinyTransformer(nn.Module):  # the recorder's stand-in module, same seed
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.to_q = nn.Linear(4, 4)
        self.to_k = nn.Linear(4, 4)


class StandInWorker:
    def __init__(self) -> None:
        self.rank = 0
        self.model_runner = types.SimpleNamespace(
            pipeline=types.SimpleNamespace(transformer=TinyTransformer())
        )


def _checksums(named: list[tuple[str, torch.Tensor]]) -> dict[str, int]:
    return {n: tensor_checksum(t) for n, t in named}


def test_released_wrapper_mixed_the_extension_in_and_rpc_reached_it() -> None:
    assert RECORD["vllm_omni_version"] == cases.VLLM_OMNI_VERSION
    assert RECORD["worker_class"] == "StandInDiffusionWorkerWithUnirlWorkerExtension"
    assert RECORD["worker_mro"][:3] == [
        "StandInDiffusionWorkerWithUnirlWorkerExtension",
        "UnirlWorkerExtension",
        "StandInDiffusionWorker",
    ]
    calls = RECORD["calls"]
    assert [c["method"] for c in calls] == [
        "weight_checksums",
        "update_weights",
        "weight_checksums",
        "update_weights",
        "weight_checksums",
        "sleep",
        "wake_up",
    ]
    full, lora = cases.vllm_omni_full_tensors(), cases.vllm_omni_lora_tensors()
    assert calls[1]["result"] == [sum(t.numel() * 4 for _, t in full)]  # bytes copied
    assert calls[2]["result"] == [{k: v for k, v in _checksums(full).items()}]
    assert calls[0]["result"] != calls[2]["result"]  # the update changed the weights
    assert calls[3]["result"] == [sum(t.numel() * 4 for _, t in lora)]
    assert calls[4]["result"] == [_checksums(lora)]
    assert calls[5]["result"] == [0] and calls[6]["result"] == [True]
    assert RECORD["sleep_levels"] == [1, -1]  # the worker's own sleep(1), then wake_up()


def test_extension_in_process_matches_the_recorded_rpc_results() -> None:
    worker_cls = type("W", (UnirlWorkerExtension, StandInWorker), {})
    worker = worker_cls()
    full, lora = cases.vllm_omni_full_tensors(), cases.vllm_omni_lora_tensors()
    names = [n for n, _ in full]
    assert [worker.weight_checksums(names)] == RECORD["calls"][0]["result"]
    assert worker.update_weights(full, "full", None) == RECORD["calls"][1]["result"][0]
    assert [worker.weight_checksums(names)] == RECORD["calls"][2]["result"]
    worker.update_weights(lora, "lora", cases.vllm_omni_lora_config())
    assert [worker.weight_checksums([n for n, _ in lora])] == RECORD["calls"][4]["result"]
    with pytest.raises(WeightSyncError, match=r"to_v\.weight"):
        worker.update_weights([("to_v.weight", torch.zeros(4, 4))], "full", None)
    worker.model_runner.pipeline = None
    with pytest.raises(WeightSyncError, match="no pipeline is loaded"):
        worker.weight_checksums(names)


class EngineWithRpc:
    """Omni 0.30's shape: no ``collective_rpc`` of its own, one on ``engine``."""

    def __init__(self, worker: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.worker = worker

    def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: Any = None
    ) -> list[Any]:
        self.calls.append((method, args))
        return [getattr(self.worker, method)(*args)]


def test_backend_reaches_the_workers_through_omni_engine() -> None:
    worker = type(
        "W",
        (UnirlWorkerExtension, StandInWorker),
        {"sleep": lambda self, level: 0, "wake_up": lambda self: True},
    )()
    omni = types.SimpleNamespace(engine=EngineWithRpc(worker))
    backend = OmniBackend.__new__(OmniBackend)
    backend.omni = omni
    full = cases.vllm_omni_full_tensors()
    backend.update_weights(full, kind="full", lora_config=None)
    assert backend.weight_checksums([n for n, _ in full]) == _checksums(full)
    backend.sleep()
    backend.wake_up()
    assert [m for m, _ in omni.engine.calls] == [
        "update_weights",
        "weight_checksums",
        "sleep",
        "wake_up",
    ]
    assert omni.engine.calls[2] == ("sleep", (1,))
    assert WORKER_EXTENSION == QUALNAME
    with pytest.raises(RuntimeError, match="exposes no collective_rpc"):
        rpc_results(types.SimpleNamespace(), "weight_checksums", ([],))
    todo = types.SimpleNamespace(collective_rpc=lambda method, args: [{"todo": True}])
    with pytest.raises(RuntimeError, match="not supported by a stage"):
        rpc_results(todo, "sleep", (1,))


@pytest.mark.skipif(
    not os.environ.get("UNIRL_VLLM_OMNI_PYTHON"),
    reason="set UNIRL_VLLM_OMNI_PYTHON to a python with vllm-omni==0.30.0 (see docs/engines.md) to re-record",
)
def test_recorder_reproduces_the_committed_fixture() -> None:
    out = subprocess.run(
        [
            os.environ["UNIRL_VLLM_OMNI_PYTHON"],
            str(cases.FIXTURES / "record_vllm_omni.py"),
            "--check",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    assert out.returncode == 0 and "same: " in out.stdout, out.stdout + out.stderr[-2000:]
