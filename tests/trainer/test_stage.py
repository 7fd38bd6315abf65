"""Stages: reward propagation through lineage, per-track advantages, stage ordering."""

from __future__ import annotations

import pytest
import torch

from unirl.trainer.stage import Stage, order_stages, propagate_rewards
from unirl.types import STATUS_DROPPED, RolloutTrack


def _two_tracks() -> tuple[RolloutTrack, RolloutTrack]:
    """A parent text track of 4 rewrites (2 prompts x 2) and a child image track of 8
    images (2 per rewrite), as a prompt enhancer's response carries them."""
    parent = RolloutTrack(
        sample_ids=torch.tensor([10, 11, 12, 13]),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )
    child = RolloutTrack(
        sample_ids=torch.arange(100, 108),
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]),
        parent_ids=torch.tensor([10, 10, 11, 11, 12, 12, 13, 13]),
        parent_track="text",
        rewards=torch.tensor([1.0, 3.0, 0.0, 2.0, 5.0, 5.0, 4.0, 8.0]),
        component_rewards={"ocr": torch.tensor([0.1, 0.3, 0.0, 0.2, 0.5, 0.5, 0.4, 0.8])},
        status=torch.tensor([0, 0, 0, 0, 0, 0, 0, 1]),  # the last image was dropped
    )
    return parent, child


def test_mean_and_max_propagation_skip_dropped_children() -> None:
    parent, child = _two_tracks()
    mean = propagate_rewards(child, parent, "mean")
    assert mean.rewards.tolist() == [2.0, 1.0, 5.0, 4.0]
    assert torch.allclose(mean.component_rewards["ocr"], torch.tensor([0.2, 0.1, 0.5, 0.4]))
    assert propagate_rewards(child, parent, "max").rewards.tolist() == [3.0, 2.0, 5.0, 4.0]
    assert mean.status.tolist() == [0, 0, 0, 0]


