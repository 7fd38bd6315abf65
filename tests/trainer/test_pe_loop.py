"""The prompt enhancer's turn of the loop on a hand-built two-track response: the image reward
reaches each rewrite by ``pe.reduce`` (mean, max), advantages are computed per track in its
own groups, and every number equals a hand computation exactly.

The response: 2 user prompts x 2 rewrites (parent ``pe`` track, ids 10-13, groups 0 0 1 1)
and 2 images per rewrite (child ``diffusion`` track, group = the rewrite). Image rewards
(the last image of rewrite 13 is dropped by the reward):

    rewrite 10: 1, 3     mean 2   max 3
    rewrite 11: 0, 4     mean 2   max 4
    rewrite 12: 5, 5     mean 5   max 5
    rewrite 13: 4, (9)   mean 4   max 4

Group statistics of two values are exact in binary (mean (a+b)/2, population std |a-b|/2),
so ``(r - mean) / (std + eps)`` written out here is the same IEEE computation the trainer
runs, and the float32 results compare with ``==``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trainer_fakes import DroppingReward, FixedEngine, IdleOps, QuietAlgorithm, RecordingStack

from unirl.config.run import AdvantageConfig, RunConfig
from unirl.trainer.pe import PETrainer
from unirl.trainer.pe_config import IMAGE_TRACK, TEXT_TRACK, DrawerConfig, PEConfig
from unirl.types import STATUS_DROPPED, RolloutReq, RolloutResp, RolloutTrack, Texts

EPS = 1e-4
IMAGE_REWARDS = [1.0, 3.0, 0.0, 4.0, 5.0, 5.0, 4.0, 9.0]


def _adv(r: float, a: float, b: float) -> float:
    """The group advantage of ``r`` in a group of two kept values ``a``, ``b``."""
    mean, std = (a + b) / 2, abs(a - b) / 2
    return (r - mean) / (std + EPS) if std + EPS > 0 else 0.0


def _f32(values: list[float]) -> list[float]:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32).tolist()


def _response() -> RolloutResp:
    parent = RolloutTrack(
        sample_ids=torch.tensor([10, 11, 12, 13]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        prompts=["a cat", "a cat", "a dog", "a dog"],
        metadata=[
            {"rewrite": t, "rewrite_empty": False, "rewrite_capped": False, "response_tokens": 3}
            for t in ("w1", "w2", "w3", "w4")
        ],
        decoded=Texts(texts=["w1", "w2", "w3", "w4"]),
    )
    child = RolloutTrack(
        sample_ids=torch.arange(100, 108),
        group_ids=torch.tensor([10, 10, 11, 11, 12, 12, 13, 13]),
        prompts=["a cat"] * 4 + ["a dog"] * 4,
        parent_ids=torch.tensor([10, 10, 11, 11, 12, 12, 13, 13]),
        parent_track=TEXT_TRACK,
    )
    return RolloutResp(tracks={TEXT_TRACK: parent, IMAGE_TRACK: child})


def _trainer(reduce: str, train_both: bool) -> tuple[PETrainer, RecordingStack, RecordingStack]:
    cfg = RunConfig(
        batch_size=2,
        advantage=AdvantageConfig(scope="group", std="group", eps=EPS, clip=5.0),
    )
    cfg.logging.gallery_interval = 0
    drawer = DrawerConfig(bundle={}, pipeline={}, sampling={})
    trainer = PETrainer.__new__(PETrainer)  # the loop only: no recipe, no Ray
    trainer.cfg = cfg
    trainer.composed = PEConfig(diffusion=drawer, reduce=reduce, train_both=train_both)  # type: ignore[arg-type]
    trainer.rollout = FixedEngine(_response)
    trainer.data_source = SimpleNamespace(next_batch=lambda: ["a cat", "a dog"], epoch=0)
    trainer.build_request = lambda prompts, k, mode="train": RolloutReq(  # type: ignore[method-assign]
        sample_ids=torch.tensor([10, 11, 12, 13]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        primitives={"text": Texts(texts=["a cat", "a cat", "a dog", "a dog"])},
    )
    text_stack, image_stack = RecordingStack(), RecordingStack()
    text = {"stack": text_stack, "algorithm": QuietAlgorithm(), "ops": IdleOps()}
    draw: dict[str, Any] = {}
    if train_both:
        draw = {"stack": image_stack, "algorithm": QuietAlgorithm(), "ops": IdleOps()}
    from unirl.trainer.stage import order_stages

    trainer.stages = order_stages(
        trainer.make_stages(text, draw, DroppingReward(IMAGE_REWARDS, dropped=7))
    )
    return trainer, text_stack, image_stack


@pytest.mark.parametrize(
    ("reduce", "rewrite_rewards"),
    [("mean", [2.0, 2.0, 5.0, 4.0]), ("max", [3.0, 4.0, 5.0, 4.0])],
)
def test_rewrite_rewards_and_advantages_equal_the_hand_computation(
    reduce: str, rewrite_rewards: list[float]
) -> None:
    trainer, text_stack, image_stack = _trainer(reduce, train_both=True)
    metrics = trainer.one_rollout(0)

    parent = text_stack.seen
    assert parent is not None and parent.rewards is not None
    assert parent.rewards.tolist() == rewrite_rewards
    r = rewrite_rewards
    expected_parent = _f32(
        [
            _adv(r[0], r[0], r[1]),
            _adv(r[1], r[0], r[1]),
            _adv(r[2], r[2], r[3]),
            _adv(r[3], r[2], r[3]),
        ]
    )
    assert parent.advantages.tolist() == expected_parent
    if reduce == "mean":  # rewrites 10 and 11 tie: a constant group has zero advantage
        assert expected_parent[:2] == [0.0, 0.0]
    assert parent.status.tolist() == [0, 0, 0, 0]  # rewrite 13 keeps one image

    child = image_stack.seen
    assert child is not None and child.advantages is not None
    x = IMAGE_REWARDS
    expected_child = _f32(
        [
            _adv(x[0], x[0], x[1]),
            _adv(x[1], x[0], x[1]),
            _adv(x[2], x[2], x[3]),
            _adv(x[3], x[2], x[3]),
            0.0,  # 5, 5: a constant group
            0.0,
            0.0,  # the only kept image of rewrite 13: its own group mean
            0.0,  # dropped
        ]
    )
    assert child.advantages.tolist() == expected_child
    assert child.status.tolist() == [0] * 7 + [STATUS_DROPPED]

    # metrics: the image stage unprefixed, the policy's under pe/
    kept_images = x[:7]
    assert metrics["reward/mean"] == pytest.approx(sum(kept_images) / 7, abs=1e-6)
    assert metrics["pe/reward/mean"] == pytest.approx(sum(r) / 4, abs=1e-6)
    assert metrics["pe/advantage/mean"] == pytest.approx(sum(expected_parent) / 4, abs=1e-6)
    assert metrics["advantage/mean"] == pytest.approx(sum(expected_child[:7]) / 7, abs=1e-6)
    assert metrics["pe/empty_rewrites"] == 0.0 and metrics["pe/dropped_rewrites"] == 0.0
    assert "pe/train/loss" in metrics and "train/loss" in metrics


def test_a_frozen_drawer_gets_no_advantages_and_is_not_trained() -> None:
    trainer, text_stack, image_stack = _trainer("mean", train_both=False)
    metrics = trainer.one_rollout(0)
    assert image_stack.seen is None
    assert "train/loss" not in metrics and "advantage/mean" not in metrics
    assert text_stack.seen is not None
    assert text_stack.seen.rewards.tolist() == [2.0, 2.0, 5.0, 4.0]


def test_a_rewrite_without_a_kept_image_is_dropped_from_the_policy_update() -> None:
    trainer, text_stack, _ = _trainer("max", train_both=False)

    class _DropRewrite13(DroppingReward):
        def score(self, track: RolloutTrack) -> RolloutTrack:
            scored = super().score(track)
            scored.status[6] = STATUS_DROPPED  # both images of rewrite 13 now dropped
            return scored

    trainer.stages[0].reward = _DropRewrite13(
        IMAGE_REWARDS, dropped=7
    )  # children first: the image stage
    metrics = trainer.one_rollout(0)
    parent = text_stack.seen
    assert parent is not None
    assert parent.status.tolist() == [0, 0, 0, STATUS_DROPPED]
    # group 1 keeps only rewrite 12: advantage 0; the dropped rewrite gets 0
    expected = _f32([_adv(3.0, 3.0, 4.0), _adv(4.0, 3.0, 4.0), 0.0, 0.0])
    assert parent.advantages.tolist() == expected
    assert metrics["pe/dropped_rewrites"] == 1.0


def test_a_checkpoint_of_two_trained_stages_is_verified_in_each_stage_folder(tmp_path) -> None:
    """Both stages train: each backend writes into its stage's sub-folder, and resume checks
    every one of them (a truncated file in either is named)."""
    import hashlib
    import json

    from unirl.train.checkpoint import CHECKPOINT_FORMAT, STATE_FILE
    from unirl.trainer.output import DRIVER_STATE, checkpoint_problem

    step = tmp_path / "step_000004"
    for stage in (TEXT_TRACK, IMAGE_TRACK):
        folder = step / stage
        folder.mkdir(parents=True)
        payload = f"weights of {stage}".encode()
        (folder / "model.bin").write_bytes(payload)
        manifest = {
            "model.bin": {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        }
        meta = {"format": CHECKPOINT_FORMAT, "files": ["model.bin"], "manifest": manifest}
        (folder / STATE_FILE).write_text(json.dumps(meta))
    stages = {TEXT_TRACK: {}, IMAGE_TRACK: {}}
    (step / DRIVER_STATE).write_text(json.dumps({"next_rollout": 4, "stages": stages}))
    assert checkpoint_problem(step) is None
    (step / IMAGE_TRACK / "model.bin").write_bytes(b"weights")
    problem = checkpoint_problem(step)
    assert problem is not None and f"{IMAGE_TRACK}/model.bin is 7 bytes" in problem
