"""The composed engine (AR rewrite -> drawn images, two tracks with lineage) and the PE
driver's request: ids, groups, shared x_T, empty and over-long rewrites. Fake pipelines
stand in for the models: what is checked is the engine's bookkeeping."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from unirl.config.run import RunConfig
from unirl.rollout.engine.composed import ComposedEngine, clean_rewrite
from unirl.trainer.pe import PETrainer
from unirl.trainer.pe_config import IMAGE_TRACK, TEXT_TRACK, DrawerConfig, PEConfig
from unirl.types import (
    STATUS_DROPPED,
    ARSamplingParams,
    DiffusionRequest,
    DiffusionSamplingParams,
    Images,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    TextRequest,
    Texts,
)

PREFIX = "<think></think>"


class _TextPipeline:
    """Answers each sample with ``completions[sample id]`` (after the response prefix)."""

    track_name = "text"

    def __init__(self, completions: dict[int, str]) -> None:
        self.completions = completions
        self.bundle = SimpleNamespace(config=SimpleNamespace(response_prefix=PREFIX))

    def generate(self, req: RolloutReq) -> RolloutResp:
        req.params_for("text", TextRequest)  # the engine re-keys the policy's block
        ids = req.sample_ids.tolist()
        track = RolloutTrack(
            sample_ids=req.sample_ids.clone(),
            group_ids=req.group_ids.clone(),
            prompts=list(req.prompts),
            metadata=[dict(m) for m in req.metadata],
            decoded=Texts(texts=[PREFIX + self.completions[i] for i in ids]),
        )
        return RolloutResp(tracks={"text": track}, timings={"generate": 0.5})


class _ImagePipeline:
    """Records the request it drew; images are the x_T ids (one pixel value each)."""

    track_name = "diffusion"

    def __init__(self) -> None:
        self.requests: list[RolloutReq] = []

    def generate(self, req: RolloutReq) -> RolloutResp:
        self.requests.append(req)
        block = req.params_for("diffusion", DiffusionRequest)
        pixels = block.init_noise_ids.float().view(-1, 1, 1, 1).expand(-1, 3, 2, 2).clone()
        track = RolloutTrack(
            sample_ids=req.sample_ids.clone(),
            group_ids=req.group_ids.clone(),
            prompts=list(req.prompts),
            metadata=list(req.metadata),
            decoded=Images(pixels=pixels),
        )
        return RolloutResp(tracks={"diffusion": track}, timings={"rollout": 1.0})


def _draw(n: int, k: int, *, s: int = 0) -> DiffusionRequest:
    ids = torch.arange(1000, 1000 + n * k).view(n, k)
    return DiffusionRequest(
        sample_ids=ids,
        init_noise_ids=ids + 5000,
        sde_indices=torch.zeros((n, s), dtype=torch.long),
        sigmas=torch.linspace(1, 0, 5),
        init_noise_shape=(16, 8, 8),
        sampling_params=DiffusionSamplingParams(samples_per_prompt=k),
    )


def _request(prompts: list[str], completions: int, k: int) -> RolloutReq:
    n = len(prompts)
    ids = torch.arange(n)
    return RolloutReq(
        sample_ids=ids,
        group_ids=ids // completions,
        primitives={"text": Texts(texts=prompts)},
        metadata=[{"row": i} for i in range(n)],
        stage_params={
            TEXT_TRACK: TextRequest(seed_ids=ids.clone(), max_new_tokens=4),
            IMAGE_TRACK: _draw(n, k),
        },
        seed=3,
        rollout_index=7,
    )


def _engine(completions: dict[int, str], **knobs: Any) -> tuple[ComposedEngine, _ImagePipeline]:
    image = _ImagePipeline()
    engine = ComposedEngine(text_sampler=_TextPipeline(completions), image_sampler=image, **knobs)
    return engine, image


def test_two_tracks_with_lineage_user_prompts_and_the_drawn_rewrites() -> None:
    completions = {0: "  a bright sun \n", 1: "white light beam", 2: "x" * 30, 3: "moon"}
    engine, image = _engine(completions, max_rewrite_chars=12)
    req = _request(["sun", "sun", "cat", "cat"], completions=2, k=3)
    resp = engine.compose(req)
    parent, child = resp.tracks[TEXT_TRACK], resp.tracks[IMAGE_TRACK]
    drawn = ["a bright sun", "white light", "x" * 12, "moon"]  # a cut drops its trailing space
    assert [m["rewrite"] for m in parent.metadata] == drawn
    assert [m["rewrite_capped"] for m in parent.metadata] == [False, True, True, False]
    assert [m["row"] for m in parent.metadata] == [0, 1, 2, 3]
    # the drawer drew the cleaned rewrites, k times each, with the driver's ids and x_T ids
    seen = image.requests[0]
    assert seen.prompts == [t for t in drawn for _ in range(3)]
    assert seen.sample_ids.tolist() == list(range(1000, 1012))
    assert seen.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert seen.sampling_params.samples_per_prompt == 3
    assert (seen.seed, seen.rollout_index, seen.mode) == (3, 7, "train")
    assert child.decoded.pixels[:, 0, 0, 0].tolist() == [float(6000 + i) for i in range(12)]
    # lineage: each image names its rewrite; its prompt is the user's, its metadata the rewrite
    assert child.parent_track == TEXT_TRACK
    assert child.parent_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert child.prompts == ["sun"] * 6 + ["cat"] * 6
    assert [m["rewrite"] for m in child.metadata] == [t for t in drawn for _ in range(3)]
    assert child.conditions is None and child.segment is None  # a frozen drawer's
    assert set(resp.timings) == {"pe/generate", "pe/compose", "diffusion/rollout"}


@pytest.mark.parametrize("policy", ["original", "drop"])
def test_an_empty_rewrite_draws_the_user_prompt_and_is_counted_or_dropped(policy: str) -> None:
    engine, image = _engine({0: "sky", 1: "  \n "}, empty_rewrite=policy)
    resp = engine.compose(_request(["sun", "sun"], completions=2, k=2))
    parent, child = resp.tracks[TEXT_TRACK], resp.tracks[IMAGE_TRACK]
    assert image.requests[0].prompts == ["sky", "sky", "sun", "sun"]  # never an empty prompt
    assert [m["rewrite_empty"] for m in parent.metadata] == [False, True]
    assert [m["rewrite"] for m in parent.metadata] == ["sky", ""]
    expected = [0, 0, 0, 0] if policy == "original" else [0, 0, STATUS_DROPPED, STATUS_DROPPED]
    assert child.status.tolist() == expected


def test_a_prefix_only_completion_is_empty_and_a_clean_rewrite_never_ends_in_space() -> None:
    engine, _ = _engine({0: ""})
    parent = engine.compose(_request(["sun"], completions=1, k=1)).tracks[TEXT_TRACK]
    assert parent.metadata[0]["rewrite_empty"] is True
    assert clean_rewrite("  ab   cd ", 3) == ("ab", True)
    assert clean_rewrite(" ab ", 2) == ("ab", False)


def test_a_shard_composes_exactly_as_its_part_of_the_whole_request() -> None:
    """The driver scatters the request by data-parallel rank: two halves composed apart and
    concatenated equal the whole composed at once (ids, lineage, drawn prompts)."""
    completions = {i: f"rewrite {i}" for i in range(4)}
    whole_engine, _ = _engine(completions)
    req = _request(["a", "a", "b", "b"], completions=2, k=2)
    whole = whole_engine.compose(req)
    halves = [_engine(completions)[0].compose(part) for part in req.chunk(2)]
    merged = RolloutResp.concat(halves)
    for name in (TEXT_TRACK, IMAGE_TRACK):
        a, b = whole.tracks[name], merged.tracks[name]
        assert a.sample_ids.tolist() == b.sample_ids.tolist()
        assert a.group_ids.tolist() == b.group_ids.tolist()
        assert a.metadata == b.metadata and a.prompts == b.prompts
    assert (
        whole.tracks[IMAGE_TRACK].parent_ids.tolist()
        == merged.tracks[IMAGE_TRACK].parent_ids.tolist()
    )


def test_engine_knobs_are_refused_with_the_field() -> None:
    from unirl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout\.empty_rewrite must be 'original'"):
        ComposedEngine(text_sampler=None, image_sampler=None, empty_rewrite="skip")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"rollout\.max_rewrite_chars must be >= 1"):
        ComposedEngine(text_sampler=None, image_sampler=None, max_rewrite_chars=0)
    with pytest.raises(
        ValueError, match=r"DiffusionRequest.init_noise_ids \(2, 3\) must match the fan-out"
    ):
        DiffusionRequest(
            sample_ids=torch.zeros((2, 2), dtype=torch.long),
            init_noise_ids=torch.zeros((2, 3), dtype=torch.long),
            sde_indices=torch.zeros((2, 0), dtype=torch.long),
            sigmas=torch.ones(3),
            init_noise_shape=(1,),
            sampling_params=None,
        )


# -- the driver's request ---------------------------------------------------------------------


def _driver(share_noise: bool, trains: bool = False) -> PETrainer:
    trainer = PETrainer.__new__(PETrainer)
    trainer.cfg = RunConfig(seed=5)
    trainer.cfg.eval.samples_per_prompt = 1
    trainer.composed = PEConfig(
        diffusion=DrawerConfig(bundle={}, pipeline={}, sampling={}), share_noise=share_noise
    )
    trainer.sampling = ARSamplingParams(samples_per_prompt=3, max_new_tokens=6, stop=["."])
    trainer.child_sampling = DiffusionSamplingParams(
        samples_per_prompt=2, num_inference_steps=4, eval_num_inference_steps=3
    )
    trainer.schedules = {"train": torch.linspace(1, 0, 5), "eval": torch.linspace(1, 0, 4)}
    trainer.latent_shape = (16, 8, 8)
    trainer.trains_sde_steps = trains
    from unirl.sde import RandomSubsetSchedule

    trainer.sde_steps = RandomSubsetSchedule(num_steps=2, fraction=[0.0, 0.99])
    return trainer


def test_request_ids_groups_and_shared_noise() -> None:
    prompts = [SimpleNamespace(prompt=p, metadata={"p": p}) for p in ("sun", "cat")]
    req = _driver(share_noise=True).build_request(prompts, 2)
    assert req.sample_ids.tolist() == list(range(12, 18))
    assert req.group_ids.tolist() == [4, 4, 4, 5, 5, 5]
    assert req.prompts == ["sun"] * 3 + ["cat"] * 3
    text = req.params_for(TEXT_TRACK, TextRequest)
    assert text.seed_ids.tolist() == req.sample_ids.tolist() and text.stop == (".",)
    draw = req.params_for(IMAGE_TRACK, DiffusionRequest)
    assert draw.sample_ids.tolist() == [[24 + 2 * i, 25 + 2 * i] for i in range(6)]
    # every rewrite of "sun" draws from the first rewrite's two x_T; "cat" from its own
    assert draw.init_noise_ids.tolist() == [[24, 25]] * 3 + [[30, 31]] * 3
    assert draw.sde_indices.shape == (6, 0)  # a frozen drawer samples the ODE
    assert draw.sigmas.tolist() == torch.linspace(1, 0, 5).tolist()
    assert draw.expand().init_noise_ids.tolist() == [24, 25] * 3 + [30, 31] * 3

    independent = _driver(share_noise=False).build_request(prompts, 2)
    noise = independent.params_for(IMAGE_TRACK, DiffusionRequest).init_noise_ids
    assert noise.reshape(-1).tolist() == list(range(24, 36))


def test_a_trained_drawer_gets_its_sde_steps_and_eval_ids_never_meet_train_ids() -> None:
    prompts = [SimpleNamespace(prompt="sun", metadata={})]
    driver = _driver(share_noise=True, trains=True)
    draw = driver.build_request(prompts, 0).params_for(IMAGE_TRACK, DiffusionRequest)
    chosen = list(driver.sde_steps.select(4, seed=5, rollout_index=0))
    assert draw.sde_indices.tolist() == [chosen] * 3 and len(chosen) == 2
    ev = driver.build_request(prompts, 0, mode="eval")
    assert ev.sample_ids.tolist() == [10**12]  # eval.samples_per_prompt rewrites
    assert ev.params_for(TEXT_TRACK, TextRequest).temperature == 0.0
    eval_draw = ev.params_for(IMAGE_TRACK, DiffusionRequest)
    assert eval_draw.sample_ids.tolist() == [[10**12, 10**12 + 1]]
    assert eval_draw.sde_indices.shape == (1, 0) and eval_draw.sigmas.numel() == 4
