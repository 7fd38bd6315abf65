"""Counting the graphs ``torch.compile`` builds in this process, so that a run whose compiled
blocks (``backend.fsdp.compile``) recompile every rollout says so instead of silently running
slower than eager.

A block compiled at fixed shapes (``fsdp.compile_dynamic=false``) builds one graph per input
shape. A family whose joint text+image sequence changes with every prompt (Qwen-Image,
Z-Image) meets new shapes in later rollouts and compiles new graphs inside the timed step
(Z-Image at static shapes: 0.64x its eager step on one H200, docs/performance.md). The train stacks keep
a :class:`RecompileWatch`: it reports ``compile/new_graphs`` per rollout and prints one warning
once graphs are still being compiled after the first rollout (the warm-up).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from unirl.train.parallel import world_info


def compiled_graph_count() -> int | None:
    """How many graphs dynamo has compiled in this process so far, or ``None`` (unknown) when
    this torch does not expose the count.

    torch has no public counter of compiled graphs; this reads dynamo's
    ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (checked with torch 2.13: it
    moves by one per new graph, e.g. a compiled block called at a new input shape, and not on a
    repeated shape). Process-wide: every compiled module in the process counts (the blocks, a
    compiled VAE). ``torch._dynamo.reset()`` sets it back to 0.
    """
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a torch without dynamo's counters: unknown, never an error
        return None
    stats = counters.get("stats") if isinstance(counters, Mapping) else None
    if stats is None:  # nothing compiled yet (the counters are filled on first use)
        return 0 if isinstance(counters, Mapping) else None
    value = stats.get("unique_graphs", 0) if isinstance(stats, Mapping) else None
    return int(value) if isinstance(value, int) else None


def recompile_warning(
    new_graphs: int, rollout_index: int, dynamic: object, hint: str | None = None
) -> str:
    """The one line :class:`RecompileWatch` prints: how many graphs, when, why, and the knobs
    that stop it (``dynamic``: what the blocks compiled with, so the advice differs; ``hint``:
    the family's own knob, first, when the bundle names one)."""
    if dynamic is False:
        shapes = "set backend.fsdp.compile_dynamic=null (symbolic shapes after one change)"
    elif dynamic is None:
        shapes = "set backend.fsdp.compile_dynamic=true (symbolic shapes at once)"
    elif dynamic is True:  # symbolic already: something else changes (dtype, grad mode, …)
        shapes = "check what else changes between steps (TORCH_LOGS=recompiles names it)"
    else:
        shapes = "set backend.fsdp.compile_dynamic=null or true"
    return (
        f"[unirl] warning: {new_graphs} graphs were compiled during rollout {rollout_index} "
        "(after warm-up, backend.fsdp.compile=true): the compiled transformer blocks see a new "
        "input shape each step (a text length that changes per prompt?); recompiling costs "
        "seconds per step and can make the run slower than eager. "
        + (f"This family: {hint}. " if hint else "")
        + f"Pad the inputs to fixed shapes, {shapes}, or set backend.fsdp.compile=false"
    )


class RecompileWatch:
    """Graphs compiled in this process per rollout, and one warning per run once they keep
    coming after the warm-up.

    Create it before the first rollout (a stack does at construction); call
    :meth:`after_rollout` at the end of each rollout's train step: it returns
    ``{"compile/new_graphs": n}``, the graphs compiled since the previous call (the rollout's
    sampling, an eval before it, the π_old replay and the updates). The first call is the
    warm-up (the first rollout this process trains, also after a resume); when a later call
    sees new graphs, rank 0 prints :func:`recompile_warning` once. When the count is unknown
    (:func:`compiled_graph_count` is ``None``) it says so once and returns no metric.
    """

    def __init__(self) -> None:
        self._last = compiled_graph_count()
        self.rollouts_seen = 0
        self.warned = False
        self._said_unknown = False

    def new_graphs(self) -> int | None:
        """Graphs compiled since the previous call (or construction); ``None``: unknown."""
        now = compiled_graph_count()
        last, self._last = self._last, now
        if now is None:
            return None
        if last is None or now < last:  # dynamo was reset in between: count from 0
            return now
        return now - last

    def after_rollout(
        self, rollout_index: int, dynamic: object = False, hint: str | None = None
    ) -> dict[str, float]:
        """``{"compile/new_graphs": n}`` for the rollout that just trained (empty when the
        count is unknown); warns once when ``n > 0`` after the warm-up. ``dynamic``: the
        ``dynamic`` the blocks compiled with, and ``hint`` the family's knob, for the advice."""
        new = self.new_graphs()
        self.rollouts_seen += 1
        announce = world_info()[0] == 0
        if new is None:
            if announce and not self._said_unknown:
                self._said_unknown = True
                print(
                    f"[unirl] note: torch {torch.__version__} does not expose dynamo's count "
                    "of compiled graphs; compile/new_graphs is not recorded and recompiles "
                    "of the compiled blocks are not reported",
                    flush=True,
                )
            return {}
        if new > 0 and self.rollouts_seen > 1 and not self.warned:
            self.warned = True  # once per run, on every rank (only rank 0 prints)
            if announce:
                print(recompile_warning(new, rollout_index, dynamic, hint), flush=True)
        return {"compile/new_graphs": float(new)}