def test_parent_without_kept_children_is_dropped_and_advantages_are_per_track() -> None:
    parent, child = _two_tracks()
    child.status[6] = STATUS_DROPPED  # sample 13 now has no kept child
    scored_parent = propagate_rewards(child, parent, "mean")
    assert scored_parent.status.tolist() == [0, 0, 0, STATUS_DROPPED]
    parent_adv, _ = scored_parent.compute_advantages(scope="group", std="none", clip=None)
    # group 0: rewards 2 and 1 -> +0.5 / -0.5; group 1: only sample 12 kept -> 0; dropped -> 0
    assert parent_adv.advantages.tolist() == [0.5, -0.5, 0.0, 0.0]
    child_adv, _ = child.compute_advantages(scope="group", std="none", clip=None)
    assert child_adv.advantages.tolist() == [-1.0, 1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_unknown_parent_is_refused() -> None:
    parent, child = _two_tracks()
    child.parent_ids[0] = 99
    with pytest.raises(ValueError, match=r"not in the parent track: \[99\]"):
        propagate_rewards(child, parent)


def test_children_come_before_parents_and_cycles_are_refused() -> None:
    stages = [
        Stage(track="text"),
        Stage(track="image", parent="text"),
        Stage(track="up", parent="image"),
    ]
    assert [s.track for s in order_stages(stages)] == ["up", "image", "text"]
    with pytest.raises(ValueError, match="cycle"):
        order_stages([Stage(track="a", parent="b"), Stage(track="b", parent="a")])
    with pytest.raises(ValueError, match="which is no stage"):
        order_stages([Stage(track="a", parent="zz")])
    assert Stage(track="text", prefix="text").key("reward/mean") == "text/reward/mean"
    assert Stage(track="diffusion").key("reward/mean") == "reward/mean"


def test_reward_metrics_keep_every_scorer_counter_and_sum_counts_over_shards() -> None:
    """Counters of any scorer reach the driver (``clip/nonfinite`` was dropped before: only
    ``ocr/*`` and ``guard/*`` were kept); counts are summed over shards, statistics averaged."""
    from unirl.trainer.base import reward_metrics

    meta = [{} for _ in range(4)]
    meta[0]["_reward_metrics"] = {"clip/nonfinite": 1.0, "ocr/failures": 0.0, "guard/dark": 0.2}
    meta[2]["_reward_metrics"] = {"clip/nonfinite": 2.0, "ocr/failures": 1.0, "guard/dark": 0.4}
    track = RolloutTrack(
        sample_ids=torch.arange(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        rewards=torch.tensor([1.0, 2.0, 3.0, 4.0]),
        metadata=meta,
    )
    out = reward_metrics(track)
    assert out["clip/nonfinite"] == 3.0 and out["ocr/failures"] == 1.0
    assert abs(out["guard/dark"] - 0.3) < 1e-12
    assert out["reward/mean"] == 2.5


def test_eval_prompts_split_by_the_rollout_slab_not_num_devices(tmp_path) -> None:
    """Separate layout with 4 devices, 1 train + 3 rollout: the eval request must split over
    the 3 rollout ranks (it used num_devices=4 and failed at the first eval)."""
    from types import SimpleNamespace

    from unirl.config.run import RunConfig
    from unirl.trainer.base import StageTrainer

    prompts = tmp_path / "eval.txt"
    prompts.write_text("\n".join(f"prompt {i}" for i in range(8)) + "\n")
    cfg = RunConfig(num_devices=4, layout="separate", train_fraction=0.25)
    assert cfg.slab_sizes() == (1, 3)
    trainer = StageTrainer.__new__(StageTrainer)
    trainer.cfg = cfg
    trainer.cfg.eval.prompts_path = str(prompts)
    trainer.cfg.eval.num_prompts = 8
    trainer.data_source = SimpleNamespace(path=str(prompts))
    trainer.stages = [Stage(track="diffusion", train_ranks=1, rollout_ranks=3)]
    assert len(trainer.eval_prompts()) == 6  # 8 cut to a multiple of the 3 rollout ranks
    trainer.cfg.eval.samples_per_prompt = 3
    assert len(trainer.eval_prompts()) == 8  # 8 prompts x 3 samples = 24 rows split in 3


class _Ops:
    """The driver's view of a TrainOps role: counts the weight switches around rollouts."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_sampling(self, mode: str) -> None:
        self.calls.append(f"begin:{mode}")

    def end_sampling(self) -> None:
        self.calls.append("end")


def test_only_stages_whose_weights_switch_are_called_around_a_rollout() -> None:
    """A stage whose ops switch nothing for a mode costs no calls around its rollouts; NFT's
    (the old adapter for train rollouts) is switched for train only; stages that share one
    ops role (a unified model) are switched once; unknown (None) means every mode."""
    from unirl.trainer.base import StageTrainer

    plain, nft, shared, unknown = _Ops(), _Ops(), _Ops(), _Ops()
    trainer = StageTrainer.__new__(StageTrainer)
    trainer.stages = [
        Stage(track="a", stack=object(), ops=plain, sampling_switches=()),
        Stage(track="b", stack=object(), ops=nft, sampling_switches=("train",)),
        Stage(track="c", stack=object(), ops=shared, sampling_switches=("train", "eval")),
        Stage(track="d", stack=object(), ops=shared, sampling_switches=("train", "eval")),
        Stage(track="e", stack=object(), ops=unknown),
    ]
    for mode in ("train", "eval"):
        with trainer._sampling(mode):
            pass
    assert plain.calls == []
    assert nft.calls == ["begin:train", "end"]
    assert shared.calls == ["begin:train", "end", "begin:eval", "end"]
    assert unknown.calls == ["begin:train", "end", "begin:eval", "end"]


def test_train_ops_report_the_modes_they_switch() -> None:
    """TrainOps.sampling_switches: the algorithm's sampling adapter per mode, or every mode
    when a sharded backend keeps its blocks gathered for sampling."""
    from types import SimpleNamespace

    from unirl.trainer.roles import TrainOps

    class NFTLike:
        def sampling_adapter(self, mode: str) -> str | None:
            return "old" if mode == "train" else None

    plain = SimpleNamespace(is_sharded=False, fsdp_config=SimpleNamespace(gather_for_sampling=True))
    gathered = SimpleNamespace(
        is_sharded=True, fsdp_config=SimpleNamespace(gather_for_sampling=True)
    )
    grpo = SimpleNamespace(sampling_adapter=lambda mode: None)
    ask = TrainOps.sampling_switches  # called on a driver-side instance: no Ray
    assert ask(TrainOps(backend=plain, pipeline=None, algorithm=grpo)) == ()
    assert ask(TrainOps(backend=plain, pipeline=None, algorithm=NFTLike())) == ("train",)
    assert ask(TrainOps(backend=gathered, pipeline=None, algorithm=grpo)) == ("train", "eval")
    assert ask(TrainOps(backend=plain, pipeline=None)) == ()


def test_after_train_rides_on_the_train_reply() -> None:
    """The stack runs the algorithm's after_train on each rank and returns it with the step:
    the driver reads it from the reply (one stage, or a joint step's per-track entries) and
    calls the algorithm itself only for a stack that does not report it."""
    from unirl.trainer.base import StageTrainer

    class Algorithm:
        def __init__(self) -> None:
            self.calls = 0

        def after_train(self, rollout_index: int) -> list[dict[str, float]]:
            self.calls += 1
            return [{"kl/beta": -1.0}, {"kl/beta": -1.0}]

    text, image = Algorithm(), Algorithm()
    one = Stage(track="text", algorithm=text)
    both = [one, Stage(track="image", algorithm=image)]
    replies = [{"after_train": {"kl/beta": 0.1}}, {"after_train": {"kl/beta": 0.3}}]
    assert StageTrainer._after_train(one, [one], replies, 0) == [{"kl/beta": 0.1}, {"kl/beta": 0.3}]
    joint = [{"after_train_by_track": {"text": {"a": 1.0}, "image": {"b": 2.0}}}] * 2
    assert StageTrainer._after_train(both[1], both, joint, 0) == [{"b": 2.0}, {"b": 2.0}]
    assert text.calls == 0 and image.calls == 0
    assert StageTrainer._after_train(one, [one], [{}, {}], 0) == [{"kl/beta": -1.0}] * 2
    assert text.calls == 1
