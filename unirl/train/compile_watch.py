"""Counting the graphs ``torch.compile`` builds in this process, so that a run whose compiled
blocks (``backend.fsdp.compile``) recompile every rollout says so instead of silently running
slower than eager.

A block compiled at fixed shapes (``fsdp.compile_dynamic=false``) builds one graph per input
shape. A family whose joint text+image sequence changes with every prompt (Qwen-Image,
Z-Image) meets new shapes in later rollouts and compiles new graphs inside the timed step
(Z-Image at static shapes: 0.64x its eager step on one H200, docs/performance.md). The train stacks keep
a :class:`RecompileWatch`: it reports ``compile/new_graphs`` per rollout and prints one warning
once graphs are still being compiled after the first rollout (the warm-up). The warning names
what compiled (function, file and line, and dynamo's reason for the first recompile), so a
compiled VAE or reward model that recompiles is told apart from the transformer blocks.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

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


def compile_records() -> list[Any] | None:
    """dynamo's record of each frame it compiled in this process (oldest first, the last few
    dozen), or ``None`` when this torch keeps none. Read from
    ``torch._dynamo.utils.get_compilation_metrics`` (checked with torch 2.13): each record has
    ``co_name``, ``co_filename``, ``co_firstlineno`` and ``recompile_reason`` (None for a
    first compile)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return None
    try:
        return list(get_compilation_metrics())
    except Exception:  # an internal API: a torch that changed it describes nothing
        return None


def describe_compiles(records: Sequence[Any], top: int = 3) -> str | None:
    """``"forward (transformer_wan.py:512) x14, decode (vae.py:88) x1; first recompile: …"``:
    the compiled frames grouped by function, most first, and dynamo's first recompile reason
    (None when there is no record)."""
    where: Counter[str] = Counter()
    reason = None
    for record in records:
        name = getattr(record, "co_name", None) or "?"
        path = os.path.basename(str(getattr(record, "co_filename", "") or "?"))
        where[f"{name} ({path}:{getattr(record, 'co_firstlineno', '?')})"] += 1
        reason = reason or getattr(record, "recompile_reason", None)
    if not where:
        return None
    listed = ", ".join(f"{frame} x{n}" for frame, n in where.most_common(top))
    if len(where) > top:
        listed += f" and {len(where) - top} more"
    if reason:
        listed += f"; first recompile: {' '.join(str(reason).split())[:200]}"
    return listed


def recompile_warning(
    new_graphs: int,
    rollout_index: int,
    dynamic: object,
    hint: str | None = None,
    compiled: str | None = None,
) -> str:
    """The one line :class:`RecompileWatch` prints: how many graphs, when, what compiled
    (``compiled``, from :func:`describe_compiles`), why, and the knobs that stop it
    (``dynamic``: what the blocks compiled with, so the advice differs; ``hint``: the
    family's own knob, first, when the bundle names one)."""
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
        "(after warm-up, backend.fsdp.compile=true)"
        + (f"; what compiled: {compiled}" if compiled else "")
        + ". A compiled module that sees new inputs each step (the transformer blocks at a "
        "text length that changes per prompt?) recompiles, which costs seconds per step and "
        "can make the run slower than eager. "
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
        self._seen = self._record_keys()
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

    @staticmethod
    def _key(record: Any) -> tuple[str, object, object]:
        return (
            str(getattr(record, "compile_id", "")),
            getattr(record, "start_time_us", None),
            getattr(record, "co_name", None),
        )

    @classmethod
    def _record_keys(cls) -> set[tuple[str, object, object]]:
        return {cls._key(r) for r in compile_records() or []}

    def new_records(self) -> list[Any]:
        """dynamo's compile records added since the previous call (or construction)."""
        records = compile_records() or []
        fresh = [r for r in records if self._key(r) not in self._seen]
        self._seen = {self._key(r) for r in records}
        return fresh

    def after_rollout(
        self, rollout_index: int, dynamic: object = False, hint: str | None = None
    ) -> dict[str, float]:
        """``{"compile/new_graphs": n}`` for the rollout that just trained (empty when the
        count is unknown); warns once when ``n > 0`` after the warm-up. ``dynamic``: the
        ``dynamic`` the blocks compiled with, and ``hint`` the family's knob, for the advice."""
        new = self.new_graphs()
        fresh = self.new_records()
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
                compiled = describe_compiles(fresh)
                print(recompile_warning(new, rollout_index, dynamic, hint, compiled), flush=True)
        return {"compile/new_graphs": float(new)}
