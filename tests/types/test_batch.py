from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from unirl.types import (
    Batch,
    DiffusionRequest,
    DiffusionSamplingParams,
    Images,
    LatentSegment,
    Packed,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    TextEmbedConditions,
    Texts,
    TextSegment,
    batch_field,
    init_noise,
)


def _diffusion(n: int = 8) -> DiffusionRequest:
    return DiffusionRequest(
        init_noise_ids=torch.arange(n) + 100,
        sde_indices=torch.tensor([[1, 3]] * n),
        sigmas=torch.linspace(1, 0, 6),
        init_noise_shape=(4, 2, 2),
    )


def _req(n: int = 8) -> RolloutReq:
    return RolloutReq(
        sample_ids=torch.arange(n) + 100,
        group_ids=torch.arange(n) // 4,
        primitives={"text": Texts(texts=[f"prompt {i}" for i in range(n)])},
        metadata=[{"i": i} for i in range(n)],
        stage_params={"diffusion": _diffusion(n)},
        sampling_params=DiffusionSamplingParams(samples_per_prompt=4),
        seed=7,
    )


def _track(n: int = 8) -> RolloutTrack:
    seg = LatentSegment(
        sigmas=torch.linspace(1, 0, 6),
        sde_indices=torch.tensor([[1, 3]] * n),
        latents=torch.randn(n, 2, 4, 2, 2),
        next_latents=torch.randn(n, 2, 4, 2, 2),
        final_latents=torch.randn(n, 4, 2, 2),
        sde_logp=torch.randn(n, 2),
        guidance_scale=4.5,
    )
    return RolloutTrack(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 4,
        prompts=[f"p{i}" for i in range(n)],
        metadata=[{} for _ in range(n)],
        conditions=TextEmbedConditions(embeds=torch.randn(n, 3, 5), pooled=torch.randn(n, 5)),
        segment=seg,
        decoded=Images(pixels=torch.rand(n, 3, 4, 4)),
        rewards=torch.randn(n),
        component_rewards={"a": torch.randn(n), "b": torch.randn(n)},
    )


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, Packed):
        assert torch.equal(a.values, b.values) and torch.equal(a.offsets, b.offsets)
    elif isinstance(a, Batch):
        assert type(a) is type(b)
        for name in a.field_kinds():
            _assert_same(getattr(a, name), getattr(b, name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    else:
        assert a == b


@pytest.mark.parametrize("n_parts", [1, 2, 4, 8])
def test_chunk_then_concat_is_identity_for_request(n_parts: int) -> None:
    req = _req()
    parts = req.chunk(n_parts)
    assert [len(p) for p in parts] == [8 // n_parts] * n_parts
    whole = req.params_for("diffusion", DiffusionRequest)
    for i, p in enumerate(parts):  # shared fields survive the split, per-sample ones are cut
        assert p.sampling_params is req.sampling_params and p.seed == 7
        part = p.params_for("diffusion", DiffusionRequest)
        assert torch.equal(part.sigmas, whole.sigmas) and part.init_noise_shape == (4, 2, 2)
        rows = slice(i * len(p), (i + 1) * len(p))
        assert torch.equal(part.init_noise_ids, whole.init_noise_ids[rows])
        assert torch.equal(part.sde_indices, whole.sde_indices[rows])
    _assert_same(RolloutReq.concat(parts), req)


def test_chunk_then_concat_is_identity_for_track_and_resp() -> None:
    track = _track()
    _assert_same(RolloutTrack.concat(track.chunk(4)), track)
    resp = RolloutResp(tracks={"diffusion": track}, timings={"rollout": 1.5})
    parts = resp.chunk(2)
    assert [len(p) for p in parts] == [4, 4]
    _assert_same(RolloutResp.concat(parts), resp)


def test_reduce_fields_reduce_on_concat() -> None:
    @dataclass(kw_only=True)
    class Timed(Batch):
        x: torch.Tensor = batch_field("concat")
        t_max: dict[str, float] = batch_field("max", default_factory=dict)
        n_sum: int = batch_field("sum", default=0)
        loss: float = batch_field("mean", default=0.0)

    a = Timed(x=torch.zeros(2), t_max={"gen": 1.0, "dec": 3.0}, n_sum=2, loss=1.0)
    b = Timed(x=torch.ones(2), t_max={"gen": 2.0}, n_sum=5, loss=3.0)
    c = Timed.concat([a, b])
    assert c.t_max == {"gen": 2.0, "dec": 3.0} and c.n_sum == 7 and c.loss == 2.0
    assert torch.equal(c.x, torch.tensor([0.0, 0.0, 1.0, 1.0]))


def test_packed_fields_keep_offsets() -> None:
    rows = [torch.arange(k) for k in (3, 1, 4, 2)]
    seg = TextSegment(
        tokens=Packed.from_list(rows),
        log_probs=Packed.from_list([r.float() * 0.5 for r in rows]),
        loss_mask=Packed.from_list([torch.ones(len(r)) for r in rows]),
    )
    assert len(seg) == 4
    assert seg.tokens.offsets.tolist() == [0, 3, 4, 8, 10]
    first, second = seg.chunk(2)
    assert first.tokens.offsets.tolist() == [0, 3, 4]
    assert second.tokens.offsets.tolist() == [0, 4, 6]
    assert torch.equal(second.tokens.row(0), rows[2])
    _assert_same(TextSegment.concat([first, second]), seg)
    picked = seg.select([3, 0])
    assert [r.tolist() for r in picked.tokens.to_list()] == [[0, 1], [0, 1, 2]]


def test_select_and_repeat_interleave() -> None:
    req = _req(4)
    rep = req.repeat_interleave(3)
    assert rep.sample_ids.tolist() == [100, 100, 100, 101, 101, 101, 102, 102, 102, 103, 103, 103]
    assert rep.prompts[:4] == ["prompt 0"] * 3 + ["prompt 1"]
    sel = req.select([2, 0])
    assert sel.sample_ids.tolist() == [102, 100] and sel.metadata == [{"i": 2}, {"i": 0}]


def test_divisibility_and_mismatch_errors() -> None:
    with pytest.raises(ValueError, match="cannot split a RolloutReq of 8 samples into 3"):
        _req().chunk(3)
    a, b = _req(4), _req(4)
    b.seed = 8
    with pytest.raises(ValueError, match="shared field 'seed' differs"):
        RolloutReq.concat([a, b])
    with pytest.raises(ValueError, match="disagree on length"):
        RolloutTrack(sample_ids=torch.arange(3), group_ids=torch.arange(2))


def test_to_casts_floats_only() -> None:
    track = _track(4).to("cpu", dtype=torch.bfloat16)
    assert track.rewards.dtype == torch.bfloat16
    assert track.sample_ids.dtype == torch.long
    assert track.segment.latents.dtype == torch.bfloat16
    assert track.conditions.embeds.dtype == torch.bfloat16


def test_init_noise_is_per_id_and_split_invariant() -> None:
    ids = torch.tensor([5, 6, 7, 8])
    full = init_noise(ids, (2, 3), seed=1)
    assert torch.equal(init_noise(ids[2:], (2, 3), seed=1), full[2:])
    assert not torch.equal(init_noise(ids, (2, 3), seed=2), full)
    req = _req()
    merged = RolloutReq.concat([p for p in req.chunk(4)])
    x_t = req.params_for("diffusion", DiffusionRequest).initial_noise(req.seed)
    assert torch.equal(merged.params_for("diffusion", DiffusionRequest).initial_noise(7), x_t)
    # x_T is init_noise of the ids, shard by shard: the split changes nothing
    assert torch.equal(x_t, init_noise(torch.arange(8) + 100, (4, 2, 2), seed=7))
    shards = [p.params_for("diffusion", DiffusionRequest).initial_noise(7) for p in req.chunk(4)]
    assert torch.equal(torch.cat(shards), x_t)


def test_diffusion_request_field_kinds() -> None:
    assert DiffusionRequest.field_kinds() == {
        "init_noise_ids": "concat",
        "sde_indices": "concat",
        "sigmas": "shared",
        "init_noise_shape": "shared",
        "sampling_params": "shared",
        "sample_ids": "concat",
    }
    assert len(_diffusion(6)) == 6 and _diffusion(2).init_noise_shape == (4, 2, 2)
    assert _diffusion(2).num_steps == 5 and _diffusion(2).num_sde_steps == 2


def test_diffusion_request_refuses_bad_shapes_and_schedules() -> None:
    ok = {
        "init_noise_ids": torch.arange(2),
        "sde_indices": torch.tensor([[0], [0]]),
        "sigmas": torch.linspace(1, 0, 3),
        "init_noise_shape": (1,),
    }
    with pytest.raises(ValueError, match=r"sde_indices must be \[N, S\]"):
        DiffusionRequest(**{**ok, "sde_indices": torch.tensor([0, 0])})
    with pytest.raises(ValueError, match="past the last of 2 steps"):
        DiffusionRequest(**{**ok, "sde_indices": torch.tensor([[2], [0]])})
    with pytest.raises(ValueError, match=r"sigmas must be \[T\+1\]"):
        DiffusionRequest(**{**ok, "sigmas": torch.ones(1)})
    with pytest.raises(ValueError, match="disagree on length"):
        DiffusionRequest(**{**ok, "init_noise_ids": torch.arange(3)})


def test_stage_params_are_checked_and_named() -> None:
    req = _req(4)
    assert isinstance(req.params_for("diffusion", DiffusionRequest), DiffusionRequest)
    with pytest.raises(
        ValueError, match=r"no DiffusionRequest for stage 'ar' \(stage_params: \['diffusion'\]\)"
    ):
        req.params_for("ar", DiffusionRequest)
    with pytest.raises(ValueError, match="is a DiffusionRequest, expected Texts"):
        req.params_for("diffusion", Texts)
    with pytest.raises(ValueError, match=r"stage_params\['diffusion'\] has 3 rows, sample_ids 4"):
        RolloutReq(
            sample_ids=torch.arange(4),
            group_ids=torch.zeros(4, dtype=torch.long),
            stage_params={"diffusion": _diffusion(3)},
        )
    # a request without a diffusion block (an AR stage's) is still a request
    plain = RolloutReq(sample_ids=torch.arange(2), group_ids=torch.zeros(2, dtype=torch.long))
    assert plain.stage_params == {} and len(plain.chunk(2)[1]) == 1
    # parts whose shared schedule differs cannot be merged
    other = _req(4)
    other.stage_params["diffusion"].sigmas = torch.linspace(1, 0.1, 6)
    with pytest.raises(ValueError, match="shared field 'sigmas' differs"):
        RolloutReq.concat([req, other])


def test_compute_advantages_group_and_batch_std() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    track = RolloutTrack(
        sample_ids=torch.arange(8), group_ids=torch.arange(8) // 4, rewards=rewards
    )
    out, metrics = track.compute_advantages(scope="group", std="group", eps=0.0, clip=None)
    g = rewards[:4]
    expected = (g - g.mean()) / g.std(unbiased=False)
    assert torch.allclose(out.advantages[:4], expected, atol=1e-6)
    assert torch.equal(out.advantages[4:], torch.zeros(4))
    assert metrics["advantage/zero_std_ratio"] == 0.5
    out_b, _ = track.compute_advantages(scope="group", std="batch", eps=1e-4, clip=1.0)
    expected_b = ((g - g.mean()) / (rewards.std(unbiased=False) + 1e-4)).clamp(-1, 1)
    assert torch.allclose(out_b.advantages[:4], expected_b, atol=1e-6)


def test_leave_one_out_advantages_are_rloo() -> None:
    """RLOO: A_i = R_i − mean of the group's other rewards, by hand; n/(n−1) times the
    group-mean advantage; a dropped sample is neither scored nor part of the baseline."""
    rewards = torch.tensor([1.0, 2.0, 4.0, 9.0, 3.0, 3.0, 0.5, 7.0])
    status = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1])  # the last one is dropped
    track = RolloutTrack(
        sample_ids=torch.arange(8), group_ids=torch.arange(8) // 4, rewards=rewards, status=status
    )
    out, _ = track.compute_advantages(scope="leave_one_out", std="none", eps=0.0, clip=None)
    by_hand = [
        1 - (2 + 4 + 9) / 3,
        2 - (1 + 4 + 9) / 3,
        4 - (1 + 2 + 9) / 3,
        9 - (1 + 2 + 4) / 3,
        3 - (3 + 0.5) / 2,
        3 - (3 + 0.5) / 2,
        0.5 - (3 + 3) / 2,
        0.0,
    ]
    assert out.advantages.tolist() == pytest.approx(by_hand, abs=1e-6)
    g = rewards[:4]
    assert torch.allclose(out.advantages[:4], (g - g.mean()) * 4 / 3, atol=1e-6)
    alone = RolloutTrack(
        sample_ids=torch.arange(1),
        group_ids=torch.zeros(1, dtype=torch.long),
        rewards=torch.tensor([5.0]),
    )
    assert alone.compute_advantages(scope="leave_one_out", std="none")[0].advantages.tolist() == [
        0.0
    ]


def test_compute_advantages_excludes_dropped_samples() -> None:
    rewards = torch.tensor([1.0, 3.0, float("nan"), 0.0])
    status = torch.tensor([0, 0, 1, 1])
    track = RolloutTrack(
        sample_ids=torch.arange(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        rewards=rewards,
        status=status,
    )
    out, _ = track.compute_advantages(eps=0.0, clip=None)
    assert out.advantages.tolist() == [-1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="non-finite rewards for samples \\[2\\]"):
        RolloutTrack(
            sample_ids=torch.arange(4), group_ids=torch.tensor([0, 0, 1, 1]), rewards=rewards
        ).compute_advantages()


def test_lineage_is_validated() -> None:
    parent = RolloutTrack(sample_ids=torch.tensor([1, 2]), group_ids=torch.tensor([0, 1]))
    child = RolloutTrack(
        sample_ids=torch.arange(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        parent_ids=torch.tensor([1, 1, 2, 2]),
        parent_track="ar",
    )
    RolloutResp(tracks={"ar": parent, "diffusion": child})
    bad = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 1]),
        parent_ids=torch.tensor([1, 9]),
        parent_track="ar",
    )
    with pytest.raises(ValueError, match="unknown parent samples \\[9\\]"):
        RolloutResp(tracks={"ar": parent, "diffusion": bad})


