"""``StageAlgorithm``: the loss node that consumes one track's segment and calls ``backward()``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Protocol, TypeVar, cast

import torch

from unirl.algorithms.kl import KLConfig, KLController, KLState, as_kl_config
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import Batch, Conditions

# the segment a loss node trains on: LatentSegment (diffusion) or TextSegment (text)
SegmentT = TypeVar("SegmentT", bound=Batch)


class NamedAdapter(Protocol):
    """The LoRA settings a loss node reads: the trained adapter's name."""

    @property
    def adapter_name(self) -> str: ...


class TrainBackend(Protocol):
    """What a loss node is bound to on each train worker (``unirl.train.backend.FSDPBackend``
    provides it): the adapters of the trained module and the switches between them.
    ``has_lora``, ``device`` and ``policy_version`` are read with ``getattr`` defaults."""

    @property
    def lora(self) -> NamedAdapter | None: ...

    @property
    def adapters(self) -> list[str]: ...

    def adapter_disabled(self) -> AbstractContextManager[None]: ...

    def set_active_adapter(self, name: str) -> AbstractContextManager[None]: ...

    def sync_adapter(self, dst: str, *, src: str | None = None, decay: float = 0.0) -> None: ...


@dataclass
class StepResult:
    """What one micro-batch returns: its scalar ``loss`` (already backpropagated; a detached
    0-dim tensor, so the train stack reads it once per optimizer step without a host sync per
    micro-batch) and raw per-term tensors (``terms``) that :meth:`StageAlgorithm.summarize`
    turns into metrics."""

    loss: float | torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


class StageAlgorithm(ABC, Generic[SegmentT]):
    """A small loss node. Class knobs tell the train stack how to drive it.

    - ``supports_multi_update``: may take several optimizer steps per rollout.
    - ``requires_log_prob``: needs per-step log-probs from the SDE strategy (ratio losses).
    - ``stores_steps``: the rollout stores the inputs of the recipe's ``sampling.sde_steps``
      even when no log-probs are needed (reward-gradient losses restart the chain there).
    - ``requires_ema_rollout``: rollout must run with the EMA / old weights (NFT); the
      adapter it names in :meth:`sampling_adapter` is switched in by the trainer.

    ``kl`` (the recipe's ``algorithm.kl``, a :class:`KLConfig`; absent: no KL term) configures
    ``kl_controller``, the β of the KL to the frozen reference; the base updates it in
    :meth:`after_train` and carries it in :meth:`state_dict`.
    """

    supports_multi_update: ClassVar[bool] = True
    requires_log_prob: ClassVar[bool] = True
    requires_ema_rollout: ClassVar[bool] = False
    stores_steps: ClassVar[bool] = False

    def __init__(self, *, kl: KLConfig | Mapping[str, object] | None = None) -> None:
        self._reference: Callable[[], AbstractContextManager[None]] | None = None
        self.backend: TrainBackend | None = None
        self.kl_controller = KLController(as_kl_config(kl))

    def bind_reference(self, reference: Callable[[], AbstractContextManager[None]] | None) -> None:
        """Install the context that turns the trained module into the frozen reference
        (the backend's ``adapter_disabled``)."""
        self._reference = reference

    def bind_backend(self, backend: TrainBackend) -> None:
        """Called by the train stack on each worker: the backend that owns the trained module
        (adapters, EMA). The reference policy is the base with the LoRA adapter disabled."""
        self.backend = backend
        self.bind_reference(
            backend.adapter_disabled if getattr(backend, "has_lora", False) else None
        )

    # -- loop hooks (driver-callable; every train worker runs them) -----------------------------

    def sampling_adapter(self, mode: str) -> str | None:
        """The adapter a ``train`` or ``eval`` rollout samples with, or ``None`` for the
        trained weights as they are. The trainer switches it (``TrainOps.begin_sampling``):
        a loss node declares, it never steers the sampler. NFT: its old adapter for train."""
        return None

    def start_rollout(self, rollout_index: int) -> None:
        """Called by the train stack before it trains on rollout ``rollout_index`` (NFT seeds
        its training noise with it)."""
        return None

    @distributed(dispatch=Dispatch.BROADCAST)
    def after_train(self, rollout_index: int) -> dict[str, float]:
        """After the optimizer steps of a rollout (e.g. NFT's EMA of the old adapter);
        returns metrics. Default: :meth:`kl_after_train`."""
        return self.kl_after_train()

    def kl_after_train(self) -> dict[str, float]:
        """Close the rollout for the KL controller: rank-averaged mean KL, next β (adaptive).
        A collective when torch.distributed is up, so every rank must run it."""
        return self.kl_controller.step(device=getattr(self.backend, "device", None))

    # -- resumable state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, object]:
        """What a resume needs beyond the weights: ``{"kl_controller": ...}``."""
        return {"kl_controller": self.kl_controller.state_dict()}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Inverse of :meth:`state_dict`. An adaptive controller needs its saved state."""
        unknown = sorted(set(state) - {"kl_controller"})
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown algorithm state key(s) {unknown}")
        kl_state = state.get("kl_controller")
        if kl_state is None:
            if self.kl_controller.control == "adaptive":
                raise ValueError(
                    f"{type(self).__name__}: the checkpoint holds no KL-controller state, so the "
                    "adaptive β cannot be restored; resume from a checkpoint saved with it or "
                    "set algorithm.kl.control=fixed"
                )
            return
        self.kl_controller.load_state_dict(cast(KLState, kl_state))  # our state_dict's

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def algorithm_state(self) -> dict[str, object]:
        """Rank 0's :meth:`state_dict` (every rank holds the same one) for the checkpoint."""
        return self.state_dict()

    @distributed(dispatch=Dispatch.BROADCAST)
    def load_algorithm_state(self, state: Mapping[str, object]) -> None:
        """Restore the checkpoint's :meth:`state_dict` on every rank."""
        self.load_state_dict(state)

    def reference(self) -> AbstractContextManager[None]:
        if self._reference is None:
            raise RuntimeError(
                f"{type(self).__name__} needs a reference policy (kl.beta > 0) but none is bound; "
                "the train stack binds the backend's adapter_disabled() when LoRA is on"
            )
        return self._reference()

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: SegmentT) -> SegmentT:
        """Freeze π_old for this micro-batch (default: keep the rollout's anchors)."""
        return segment

    def prepare_batch(
        self, micro: list[tuple[Conditions, SegmentT, torch.Tensor]]
    ) -> list[tuple[Conditions, SegmentT, torch.Tensor]]:
        """After :meth:`prepare_segment` has run on every micro-batch of this rank's rollout
        and before any update: ``micro`` is every ``(conditions, segment, advantages)``; return
        them (changed where a loss needs statistics over the whole batch, e.g. REINFORCE++'s
        batch-normalised token advantages). Default: unchanged."""
        return micro

    def micro_batch_weight(self, segment: SegmentT, advantages: torch.Tensor) -> float:
        """This micro-batch's weight in the mini-batch loss: the train stack scales its loss
        by ``weight / Σ weights`` of the mini-batch. Default: its sample count (the loss is a
        mean over samples); a token-mean loss weighs by loss tokens."""
        return float(len(advantages))

    @abstractmethod
    def compute_loss_and_backward(
        self,
        conditions: Conditions,
        segment: SegmentT,
        advantages: torch.Tensor,
        loss_scale: float,
    ) -> StepResult:
        """Loss of one micro-batch times ``loss_scale``, backpropagated; returns its terms."""

    @abstractmethod
    def summarize(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """Metrics from the concatenated terms of every micro-batch of one optimizer step."""
