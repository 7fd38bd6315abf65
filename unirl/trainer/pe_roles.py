"""The roles of the prompt-enhancer trainer's two stages, shared by both of its layouts: the
trainside one in ``pe`` and the served one in ``pe_served`` (which ``pe`` builds, so these live
apart from both: neither module imports the other's roles back).

- :func:`stage_roles`: one stage's bundle, pipeline and, when it trains, backend, algorithm,
  stack and ops in the current placement block;
- :class:`DrawerInfo`: the drawer facts the driver authors requests from.
"""

from __future__ import annotations

from typing import Any

from unirl.distributed.group import Handle, remote
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import DiffusionSamplingParams


def stage_roles(
    blocks: Any, prefix: str, *, algorithm_takes: str, ops_class: type
) -> dict[str, Handle]:
    """One stage's roles in the current placement block, named ``<prefix>_<role>``: bundle and
    pipeline, then (when ``blocks.backend`` is set) backend, algorithm (given the pipeline as
    ``algorithm_takes``), stack and ops."""
    bundle = remote(blocks.bundle, name=f"{prefix}_bundle")
    pipeline = remote(blocks.pipeline, name=f"{prefix}_pipeline", bundle=bundle)
    roles = {"bundle": bundle, "pipeline": pipeline}
    if blocks.backend is None:
        return roles
    backend = remote(blocks.backend, name=f"{prefix}_backend", bundle=bundle)
    needs: dict[str, Any] = {algorithm_takes: pipeline}  # the policy / the pipeline it replays
    algorithm = remote(blocks.algorithm, name=f"{prefix}_algorithm", **needs)
    stack = remote(blocks.stack, name=f"{prefix}_stack", backend=backend, algorithm=algorithm)
    ops = remote(
        ops_class,
        name=f"{prefix}_ops",
        backend=backend,
        pipeline=pipeline,
        stack=stack,
        algorithm=algorithm,
    )
    return {**roles, "backend": backend, "algorithm": algorithm, "stack": stack, "ops": ops}


class DrawerInfo:
    """What the driver needs from the drawer's family to author requests (a frozen drawer has
    no ``TrainOps``): the latent of one image and the σ schedules of the train and eval step
    counts at the sampling size."""

    def __init__(self, *, pipeline: Any) -> None:
        self.pipeline = pipeline

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def describe(self, sampling: DiffusionSamplingParams) -> dict[str, Any]:
        bundle = self.pipeline.bundle
        height, width = int(sampling.height), int(sampling.width)
        return {
            "latent_shape": tuple(bundle.latent_shape_for(sampling)),
            "sigmas": {
                "train": bundle.sigmas(int(sampling.num_inference_steps), height, width),
                "eval": bundle.sigmas(int(sampling.eval_num_inference_steps), height, width),
            },
            "params": sum(
                p.numel() for m in bundle.trainable_modules.values() for p in m.parameters()
            ),
            "device": str(bundle.device),
        }