def test_a_fanned_out_diffusion_request_splits_by_parent_and_expands_parent_major() -> None:
    """k samples per parent row: a data-parallel split keeps each parent's k ids with it, and
    expand() lays them out parent-major with the parent's SDE steps and the stage's params."""
    from unirl.types import DiffusionSamplingParams

    params = DiffusionSamplingParams(num_inference_steps=5, samples_per_prompt=3)
    ids = torch.arange(100, 112).view(4, 3)
    req = DiffusionRequest(
        sample_ids=ids.clone(),
        init_noise_ids=ids.flip(1).clone(),
        sde_indices=torch.tensor([[0], [1], [2], [3]]),
        sigmas=torch.linspace(1, 0, 6),
        init_noise_shape=(4, 2, 2),
        sampling_params=params,
    )
    assert len(req) == 4 and req.fan_out == 3
    _, second = req.chunk(2)
    assert second.sample_ids.tolist() == ids[2:].tolist()
    flat = second.expand()
    assert flat.sample_ids is None and flat.fan_out == 1 and len(flat) == 6
    assert flat.init_noise_ids.tolist() == [108, 107, 106, 111, 110, 109]
    assert flat.sde_indices.flatten().tolist() == [2, 2, 2, 3, 3, 3]
    assert flat.own_sampling() is params
    assert _diffusion(2).expand() is not None and _diffusion(2).fan_out == 1
    with pytest.raises(ValueError, match="no sampling_params"):
        _diffusion(2).own_sampling()
    with pytest.raises(ValueError, match=r"init_noise_ids \(4,\) must match the fan-out"):
        DiffusionRequest(
            sample_ids=ids,
            init_noise_ids=torch.arange(4),
            sde_indices=torch.zeros((4, 0), dtype=torch.long),
            sigmas=torch.linspace(1, 0, 6),
            init_noise_shape=(1,),
        )
