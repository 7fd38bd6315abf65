"""What both prompt-enhancer layouts place beside the drawer (the trainside one in ``pe`` and
the served one in ``pe_served``, which ``pe`` builds, so it lives apart from both):
:class:`DrawerInfo`, the drawer facts the driver authors requests from. The stages' own roles
come from :func:`unirl.trainer.roles.stage_roles`, as every domain's do."""

from __future__ import annotations

from typing import Any

from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import DiffusionSamplingParams


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
