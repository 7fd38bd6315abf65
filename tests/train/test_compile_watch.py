"""Recompiles of compiled blocks are never silent: dynamo's count of compiled graphs moves on a
new input shape and not on a repeated one, a train stack with ``fsdp.compile`` reports
``compile/new_graphs`` per rollout, and prints one warning once graphs keep being compiled
after the first rollout (none while shapes stay fixed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch._dynamo
from torch import nn
from train_fakes import TinyBundle, empty_track, make_backend

import unirl.train.compile_watch as compile_watch
from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.train import TrainStack
from unirl.train.compile_watch import (
    RecompileWatch,
    compiled_graph_count,
    describe_compiles,
    recompile_warning,
)
from unirl.train.parallel import FSDPConfig, apply_compile
from unirl.trainer.base import mean_over_ranks


class TinyBlock(nn.Module):
    """A user-defined module (dynamo skips ``torch.nn``'s own classes as a compiled frame)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x)) * 2.0


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Dynamo caches graphs per code object, shared by every ``TinyBlock`` (another test's
    shapes would be cached already): each test starts from an empty cache and a count of 0."""
    torch._dynamo.reset()


def eager_compiled_block() -> TinyBlock:
    """A block compiled like ``apply_compile`` does (``dynamic=False``), through dynamo's
    ``eager`` backend: the same graph count, no C++ build."""
    block = TinyBlock()
    block.compile(dynamic=False, backend="eager")
    return block


def test_graph_count_moves_on_a_new_shape_and_not_on_a_repeated_one() -> None:
    block = eager_compiled_block()
    counts: list[int] = []
    for rows in (2, 2, 3, 3, 2):
        before = compiled_graph_count()
        block(torch.randn(rows, 4))
        after = compiled_graph_count()
        assert before is not None and after is not None
        counts.append(after - before)
    assert counts == [1, 0, 1, 0, 0]


def _rollouts(watch: RecompileWatch, block: TinyBlock, rows_per_rollout: list[int]) -> list[dict]:
    out = []
    for k, rows in enumerate(rows_per_rollout):
        block(torch.randn(rows, 4))
        block(torch.randn(rows, 4))  # a repeated shape inside the rollout compiles nothing
        out.append(watch.after_rollout(k, dynamic=False))
    return out


def test_warns_once_when_graphs_keep_being_compiled_after_warm_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    block = eager_compiled_block()
    watch = RecompileWatch()
    metrics = _rollouts(watch, block, [2, 3, 4, 5])
    assert [m["compile/new_graphs"] for m in metrics] == [1.0, 1.0, 1.0, 1.0]
    lines = [line for line in capsys.readouterr().out.splitlines() if "[unirl]" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("[unirl] warning: 1 graphs were compiled during rollout 1 ")
    for knob in ("backend.fsdp.compile_dynamic=null", "backend.fsdp.compile=false", "Pad"):
        assert knob in lines[0]
    assert watch.warned


def test_no_warning_while_shapes_stay_fixed(capsys: pytest.CaptureFixture[str]) -> None:
    block = eager_compiled_block()
    watch = RecompileWatch()
    metrics = _rollouts(watch, block, [2, 2, 2])
    assert [m["compile/new_graphs"] for m in metrics] == [1.0, 0.0, 0.0]  # the warm-up's graph
    assert "[unirl]" not in capsys.readouterr().out
    assert not watch.warned


def test_an_unknown_count_is_said_once_and_records_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compile_watch, "compiled_graph_count", lambda: None)
    watch = RecompileWatch()
    assert watch.after_rollout(0) == {} and watch.after_rollout(1) == {}
    out = capsys.readouterr().out
    assert out.count("[unirl] note:") == 1 and "compile/new_graphs is not recorded" in out
    assert not watch.warned


def test_a_dynamo_reset_counts_from_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = iter([5, 7, 2])
    monkeypatch.setattr(compile_watch, "compiled_graph_count", lambda: next(counts))
    watch = RecompileWatch()
    assert watch.new_graphs() == 2
    assert watch.new_graphs() == 2  # 7 -> 2: reset in between, 2 graphs since


# -- through a train stack ------------------------------------------------------------------------


class ShapeScriptedLoss(StageAlgorithm):
    """A loss on one LoRA weight plus a compiled block called at the rollout's scripted row
    count (standing in for a transformer block that sees the prompt's text length)."""

    requires_log_prob = False

    def __init__(self, block: nn.Module, rows: list[int]) -> None:
        super().__init__()
        self.block = block
        self.rows = list(rows)
        self.rollout = 0

    def start_rollout(self, rollout_index: int) -> None:
        self.rollout = rollout_index

    def compute_loss_and_backward(self, conditions, segment, advantages, loss_scale):
        p = self.backend.trainable_parameters()[0]
        with torch.no_grad():
            extra = self.block(torch.ones(self.rows[self.rollout], 4)).sum()
        loss = p.float().square().sum() * 1e-3 + extra * 0.0
        (loss * loss_scale).backward()
        return StepResult(loss=float(loss.detach()) * loss_scale, terms={})

    def summarize(self, terms):
        return {}


def _train(
    rows: list[int], *, compile_blocks: bool, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, float]]:
    """Rollout by rollout, the driver's view of the stack's steps (two updates per rollout,
    averaged as ``StageTrainer.train_stages`` does)."""
    for name in ("recompile_limit", "cache_size_limit"):  # apply_compile raises them
        if hasattr(torch._dynamo.config, name):
            monkeypatch.setattr(torch._dynamo.config, name, getattr(torch._dynamo.config, name))
    block = TinyBlock()
    if compile_blocks:
        apply_compile([block])  # the real path: inductor, fixed shapes
    backend = make_backend(bundle=TinyBundle(), fsdp=FSDPConfig(compile=compile_blocks))
    stack = TrainStack(
        backend=backend,
        algorithm=ShapeScriptedLoss(block, rows),
        micro_batch_size=2,
        num_updates_per_batch=2,
        shuffle=False,
    )
    return [
        mean_over_ranks(stack.train_track(empty_track(4), k)["steps"]) for k in range(len(rows))
    ]


def test_a_compiled_stack_reports_new_graphs_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    per_rollout = _train([2, 2, 3, 5], compile_blocks=True, monkeypatch=monkeypatch)
    # rollout 0 compiles the block at 2 rows; 1 repeats it; 2 and 3 each meet a new shape
    assert [m["compile/new_graphs"] for m in per_rollout] == [1.0, 0.0, 1.0, 1.0]
    lines = [line for line in capsys.readouterr().out.splitlines() if "[unirl]" in line]
    assert len(lines) == 1 and "compiled during rollout 2 (after warm-up" in lines[0], lines


def test_the_warning_names_the_familys_knob_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle's ``recompile_hint`` (Z-Image: ``bundle.cfg_split_uneven=true``) comes first
    in the one warning, before the generic advice."""
    hint = "set bundle.some_knob=true (why)"
    monkeypatch.setattr(TinyBundle, "recompile_hint", lambda self: hint, raising=False)
    _train([2, 3], compile_blocks=True, monkeypatch=monkeypatch)
    lines = [line for line in capsys.readouterr().out.splitlines() if "[unirl]" in line]
    assert len(lines) == 1, lines
    assert f"This family: {hint}. Pad the inputs" in lines[0]
    assert recompile_warning(1, 1, False) == recompile_warning(1, 1, False, None)
    assert "This family" not in recompile_warning(1, 1, False)


def test_an_eager_stack_records_no_compile_metric(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    per_rollout = _train([2, 3], compile_blocks=False, monkeypatch=monkeypatch)
    assert all("compile/new_graphs" not in m for m in per_rollout)
    assert "[unirl]" not in capsys.readouterr().out


def test_the_warning_names_what_compiled_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    """The warning lists the compiled frames of the rollout that recompiled (function, file,
    line) and dynamo's recompile reason, so a compiled VAE that recompiles is not mistaken for
    the transformer blocks; the warm-up's own compile is not listed."""
    block = eager_compiled_block()
    watch = RecompileWatch()
    _rollouts(watch, block, [2, 3])
    lines = [line for line in capsys.readouterr().out.splitlines() if "[unirl]" in line]
    assert len(lines) == 1, lines
    line = lines[0]
    line_no = TinyBlock.forward.__code__.co_firstlineno
    assert f"; what compiled: forward (test_compile_watch.py:{line_no}) x1; " in line, line
    assert "first recompile: " in line and "size mismatch at index 0. expected 2, actual 3" in line


def test_describe_compiles_groups_by_frame_most_first() -> None:
    def record(name: str, line: int, reason: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(
            co_name=name, co_filename=f"/x/{name}.py", co_firstlineno=line, recompile_reason=reason
        )

    records = [record("decode", 9), *[record("forward", 5, "0/3: grad_mode")] * 3]
    assert (
        describe_compiles(records, top=1)
        == "forward (forward.py:5) x3 and 1 more; first recompile: 0/3: grad_mode"
    )
    assert describe_compiles([]) is None
