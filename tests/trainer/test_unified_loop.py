"""The unified model's turn of the loop on a hand-built two-track response: each image's
reward reaches its text through lineage (the loop's ``propagate_rewards``), a dropped image
drops its text, advantages are computed per track in its own groups, and ONE joint step gets
both tracks.

The response: 2 prompts x 2 pairs; text ids 10-13 (groups 0 0 1 1), one image per text (ids
10-13 as well, ``parent_ids`` = the text ids). Image rewards 1, 3, 5, (9): the last image is
dropped by the reward. Group statistics of two values are exact in binary, so the
advantages written out here compare with ``==``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from trainer_fakes import DroppingReward, FixedEngine, IdleOps

from unirl.config.run import AdvantageConfig, RunConfig
from unirl.trainer.stage import order_stages
from unirl.trainer.unified_model import UnifiedModelTrainer
from unirl.types import STATUS_DROPPED, RolloutReq, RolloutResp, RolloutTrack, Texts

EPS = 1e-4
IDS = torch.tensor([10, 11, 12, 13])
GROUPS = torch.tensor([0, 0, 1, 1])


def _response() -> RolloutResp:
    meta = [{"response_tokens": 3, "finish_reason": "length"} for _ in range(4)]
    text = RolloutTrack(
        sample_ids=IDS.clone(),
        group_ids=GROUPS.clone(),
        prompts=["a cat", "a cat", "a dog", "a dog"],
        metadata=meta,
        decoded=Texts(texts=["t1", "t2", "t3", "t4"]),
    )
    image = RolloutTrack(
        sample_ids=IDS.clone(),
        group_ids=GROUPS.clone(),
        prompts=["a cat", "a cat", "a dog", "a dog"],
        metadata=[{"thought": t} for t in ("t1", "t2", "t3", "t4")],
        parent_ids=IDS.clone(),
        parent_track="text",
    )
    return RolloutResp(tracks={"text": text, "image": image})


class _JointStack:
    def __init__(self) -> None:
        self.calls: list[tuple[RolloutTrack, RolloutTrack]] = []

    def train_tracks(
        self, text: RolloutTrack, image: RolloutTrack, rollout_index: int
    ) -> list[dict[str, Any]]:
        self.calls.append((text, image))
        return [{"steps": [{"loss": 0.5, "text/loss": 0.2}], "param_checksum": 1.0}]


class _Algorithm:
    def __init__(self) -> None:
        self.after = 0

    def after_train(self, rollout_index: int) -> list[dict[str, float]]:
        self.after += 1
        return [{"kl/beta": 0.0}]


def _adv(r: float, a: float, b: float) -> float:
    mean, std = (a + b) / 2, abs(a - b) / 2
    return (r - mean) / (std + EPS)


def test_image_rewards_reach_the_text_and_one_joint_step_trains_both() -> None:
    cfg = RunConfig(
        batch_size=2, advantage=AdvantageConfig(scope="group", std="group", eps=EPS, clip=5.0)
    )
    cfg.logging.gallery_interval = 0
    trainer = UnifiedModelTrainer.__new__(UnifiedModelTrainer)  # the loop only: no Ray
    trainer.cfg = cfg
    trainer.rollout = FixedEngine(_response)
    trainer.data_source = SimpleNamespace(next_batch=lambda: ["a cat", "a dog"], epoch=0)
    trainer.build_request = lambda prompts, k, mode="train": RolloutReq(  # type: ignore[method-assign]
        sample_ids=IDS.clone(),
        group_ids=GROUPS.clone(),
        primitives={"text": Texts(texts=["a cat", "a cat", "a dog", "a dog"])},
    )
    stack, text_alg, image_alg = _JointStack(), _Algorithm(), _Algorithm()
    trainer.stages = order_stages(
        trainer.make_stages(
            stack=stack,
            ops=IdleOps(),
            text_algorithm=text_alg,
            image_algorithm=image_alg,
            reward=DroppingReward([1.0, 3.0, 5.0, 9.0], dropped=3),
        )
    )
    metrics = trainer.one_rollout(0)

    assert len(stack.calls) == 1  # one joint step for both tracks
    text, image = stack.calls[0]
    assert text.rewards is not None and image.rewards is not None
    # each text's reward is its only image's; the dropped image drops its text
    assert text.rewards[:3].tolist() == [1.0, 3.0, 5.0]
    assert text.status.tolist() == [0, 0, 0, STATUS_DROPPED]
    assert image.status.tolist() == [0, 0, 0, STATUS_DROPPED]
    expected = torch.tensor([_adv(1, 1, 3), _adv(3, 1, 3), 0.0, 0.0], dtype=torch.float32)
    assert image.advantages is not None and text.advantages is not None
    assert image.advantages.tolist() == expected.tolist()  # group 1 has one kept sample: 0
    assert text.advantages.tolist() == expected.tolist()
    assert text.decoded is None and image.decoded is None  # no media on the wire
    # metrics: the image stage is the main one, the text's under text/; the joint step's once
    assert metrics["reward/mean"] == (1.0 + 3.0 + 5.0) / 3
    assert metrics["text/reward/mean"] == (1.0 + 3.0 + 5.0) / 3
    assert metrics["train/loss"] == 0.5 and metrics["train/text/loss"] == 0.2
    assert metrics["text/response_length/mean"] == 3.0
    assert text_alg.after == 1 and image_alg.after == 1  # every loss node's after_train once
