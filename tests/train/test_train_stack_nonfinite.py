"""TrainStack never skips a non-finite step silently: it counts it, logs it, does not apply
it, and stops after ``max_nonfinite_in_row`` in a row with the step in the message. A device
out-of-memory error in the step names the knobs that lower its memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_fakes import TinyBundle, empty_track, make_backend

from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.train import NonFiniteError, TrainStack


class ScriptedLoss(StageAlgorithm):
    """A loss on one LoRA weight whose value per call comes from a script (NaN or finite)."""

    requires_log_prob = False

    def __init__(self, script: list[float]) -> None:
        super().__init__()
        self.script = list(script)

    def compute_loss_and_backward(self, conditions, segment, advantages, loss_scale):
        p = self.backend.trainable_parameters()[0]
        value = self.script.pop(0)
        loss = (p.float().sum() * 0 + value) + p.float().square().sum() * 1e-3
        (loss * loss_scale).backward()
        return StepResult(loss=float(loss.detach()) * loss_scale, terms={})

    def summarize(self, terms):
        return {}


def test_nonfinite_steps_are_counted_skipped_and_stop_the_run() -> None:
    backend = make_backend(bundle=TinyBundle())
    algorithm = ScriptedLoss([1.0, float("nan"), 2.0, float("nan"), float("inf"), float("nan")])
    stack = TrainStack(
        backend=backend, algorithm=algorithm, micro_batch_size=2, max_nonfinite_in_row=3
    )
    first = stack.train_track(empty_track(2), 0)["steps"][0]
    assert first["nonfinite/count"] == 0.0 and "nonfinite/skipped_step" not in first
    before = {k: v.clone() for k, v in backend.full_trainable_state().items()}
    second = stack.train_track(empty_track(2), 1)["steps"][0]
    assert second["nonfinite/skipped_step"] == 1.0 and second["nonfinite/count"] == 1.0
    after = backend.full_trainable_state()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the NaN step was not applied
    stack.train_track(empty_track(2), 2)  # finite: resets the run of non-finite steps
    assert stack.nonfinite_in_row == 0 and stack.nonfinite_total == 1
    stack.train_track(empty_track(2), 3)
    stack.train_track(empty_track(2), 4)
    with pytest.raises(NonFiniteError, match=r"3 non-finite optimizer steps in a row .* rollout 5"):
        stack.train_track(empty_track(2), 5)
    assert stack.nonfinite_total == 4


# ----------------------------------------------------------------------------- out of memory
class OutOfMemoryLoss(ScriptedLoss):
    """Fails like a CUDA allocation in the training forward; ``slots_per_forward`` as the
    replay losses carry it."""

    def __init__(self, slots_per_forward: int = 1) -> None:
        super().__init__([])
        self.slots_per_forward = slots_per_forward

    def compute_loss_and_backward(self, conditions, segment, advantages, loss_scale):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")


@pytest.mark.parametrize("slots", [1, 3])
def test_out_of_memory_names_the_knobs_that_lower_the_step(slots: int) -> None:
    stack = TrainStack(
        backend=make_backend(bundle=TinyBundle()),
        algorithm=OutOfMemoryLoss(slots),
        micro_batch_size=2,
    )
    with pytest.raises(torch.OutOfMemoryError) as info:
        stack.train_track(empty_track(2), 4)
    knobs = "stack.micro_batch_size (now 2)"
    if slots > 1:
        knobs += " or algorithm.slots_per_forward (now 3)"
    assert str(info.value) == (
        f"out of memory in the training step of rollout 4: lower {knobs}, or set "
        "backend.fsdp.activation_checkpointing=true; CUDA out of memory. Tried to allocate "
        "2.00 GiB."
    )
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)


def test_troubleshooting_quotes_the_out_of_memory_line() -> None:
    stack = TrainStack(
        backend=make_backend(bundle=TinyBundle()),
        algorithm=OutOfMemoryLoss(3),
        micro_batch_size=8,  # the SD3 GPU recipes' micro-batch, as the page shows
    )
    with pytest.raises(torch.OutOfMemoryError) as info:
        stack.train_track(empty_track(8), 0)
    hint = str(info.value).split("; CUDA out of memory")[0]
    page = (Path(__file__).parents[2] / "docs" / "troubleshooting.md").read_text()
    assert f"OutOfMemoryError: {hint}; CUDA out of memory." in page
