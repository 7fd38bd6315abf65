"""PromptFileSource: deterministic, resumable batches of prompts from one prompt file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

import numpy as np

from unirl.config import ConfigError, require
from unirl.data.prompts import PromptExample, PromptFileError, read_prompt_file


class PromptSourceState(TypedDict):
    """:meth:`PromptFileSource.state_dict`: where the next batch starts (older checkpoints
    lack the two counts)."""

    epoch: int
    position: int
    num_prompts: NotRequired[int]
    held_out: NotRequired[int]


@dataclass(kw_only=True)
class PromptFileSource:
    """Serves ``prompts_per_rollout`` prompts per call, epoch after epoch.

    Epoch ``e`` visits the prompts in the order ``permutation(seed, e)`` (a NumPy generator
    seeded with ``[seed, e]``), or in file order when ``shuffle=False``. At the end of an
    epoch, ``drop_last=True`` skips the leftover prompts (< one batch); ``drop_last=False``
    serves them topped up with the first prompts of the next epoch, so batches keep their
    size and every prompt is served once per epoch. ``state_dict()`` / ``load_state_dict()``
    make the sequence resumable exactly. ``path``: the prompt file (``.txt``: one prompt per
    line; ``.jsonl`` / ``.json``: records with a ``prompt``). ``seed``: the shuffle's seed.
    """

    path: str
    prompts_per_rollout: int | None = None
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = True
    _examples: list[PromptExample] = field(init=False, repr=False, default_factory=list)
    _order: np.ndarray | None = field(init=False, repr=False, default=None)
    _epoch: int = field(init=False, repr=False, default=0)
    _position: int = field(init=False, repr=False, default=0)
    _held_out: list[PromptExample] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        self.path = str(self.path)
        self._examples = read_prompt_file(self.path)
        if self.prompts_per_rollout is not None:
            self.set_prompts_per_rollout(self.prompts_per_rollout)

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """Before anything is built (``unirl.config.validate``'s component hooks): the prompt
        files the run reads parse whole, ``path`` and the recipe's ``eval.prompts_path``
        (read by the trainer in the same format). An empty or malformed file is refused in one
        line naming the field, file and line; a missing one is left to the validator's own
        line."""
        evaluation = getattr(recipe, "eval", None)
        for name, path in (
            ("data_source.path", block.get("path")),
            ("eval.prompts_path", getattr(evaluation, "prompts_path", None)),
        ):
            if not path or not os.path.isfile(str(path)):
                continue
            try:
                read_prompt_file(str(path))
            except PromptFileError as exc:
                raise ConfigError(f"{name}: {exc}") from None

    def hold_out(self, count: int) -> list[PromptExample]:
        """Remove the last ``count`` prompts of the file from training and return them (the
        trainer's default eval set when the recipe names no eval file). Call before the first
        batch; the state's ``num_prompts`` counts the training prompts only."""
        require(
            0 < count < len(self._examples),
            f"PromptFileSource: cannot hold out {count} of the {len(self._examples)} prompts of "
            f"{self.path} for eval and still train; lower eval.num_prompts or give "
            "eval.prompts_path",
        )
        require(
            self._epoch == 0 and self._position == 0 and not self._held_out,
            "PromptFileSource.hold_out: call it once, before the first batch",
        )
        self._held_out = self._examples[-count:]
        self._examples = self._examples[:-count]
        self._order = None
        if self.prompts_per_rollout is not None:
            self.set_prompts_per_rollout(self.prompts_per_rollout)
        return list(self._held_out)

    @property
    def held_out(self) -> list[PromptExample]:
        """The prompts :meth:`hold_out` removed (empty if none)."""
        return list(self._held_out)

    def set_prompts_per_rollout(self, prompts_per_rollout: int) -> None:
        """Fix the batch size (the trainer sets it from ``batch_size``)."""
        require(
            isinstance(prompts_per_rollout, int) and prompts_per_rollout > 0,
            f"PromptFileSource.prompts_per_rollout={prompts_per_rollout!r}: must be a positive int",
        )
        require(
            prompts_per_rollout <= len(self._examples),
            f"PromptFileSource: {self.path} has {len(self._examples)} prompts, fewer than "
            f"prompts_per_rollout={prompts_per_rollout}; use a larger prompt file or a smaller "
            "batch_size",
        )
        self.prompts_per_rollout = prompts_per_rollout

    def __len__(self) -> int:
        """Number of prompts in the file."""
        return len(self._examples)

    @property
    def examples(self) -> list[PromptExample]:
        """All examples in file order."""
        return self._examples

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def batches_per_epoch(self) -> int:
        """Full batches served per epoch (``drop_last=False`` tops up the last one)."""
        per = self._batch_size()
        n = len(self._examples)
        return n // per if self.drop_last else -(-n // per)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Prompt indices in the order epoch ``epoch`` serves them: ``int64[len(self)]``."""
        n = len(self._examples)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(n).astype(np.int64)

    def next_batch(self) -> list[PromptExample]:
        """The next ``prompts_per_rollout`` examples."""
        per = self._batch_size()
        picked: list[int] = []
        while len(picked) < per:
            order = self._current_order()
            remaining = len(order) - self._position
            need = per - len(picked)
            if remaining >= need:
                picked.extend(order[self._position : self._position + need].tolist())
                self._position += need
            elif self.drop_last or remaining == 0:
                self._advance_epoch()
            else:
                picked.extend(order[self._position :].tolist())
                self._advance_epoch()
        if self._position == len(self._examples):
            self._advance_epoch()
        return [self._examples[i] for i in picked]

    def state_dict(self) -> PromptSourceState:
        """``{"epoch", "position", "num_prompts", "held_out"}``: where the next batch starts,
        over how many training prompts, with how many of the file's held out for eval."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "num_prompts": len(self),
            "held_out": len(self._held_out),
        }

    def load_state_dict(self, state: PromptSourceState) -> None:
        """Resume from :meth:`state_dict`; the prompt file must have the same length."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if "num_prompts" in state and int(state["num_prompts"]) != len(self):
            then, now = int(state["num_prompts"]), len(self)
            held_then, held_now = state.get("held_out"), len(self._held_out)
            if held_then is not None and int(held_then) != held_now:
                raise ConfigError(
                    f"PromptFileSource: the checkpoint trained on {then} prompts of {self.path} "
                    f"with {held_then} held out for eval; this run holds out {held_now} "
                    f"({now} to train on). The held-out prompts follow eval_interval, "
                    "eval.num_prompts and eval.prompts_path: resume with the checkpointed "
                    "run's values"
                )
            held = f" after holding out {held_now} for eval" if held_now else ""
            raise ConfigError(
                f"PromptFileSource: checkpoint was taken on {then} training prompts but "
                f"{self.path} gives {now}{held}; resume with the same prompt file and eval "
                "settings (eval_interval, eval.num_prompts and eval.prompts_path decide the "
                "prompts held out for eval)"
            )
        if epoch < 0 or not 0 <= position <= len(self):
            raise ConfigError(f"PromptFileSource: invalid state {state}")
        self._epoch, self._position, self._order = epoch, position, None

    def _batch_size(self) -> int:
        if self.prompts_per_rollout is None:
            raise ConfigError(
                "PromptFileSource.prompts_per_rollout is not set; set it in the data_source "
                "block or let the trainer call set_prompts_per_rollout(batch_size)"
            )
        self.set_prompts_per_rollout(self.prompts_per_rollout)
        return self.prompts_per_rollout

    def _current_order(self) -> np.ndarray:
        if self._order is None:
            self._order = self.epoch_order(self._epoch)
        return self._order

    def _advance_epoch(self) -> None:
        self._epoch += 1
        self._position = 0
        self._order = None
