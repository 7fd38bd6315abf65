"""PromptFileSource: batching, deterministic epoch shuffles, exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from unirl.config import ConfigError
from unirl.data import PromptFileSource


def _prompt_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("".join(f"prompt {i}\n" for i in range(n)), encoding="utf-8")
    return path


def _ids(batch) -> list[int]:
    return [int(example.prompt.split()[1]) for example in batch]


def test_unshuffled_batches_in_file_order_drop_last(tmp_path):
    source = PromptFileSource(
        path=str(_prompt_file(tmp_path, 7)), prompts_per_rollout=3, shuffle=False
    )
    assert len(source) == 7 and source.batches_per_epoch == 2
    batches = [_ids(source.next_batch()) for _ in range(3)]
    assert batches == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]  # prompt 6 dropped, then epoch 1
    assert source.epoch == 1


def test_keep_last_tops_up_from_next_epoch(tmp_path):
    source = PromptFileSource(
        path=str(_prompt_file(tmp_path, 7)), prompts_per_rollout=3, shuffle=False, drop_last=False
    )
    assert source.batches_per_epoch == 3
    batches = [_ids(source.next_batch()) for _ in range(4)]
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 0, 1], [2, 3, 4]]


def test_shuffle_is_a_deterministic_permutation_per_epoch(tmp_path):
    path = str(_prompt_file(tmp_path, 12))
    a = PromptFileSource(path=path, prompts_per_rollout=4, seed=3)
    b = PromptFileSource(path=path, prompts_per_rollout=4, seed=3)
    c = PromptFileSource(path=path, prompts_per_rollout=4, seed=4)
    epoch_a = [i for _ in range(3) for i in _ids(a.next_batch())]
    epoch_b = [i for _ in range(3) for i in _ids(b.next_batch())]
    assert epoch_a == epoch_b
    assert sorted(epoch_a) == list(range(12))  # every prompt exactly once per epoch
    assert epoch_a != list(range(12))
    assert epoch_a != [i for _ in range(3) for i in _ids(c.next_batch())]
    second = [i for _ in range(3) for i in _ids(a.next_batch())]
    assert sorted(second) == list(range(12)) and second != epoch_a  # new order each epoch
    assert a.epoch_order(1).tolist() == second


@pytest.mark.parametrize("drop_last", [True, False])
def test_resume_continues_exactly(tmp_path, drop_last):
    path = str(_prompt_file(tmp_path, 10))
    kwargs = dict(path=path, prompts_per_rollout=3, seed=7, drop_last=drop_last)
    uninterrupted = PromptFileSource(**kwargs)
    reference = [_ids(uninterrupted.next_batch()) for _ in range(9)]
    for k in (0, 2, 3, 5):
        first = PromptFileSource(**kwargs)
        for _ in range(k):
            first.next_batch()
        state = first.state_dict()
        assert set(state) == {"epoch", "position", "num_prompts", "held_out"}
        resumed = PromptFileSource(**kwargs)
        resumed.load_state_dict(dict(state))
        assert [_ids(resumed.next_batch()) for _ in range(9 - k)] == reference[k:]


def test_resume_rejects_a_different_file(tmp_path):
    source = PromptFileSource(path=str(_prompt_file(tmp_path, 10)), prompts_per_rollout=2)
    with pytest.raises(ConfigError, match="checkpoint was taken on 11 training prompts"):
        source.load_state_dict({"epoch": 0, "position": 0, "num_prompts": 11})


def test_too_small_file_and_unset_batch_size(tmp_path):
    path = str(_prompt_file(tmp_path, 3))
    with pytest.raises(ConfigError, match=r"has 3 prompts, fewer than prompts_per_rollout=4"):
        PromptFileSource(path=path, prompts_per_rollout=4)
    source = PromptFileSource(path=path)
    with pytest.raises(ConfigError, match="prompts_per_rollout is not set"):
        source.next_batch()
    source.set_prompts_per_rollout(3)
    assert _ids(source.next_batch()) != []
    with pytest.raises(ConfigError, match="fewer than prompts_per_rollout=5"):
        source.set_prompts_per_rollout(5)


def test_hydra_instantiates_the_source(tmp_path):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    path = _prompt_file(tmp_path, 8)
    cfg = OmegaConf.create(
        {"_target_": "unirl.data.PromptFileSource", "path": str(path), "prompts_per_rollout": 4}
    )
    source = instantiate(cfg)
    assert isinstance(source, PromptFileSource) and len(source.next_batch()) == 4


def test_hold_out_removes_the_last_prompts_from_training(tmp_path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("".join(f"p{i}\n" for i in range(10)))
    source = PromptFileSource(path=str(path), prompts_per_rollout=3, shuffle=True, seed=0)
    held = source.hold_out(4)
    assert [e.prompt for e in held] == ["p6", "p7", "p8", "p9"]
    assert [e.prompt for e in source.held_out] == ["p6", "p7", "p8", "p9"]
    assert len(source) == 6 and source.state_dict()["num_prompts"] == 6
    served = {e.prompt for _ in range(20) for e in source.next_batch()}
    assert served == {f"p{i}" for i in range(6)}
    with pytest.raises(ConfigError, match="call it once, before the first batch"):
        source.hold_out(1)


def test_hold_out_refuses_to_leave_nothing_to_train_on(tmp_path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("a\nb\nc\n")
    with pytest.raises(
        ConfigError, match=r"cannot hold out 3 of the 3 prompts.*eval\.prompts_path"
    ):
        PromptFileSource(path=str(path)).hold_out(3)


def test_a_resume_with_other_held_out_prompts_names_the_eval_settings(tmp_path) -> None:
    """A checkpoint taken with the eval set held out of the file, resumed by a run that holds
    out none (eval_interval=0, or an eval file): the line says why the counts differ."""
    path = tmp_path / "p.txt"
    path.write_text("".join(f"p{i}\n" for i in range(10)))
    first = PromptFileSource(path=str(path), prompts_per_rollout=3)
    first.hold_out(4)
    first.next_batch()
    state = first.state_dict()
    assert state == {"epoch": 0, "position": 3, "num_prompts": 6, "held_out": 4}
    again = PromptFileSource(path=str(path), prompts_per_rollout=3)
    with pytest.raises(ConfigError) as info:
        again.load_state_dict(state)
    assert str(info.value) == (
        f"PromptFileSource: the checkpoint trained on 6 prompts of {path} with 4 held out for "
        "eval; this run holds out 0 (10 to train on). The held-out prompts follow "
        "eval_interval, eval.num_prompts and eval.prompts_path: resume with the checkpointed "
        "run's values"
    )
    same = PromptFileSource(path=str(path), prompts_per_rollout=3)
    same.hold_out(4)
    same.load_state_dict(state)
    assert [e.prompt for e in same.next_batch()] == [e.prompt for e in first.next_batch()]
