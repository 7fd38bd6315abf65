"""The contract every flow-matching family proves, written once.

A family's test module subclasses :class:`FamilyTester` as ``Test<Family>Family`` and supplies
the hooks at the top of the class (bundle factory, diffusers pipeline class, tiny folder and call, LoRA
targets, arch checks; ``backend_kwargs`` and ``load_exported_lora`` where the family trains or
exports differently, e.g. Wan 2.2's two experts). A video family sets ``num_frames``: requests
carry it, x_T has the shape of ``bundle.latent_shape_for(params)``, and decoded ``Videos``
frames are compared. On the ``tiny`` preset, fp32 on CPU, the inherited tests prove:

(a) ODE sampling through our pipeline equals the family's diffusers pipeline for the same
    σ schedule (asserted equal to the scheduler's), x_T and prompts — latents and pixels;
(b) the first Flow-GRPO update through the real ``FSDPBackend`` + LoRA + ``TrainStack`` is
    exactly on-policy: ``ratio/min == ratio/max == 1.0`` with replay-sourced old log-probs;
(c) replay reproduces the recorded log-probs bit for bit at equal batch geometry
    (``cfg_gradient="both"``); the ``cond_only`` replay (the unconditional rows as their own
    forward) stays within 1e-6 of them;
(d) the exported LoRA loads into the diffusers pipeline with ``load_lora_weights(folder)``
    and moves its output exactly as our adapter moves ours;
(e) the ``<family>-arch`` preset has the released shapes (built on the meta device);
(f) trained slots stacked as the rows of one forward (``algorithm.slots_per_forward``:
    the family's conditions repeated per slot) replay every slot's log-prob within 1e-6 of
    the sampler's, both CFG-gradient modes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from unirl.algorithms import FlowGRPO
from unirl.algorithms.replay import record_rows, slot_batches
from unirl.sde import ODE, FlowSDE
from unirl.train import FSDPBackend, LoraConfig, OptimizerConfig, TrainStack
from unirl.types import DiffusionRequest, DiffusionSamplingParams, RolloutReq, Texts, Videos


@dataclasses.dataclass
class DiffusersSample:
    """What the reference pipeline produced: final latents in our layout, decoded pixels
    ``[N, 3, H, W]`` (videos: ``[N, T, 3, H, W]``) in [0, 1], and the σ schedule its scheduler
    used (``[T + 1]``)."""

    latents: torch.Tensor
    pixels: torch.Tensor
    sigmas: torch.Tensor


def run_diffusers(
    pipe: Any, *, prompts: list[str], negative_prompt: str, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of a diffusers pipeline: ``(final latents as diffusers holds them, pixels)``;
    the latents after the last step are captured by a step-end callback."""
    captured: dict[str, torch.Tensor] = {}

    def grab(_pipe: Any, _i: int, _t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        captured["latents"] = tensors["latents"]
        return {}

    out = pipe(
        prompt=prompts,
        negative_prompt=[negative_prompt] * len(prompts),
        output_type="pt",
        callback_on_step_end=grab,
        callback_on_step_end_tensor_inputs=["latents"],
        **kwargs,
    )
    # image pipelines return ``images``, video pipelines ``frames`` ([N, T, 3, H, W])
    return captured["latents"], out.frames if hasattr(out, "frames") else out.images


class FamilyTester:
    """Subclass as ``Test<Family>Family`` and fill in the hooks below."""

    # -- hooks ------------------------------------------------------------------------------

    pipeline_class: ClassVar[type]
    lora_targets: ClassVar[tuple[str, ...]] = ("to_q", "to_k", "to_v", "to_out.0")
    # |ours - diffusers| bounds; 0 means bit for bit
    latent_atol: ClassVar[float] = 1e-5
    pixel_atol: ClassVar[float] = 1e-5

    bundle_class: ClassVar[type]  # the family's bundle (what the default make_bundle builds)
    # bundle fields the tests set besides path / dtypes / device (e.g. max_sequence_length)
    bundle_fields: ClassVar[dict[str, Any]] = {}

    def make_bundle(self, **overrides: Any) -> Any:
        """A fresh fp32 CPU bundle of the ``tiny`` preset: ``bundle_class`` with
        ``bundle_fields`` and ``overrides`` (a family with another construction overrides it)."""
        fields: dict[str, Any] = {
            "path": "tiny",
            "dtype": "fp32",
            "text_encoder_dtype": "fp32",
            "device": "cpu",
            **self.bundle_fields,
        }
        return self.bundle_class(**{**fields, **overrides})

    diffusers_class: ClassVar[Any]  # the family's diffusers pipeline class

    def tiny_path(self) -> Path:
        """The ``tiny`` preset's folder (built on first use)."""
        raise NotImplementedError

    def load_diffusers(self) -> Any:
        """The family's diffusers pipeline loaded from the same ``tiny`` folder (fresh)."""
        from unirl.models.common.progress import hf_progress_bars_disabled

        with hf_progress_bars_disabled():
            pipe = self.diffusers_class.from_pretrained(self.tiny_path(), local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def diffusers_sample(
        self,
        pipe: Any,
        *,
        prompts: list[str],
        x_T: torch.Tensor,
        steps: int,
        guidance_scale: float,
        negative_prompt: str,
        height: int,
        width: int,
    ) -> DiffusersSample:
        """Sample with the diffusers pipeline from ``x_T`` (our latent layout)."""
        raise NotImplementedError

    def check_arch(self) -> None:
        """Assert the ``<family>-arch`` preset's shapes (meta device, no memory)."""
        raise NotImplementedError

    def backend_kwargs(self, bundle: Any) -> dict[str, Any]:
        """Extra ``FSDPBackend`` arguments for this family (e.g. ``trainable_attr``)."""
        return {}

    def load_exported_lora(self, pipe: Any, folder: Path) -> None:
        """Load the adapter ``backend.export_lora`` wrote into the diffusers pipeline."""
        pipe.load_lora_weights(str(folder))

    # -- geometry shared by the tests ------------------------------------------------------------

    height: ClassVar[int] = 64
    width: ClassVar[int] = 64
    num_frames: ClassVar[int] = 1  # video families: frames per sample
    steps: ClassVar[int] = 4
    guidance_scale: ClassVar[float] = 4.0
    # two prompts of different token lengths (text padding is exercised)
    prompts: ClassVar[tuple[str, ...]] = (
        "a red fox in the snow",
        'a neon sign that says "OPEN" above a small cafe at night',
    )

    def request(
        self,
        bundle: Any,
        *,
        samples_per_prompt: int,
        sde_steps: tuple[int, ...],
        guidance_scale: float,
        seed: int = 5,
    ) -> RolloutReq:
        n = len(self.prompts) * samples_per_prompt
        params = DiffusionSamplingParams(
            num_inference_steps=self.steps,
            guidance_scale=guidance_scale,
            height=self.height,
            width=self.width,
            samples_per_prompt=samples_per_prompt,
            negative_prompt="",
            num_frames=self.num_frames,
        )
        return RolloutReq(
            sample_ids=torch.arange(n),
            group_ids=torch.arange(n) // samples_per_prompt,
            primitives={
                "text": Texts(texts=[p for p in self.prompts for _ in range(samples_per_prompt)])
            },
            stage_params={
                "diffusion": DiffusionRequest(
                    init_noise_ids=torch.arange(n),
                    sde_indices=torch.tensor([list(sde_steps)] * n, dtype=torch.long).reshape(
                        n, -1
                    ),
                    sigmas=bundle.sigmas(self.steps, self.height, self.width),
                    init_noise_shape=tuple(bundle.latent_shape_for(params)),
                )
            },
            sampling_params=params,
            seed=seed,
        )

    def reference(self, pipe: Any, req: RolloutReq) -> DiffusersSample:
        return self.diffusers_sample(
            pipe,
            prompts=list(req.prompts),
            x_T=req.params_for("diffusion", DiffusionRequest).initial_noise(req.seed),
            steps=self.steps,
            guidance_scale=req.sampling_params.guidance_scale,
            negative_prompt=req.sampling_params.negative_prompt,
            height=self.height,
            width=self.width,
        )

    @staticmethod
    def assert_within(ours: torch.Tensor, theirs: torch.Tensor, atol: float, what: str) -> None:
        assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
        gap = float((ours.float() - theirs.float()).abs().max())
        assert gap <= atol, f"{what}: max |ours - diffusers| = {gap:.3g} > {atol:.1g}"

    # -- fixtures ------------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    def diffusers_pipe(self) -> Any:
        return self.load_diffusers()

    @pytest.fixture(scope="class")
    def trained(self) -> SimpleNamespace:
        """One Flow-GRPO step with LoRA through the real backend and stack (rollout batch =
        training micro-batch, old log-probs replayed)."""
        bundle = self.make_bundle()
        backend = FSDPBackend(
            bundle=bundle,
            lora=LoraConfig(rank=4, alpha=8, targets=list(self.lora_targets)),
            optimizer=OptimizerConfig(lr=2e-2),
            param_dtype="fp32",
            device="cpu",
            **self.backend_kwargs(bundle),
        )
        pipeline = self.pipeline_class(bundle=bundle, strategy=FlowSDE(eta=0.7))
        algorithm = FlowGRPO(pipeline=pipeline, clip_range=1e-3, old_logp_source="replay")
        stack = TrainStack(
            backend=backend,
            algorithm=algorithm,
            micro_batch_size=8,
            num_updates_per_batch=1,
            shuffle=False,
        )
        req = self.request(
            bundle, samples_per_prompt=4, sde_steps=(0, 1, 2), guidance_scale=self.guidance_scale
        )
        track = pipeline.generate(req).tracks["diffusion"]
        track = dataclasses.replace(track, rewards=torch.arange(len(track)).float())
        track, _ = track.compute_advantages()
        out = stack.train_track(track, 0)
        return SimpleNamespace(bundle=bundle, backend=backend, step=out["steps"][0])

    # -- the contract ----------------------------------------------------------------------------

    def test_ode_sampling_equals_diffusers(self, diffusers_pipe: Any) -> None:
        bundle = self.make_bundle()
        pipeline = self.pipeline_class(bundle=bundle, strategy=ODE())
        req = self.request(
            bundle, samples_per_prompt=1, sde_steps=(), guidance_scale=self.guidance_scale
        )
        track = pipeline.generate(req).tracks["diffusion"]
        ref = self.reference(diffusers_pipe, req)
        sigmas = req.params_for("diffusion", DiffusionRequest).sigmas
        assert torch.equal(ref.sigmas.cpu().float(), sigmas), (ref.sigmas, sigmas)
        assert track.segment.final_latents is not None
        self.assert_within(track.segment.final_latents, ref.latents, self.latent_atol, "latents")
        media = track.decoded
        pixels = media.frames if isinstance(media, Videos) else media.pixels
        self.assert_within(pixels, ref.pixels, self.pixel_atol, "pixels")

    def test_first_update_ratio_is_exactly_one(self, trained: SimpleNamespace) -> None:
        step = trained.step
        assert step["ratio/min"] == 1.0 and step["ratio/max"] == 1.0, step
        assert step["approx_kl"] == 0.0
        # the default cfg_gradient=cond_only replays the unconditional rows as their own
        # no-grad forward: bit-equal to the sampler only where its geometry is the same
        # (separate forwards, e.g. Qwen-Image); batched CFG (SD3) differs by float32 rounding.
        # The equal-geometry replay is bit-exact: test_replay_reproduces_logprobs_bit_for_bit.
        assert step["old_logp/rollout_vs_replay_max"] <= 1e-6
        assert step["grad_norm"] > 0  # the update is real

    def test_replay_reproduces_logprobs_bit_for_bit(self) -> None:
        bundle = self.make_bundle()
        pipeline = self.pipeline_class(bundle=bundle, strategy=FlowSDE(eta=0.7))
        req = self.request(
            bundle, samples_per_prompt=2, sde_steps=(0, 2), guidance_scale=self.guidance_scale
        )
        track = pipeline.generate(req).tracks["diffusion"]
        segment = track.segment
        assert segment.sde_logp is not None and segment.sde_logp.shape == (len(track), 2)
        with torch.no_grad():
            for slot in range(2):
                record = pipeline.replay(track.conditions, segment, slot)
                assert torch.equal(record.log_prob, segment.sde_logp[:, slot]), slot
                split = pipeline.replay(track.conditions, segment, slot, cfg_gradient="cond_only")
                gap = (split.log_prob - segment.sde_logp[:, slot]).abs().max()
                assert float(gap) <= 1e-6, (slot, float(gap))

    @pytest.mark.parametrize("cfg_gradient", ["both", "cond_only"])
    def test_grouped_slots_replay_every_slot(self, cfg_gradient: str) -> None:
        bundle = self.make_bundle()
        pipeline = self.pipeline_class(bundle=bundle, strategy=FlowSDE(eta=0.7))
        req = self.request(
            bundle, samples_per_prompt=2, sde_steps=(0, 1, 2), guidance_scale=self.guidance_scale
        )
        track = pipeline.generate(req).tracks["diffusion"]
        segment = track.segment
        [(slots, conditions, stacked, slot)] = slot_batches(track.conditions, segment, 3)
        assert slots == [0, 1, 2] and slot == 0
        assert len(conditions) == len(stacked) == 3 * len(track)
        with torch.no_grad():
            grouped = pipeline.replay(conditions, stacked, slot, cfg_gradient=cfg_gradient)
        for k in range(3):
            gap = (record_rows(grouped, k, 3).log_prob - segment.sde_logp[:, k]).abs().max()
            assert float(gap) <= 1e-6, (k, float(gap))

    def test_exported_lora_loads_into_diffusers(
        self, trained: SimpleNamespace, tmp_path: Path
    ) -> None:
        trained.backend.export_lora(tmp_path / "lora")
        req = self.request(
            trained.bundle, samples_per_prompt=1, sde_steps=(), guidance_scale=self.guidance_scale
        )
        ours = self.pipeline_class(bundle=trained.bundle, strategy=ODE()).generate(req)
        ours_latents = ours.tracks["diffusion"].segment.final_latents
        pipe = self.load_diffusers()
        base = self.reference(pipe, req).latents
        self.load_exported_lora(pipe, tmp_path / "lora")
        loaded = self.reference(pipe, req).latents
        moved = float((loaded - base).abs().max())
        assert moved > 1e-4, f"the exported adapter moved diffusers' latents by only {moved:.3g}"
        self.assert_within(ours_latents, loaded, self.latent_atol, "latents with the LoRA")

    def test_arch_preset_has_the_released_shapes(self) -> None:
        self.check_arch()
