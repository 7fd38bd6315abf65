"""The unified train stack: one backend, two losses, one optimizer step.

The joint gradient is the weighted sum of the two losses' gradients computed separately. With
power-of-two weights the scaling itself is exact in floating point (asserted bit for bit); the
sum is not, because autograd accumulates each backward (every micro-batch, and every trained
SDE slot of Flow-GRPO) into ``.grad`` in turn, so the joint run adds the image terms onto the
text gradient one by one: ``|joint - sum| <= 1e-10 + 1e-5 |sum|`` elementwise."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from unirl.algorithms import GRPO, FlowGRPO
from unirl.models.unified import (
    TransfusionBundle,
    TransfusionImagePipeline,
    TransfusionPipeline,
    TransfusionTextPipeline,
)
from unirl.sde import FlowSDE
from unirl.train import FSDPBackend, OptimizerConfig
from unirl.train.unified_stack import UnifiedTrainStack
from unirl.types import (
    ARSamplingParams,
    DiffusionRequest,
    DiffusionSamplingParams,
    RolloutReq,
    TextRequest,
    Texts,
)

N = 4


def build(text_weight: float, image_weight: float, text_mb: int, image_mb: int) -> Any:
    bundle = TransfusionBundle(path="tiny", dtype="fp32", device="cpu", max_grid=8)
    backend = FSDPBackend(
        bundle=bundle,
        lora=None,
        optimizer=OptimizerConfig(lr=1e-3),
        param_dtype="fp32",
        device="cpu",
        trainable_attr="model",
    )
    text = TransfusionTextPipeline(bundle=bundle)
    image = TransfusionImagePipeline(bundle=bundle, strategy=FlowSDE(eta=0.7))
    stack = UnifiedTrainStack(
        backend=backend,
        text_algorithm=GRPO(policy=text, old_logp_source="replay"),
        image_algorithm=FlowGRPO(pipeline=image, clip_range=1e-3, old_logp_source="replay"),
        text={"weight": text_weight, "micro_batch_size": text_mb},
        image={"weight": image_weight, "micro_batch_size": image_mb},
        shuffle=False,
    )
    return bundle, backend, TransfusionPipeline(text_pipeline=text, image_pipeline=image), stack


def tracks(bundle: Any, pipe: Any) -> dict[str, Any]:
    params = DiffusionSamplingParams(
        num_inference_steps=3, guidance_scale=1.0, height=32, width=32, samples_per_prompt=2
    )
    req = RolloutReq(
        sample_ids=torch.arange(N),
        group_ids=torch.arange(N) // 2,
        primitives={"text": Texts(texts=["a red fox", "a red fox", "blue sky", "blue sky"])},
        stage_params={
            "text": TextRequest(seed_ids=torch.arange(N), max_new_tokens=5, temperature=1.0),
            "image": DiffusionRequest(
                init_noise_ids=torch.arange(N),
                sde_indices=torch.tensor([[0, 1]] * N),
                sigmas=bundle.sigmas(3, 32, 32),
                init_noise_shape=bundle.latent_shape_for(params),
                sampling_params=params,
            ),
        },
        sampling_params=ARSamplingParams(max_new_tokens=5),
        seed=7,
    )
    resp = pipe.generate(req)
    out = {}
    for name, track in resp.tracks.items():
        rewards = torch.tensor([0.1, 0.9, 0.4, -0.3]) * (1 if name == "image" else -1)
        out[name], _ = dataclasses.replace(track, rewards=rewards).compute_advantages()
    return out


def grads(backend: Any) -> list[torch.Tensor]:
    return [
        (p.grad if p.grad is not None else torch.zeros_like(p)).clone()
        for p in backend.trainable_parameters()
    ]


@pytest.mark.parametrize(("text_mb", "image_mb"), [(4, 4), (2, 1)])
def test_joint_gradient_is_the_weighted_sum(text_mb: int, image_mb: int) -> None:
    bundle, backend, pipe, stack = build(0.5, 2.0, text_mb, image_mb)
    both = tracks(bundle, pipe)
    micro = stack.prepare(both, 0)
    stack.backward(micro)
    joint = grads(backend)
    separate = []
    for name, weight in (("text", 0.5), ("image", 2.0)):
        alone = {k: (v if k == name else []) for k, v in micro.items()}
        stack.backward(alone)  # zero_grad, then this track's micro-batches only
        separate.append((weight, grads(backend)))
        # the same track at weight 1 gives the unweighted gradient: weight · g exactly
        unit_weight = dataclasses.replace(getattr(stack.config, name), weight=1.0)
        stack.config = dataclasses.replace(stack.config, **{name: unit_weight})
        stack.backward(alone)
        unit = grads(backend)
        for g, u in zip(separate[-1][1], unit, strict=True):
            assert torch.equal(g, weight * u)
    total = [a + b for a, b in zip(separate[0][1], separate[1][1], strict=True)]
    assert any(float(g.abs().max()) > 0 for g in separate[0][1])  # both losses reach the weights
    assert any(float(g.abs().max()) > 0 for g in separate[1][1])
    for j, t in zip(joint, total, strict=True):
        torch.testing.assert_close(j, t, rtol=1e-5, atol=1e-10)


def test_one_optimizer_step_both_losses_finite_first_ratios_one() -> None:
    bundle, _backend, pipe, stack = build(1.0, 1.0, 2, 2)
    both = tracks(bundle, pipe)
    before = stack.stacks["text"].param_checksum()
    out = stack.train_tracks(both["text"], both["image"], 0)
    (step,) = out["steps"]
    assert stack.global_step == 1 and "nonfinite/skipped_step" not in step
    assert torch.isfinite(torch.tensor([step["text/loss"], step["image/loss"]])).all()
    assert step["loss"] == pytest.approx(step["text/loss"] + step["image/loss"], abs=1e-6)
    assert step["image/ratio/min"] == 1.0 and step["image/ratio/max"] == 1.0
    assert step["old_logp/rollout_vs_replay_max"] <= 1e-6
    assert out["param_checksum"] != before


def test_out_of_memory_names_both_tracks_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    bundle, _backend, pipe, stack = build(1.0, 1.0, 2, 2)
    both = tracks(bundle, pipe)
    image_algorithm = stack.algorithms["image"]
    image_algorithm.slots_per_forward = 2

    def out_of_memory(*_args: Any, **_kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.")

    monkeypatch.setattr(image_algorithm, "compute_loss_and_backward", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError) as info:
        stack.train_tracks(both["text"], both["image"], 5)
    assert str(info.value) == (
        "out of memory in the training step of rollout 5: lower stack.text.micro_batch_size "
        "(now 2) or stack.image.micro_batch_size (now 2) or "
        "unified.image.algorithm.slots_per_forward (now 2), or set "
        "backend.fsdp.activation_checkpointing=true; CUDA out of memory. Tried to allocate "
        "4.00 GiB."
    )
