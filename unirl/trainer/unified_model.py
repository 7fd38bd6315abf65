"""The unified-model trainer: a placement recipe of the loop in ``unirl.trainer.base``.

One transformer writes text and draws images: ``unirl.models.unified`` (a transfusion-style
model whose image stage denoises latents) or ``unirl.models.janus`` (Janus-Pro, whose image
stage writes VQ tokens with classifier-free guidance; the image pipeline's ``image_output =
"tokens"`` selects that stage's request and loss: an ``ImageTokenRequest`` and a token loss,
GRPO). Each rollout sample is a pair on one response:

- ``text`` (the parent track): a "think / recaption" completion after the user's prompt
  (``sampling``, an ``ARSamplingParams``; ``samples_per_prompt`` pairs per prompt);
- ``image`` (the child track): one image denoised conditioned on the prompt *and* that text
  (``unified.image.sampling``), its ``parent_ids`` naming the text sample.

The reward scores the images; the loop propagates each image's reward to its text
(``propagate_rewards``, the lineage helper every composed recipe uses); advantages are per
track (both grouped by prompt). Both tracks train the same weights through ONE backend, ONE
optimizer and one step per rollout: ``unirl.train.unified_stack.UnifiedTrainStack`` adds
``stack.text.weight · L_GRPO(text) + stack.image.weight · L_FlowGRPO(image)``.

The two stages share one stack, so the loop trains them in one call (``StageTrainer.
train_stages``: ``stack.train_tracks(text=..., image=...)``), one joint step whose metrics go
under ``train/`` (``train/loss`` the weighted sum,
``train/text/*``, ``train/image/*``). Metrics: the image stage is the main one
(``reward/mean``), the text stage's go under ``text/`` (``text/reward/mean`` of the propagated
rewards, ``text/advantage/*``, ``text/response_length/*``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from unirl.config.require import ConfigError, require
from unirl.config.run import RunConfig
from unirl.config.validate import check_block, declared, locate
from unirl.distributed.group import placement, remote
from unirl.distributed.group.pool import PoolBase
from unirl.distributed.weight_sync import SyncSource
from unirl.models.janus.conditions import ImageTokenRequest, ImageTokenSamplingParams
from unirl.models.janus.pipeline import JanusImagePipeline, JanusPipeline, JanusTextPipeline
from unirl.models.unified.bundle import TransfusionBundle
from unirl.models.unified.pipeline import (
    IMAGE_TRACK,
    TEXT_TRACK,
    TransfusionImagePipeline,
    TransfusionPipeline,
    TransfusionTextPipeline,
)
from unirl.rollout.engine.vllm_omni.hi3 import Hi3OmniEngine
from unirl.sde.sde_steps import AllSteps
from unirl.train.unified_stack import UnifiedTrainStack
from unirl.trainer.ar import response_metrics
from unirl.trainer.base import ComposedTrainer, write_sample_rows
from unirl.trainer.request import (
    text_request,
)
from unirl.trainer.roles import RewardWorker, TrainOps, init_world
from unirl.trainer.stage import ComposedStageConfig, Stage, kept_reward_stats
from unirl.types import (
    ARSamplingParams,
    DiffusionRequest,
    DiffusionSamplingParams,
    RolloutReq,
    RolloutTrack,
)


@dataclass(kw_only=True)
class ImageStageConfig:
    """``unified.image``: the image stage's ``pipeline``, ``sampling`` and ``algorithm``, blocks
    with a ``_target_``. A latent stage: a ``TransfusionImagePipeline`` with its SDE
    ``strategy``, ``DiffusionSamplingParams`` (``guidance_scale`` 1) and a flow-matching loss
    (``FlowGRPO``). An image-token stage (Janus-Pro): a ``JanusImagePipeline``,
    ``ImageTokenSamplingParams`` (CFG scale, temperature) and a token loss (``GRPO``)."""

    pipeline: dict[str, Any]
    sampling: dict[str, Any]
    algorithm: dict[str, Any]


@dataclass(kw_only=True)
class UnifiedConfig(ComposedStageConfig):
    """The recipe's ``unified`` block (the text stage is the recipe's top-level blocks)."""

    image: ImageStageConfig

    block_key: ClassVar[str] = "unified"
    entry: ClassVar[str] = "unirl.train_unified_model"
    owner: ClassVar[str] = "the image stage's"
    example: ClassVar[str] = "examples/unified_model/unified_tiny.yaml"


# -- checks before any Ray work ----------------------------------------------------------------


def image_tokens(unified: UnifiedConfig) -> bool:
    """Whether the image stage writes tokens (its pipeline class declares
    ``image_output = "tokens"``: Janus-Pro) rather than denoising latents."""
    cls = locate(str(unified.image.pipeline.get("_target_", "")), "unified.image.pipeline")
    return getattr(cls, "image_output", "latents") == "tokens"


def _subclass(block: Any, where: str, base: type, fix: str) -> type:
    target = str((block or {}).get("_target_", ""))
    require(bool(target), f"{where}._target_ is missing; {fix}")
    cls = locate(target, where)
    require(
        isinstance(cls, type) and issubclass(cls, base),
        f"{where}._target_={target} is not a {base.__name__}; {fix}",
    )
    return cls


def check_unified_recipe(
    cfg: RunConfig, objs: dict[str, Any]
) -> tuple[UnifiedConfig, DiffusionSamplingParams | ImageTokenSamplingParams]:
    """Before any Ray work, after ``validate`` checked the top-level (text) blocks: the
    ``unified`` block, the pipelines, the stack, the engine, the image stage's sampling
    (type, guidance 1, sizes this family can take) and its algorithm vs its SDE strategy."""
    unified = UnifiedConfig.of(cfg.unified)
    require(
        isinstance(objs.get("sampling"), ARSamplingParams),
        f"sampling._target_={(cfg.sampling or {}).get('_target_')}: the text stage samples "
        "tokens; use unirl.types.ARSamplingParams (the image's goes in unified.image.sampling)",
    )
    tokens = image_tokens(unified)
    _subclass(
        cfg.pipeline,
        "pipeline",
        JanusTextPipeline if tokens else TransfusionTextPipeline,
        "use unirl.models.janus.JanusTextPipeline (the text stage of a Janus image stage)"
        if tokens
        else "use unirl.models.unified.TransfusionTextPipeline (the text stage)",
    )
    _subclass(
        unified.image.pipeline,
        "unified.image.pipeline",
        JanusImagePipeline if tokens else TransfusionImagePipeline,
        "use unirl.models.unified.TransfusionImagePipeline or unirl.models.janus."
        "JanusImagePipeline (the image stage)",
    )
    _subclass(
        cfg.stack,
        "stack",
        UnifiedTrainStack,
        "use unirl.train.unified_stack.UnifiedTrainStack (one optimizer step over both losses)",
    )
    text_loss = objs["stack"].text
    per_rank = cfg.batch_size * objs["sampling"].samples_per_prompt // cfg.slab_sizes()[0]
    require(
        text_loss.max_tokens_per_micro_batch is not None
        or per_rank % text_loss.micro_batch_size == 0,
        f"{per_rank} samples per train rank are not divisible by "
        f"stack.text.micro_batch_size={text_loss.micro_batch_size}",
    )
    engine = str((cfg.rollout or {}).get("_target_", ""))
    engine_cls = locate(engine, "rollout") if engine else None
    served = isinstance(engine_cls, type) and issubclass(engine_cls, Hi3OmniEngine)
    require(
        engine.endswith("TrainsideEngine") or served,
        f"rollout._target_={engine or None}: unirl.train_unified_model samples with the trained "
        "module itself (unirl.rollout.TrainsideEngine) or, for HunyuanImage-3.0, with "
        "unirl.rollout.engine.vllm_omni.hi3.Hi3OmniEngine",
    )
    sampling = check_block(
        unified.image.sampling,
        "unified.image.sampling",
        instantiate_dataclasses=True,
        typed_component=True,
    )
    if tokens:
        sampling = _check_token_stage(cfg, unified, sampling)
        _check_pipeline_keys(unified)
        return unified, sampling
    require(
        isinstance(sampling, DiffusionSamplingParams),
        f"unified.image.sampling._target_={unified.image.sampling.get('_target_')}: the image "
        "stage samples latents; use unirl.types.DiffusionSamplingParams",
    )
    bundle = locate(str((cfg.bundle or {}).get("_target_", "")), "bundle")
    require(
        sampling.guidance_scale <= 1.0 or not issubclass(bundle, TransfusionBundle),
        f"unified.image.sampling.guidance_scale={sampling.guidance_scale}: the transfusion "
        "family has no unconditional branch; set it to 1",
    )
    size_check = getattr(bundle, "check_image_sizes", None)
    if callable(size_check):
        size_check(
            dict(cfg.bundle or {}), sampling.height, sampling.width, "unified.image.sampling"
        )
    require(
        sampling.samples_per_prompt == 1,
        f"unified.image.sampling.samples_per_prompt={sampling.samples_per_prompt}: one image per "
        "text sample (pairs per prompt are sampling.samples_per_prompt); set it to 1",
    )
    algorithm = locate(str(unified.image.algorithm["_target_"]), "unified.image.algorithm")
    if declared(algorithm, "requires_log_prob", "unified.image.algorithm", "StageAlgorithm"):
        strategy = (unified.image.pipeline.get("strategy") or {}).get("_target_", "")
        require(
            not str(strategy).endswith(".ODE"),
            f"unified.image.pipeline.strategy._target_={strategy}: {algorithm.__name__} trains "
            "on SDE log-probs; use unirl.sde.FlowSDE (or CPS / DanceSDE)",
        )
    _check_pipeline_keys(unified)
    return unified, sampling


def _check_pipeline_keys(unified: UnifiedConfig) -> None:
    """The image pipeline's keys and values (a ``Literal``'s, e.g. Janus' ``rng``) against its
    signature, after the stage-specific checks that name a better fix."""
    check_block(unified.image.pipeline, "unified.image.pipeline", instantiate_dataclasses=False)


def _check_token_stage(
    cfg: RunConfig, unified: UnifiedConfig, sampling: Any
) -> ImageTokenSamplingParams:
    """The image-token stage's sampling type, one image per text sample, a token loss."""
    require(
        isinstance(sampling, ImageTokenSamplingParams),
        f"unified.image.sampling._target_={unified.image.sampling.get('_target_')}: a Janus image "
        "stage samples tokens; use unirl.models.janus.ImageTokenSamplingParams",
    )
    require(
        sampling.samples_per_prompt == 1,
        f"unified.image.sampling.samples_per_prompt={sampling.samples_per_prompt}: one image per "
        "text sample (pairs per prompt are sampling.samples_per_prompt); set it to 1",
    )
    from unirl.algorithms.grpo import TokenPolicyLoss

    _subclass(
        unified.image.algorithm,
        "unified.image.algorithm",
        TokenPolicyLoss,
        "image tokens train with a token loss: use unirl.algorithms.GRPO",
    )
    return sampling


def check_trainable_here(cfg: RunConfig) -> None:
    """Before Ray, for a run (not a dry run): the bundle can be built for training here. A
    bundle class that declares ``trainable_here = False`` (a served model whose trainer side
    is not built) is refused with its ``not_built`` line."""
    bundle = locate(str((cfg.bundle or {}).get("_target_", "")), "bundle")
    if not getattr(bundle, "trainable_here", True):
        raise ConfigError(str(getattr(bundle, "not_built", f"{bundle} cannot train here")))


def image_summary(
    cfg: RunConfig,
    objs: dict[str, Any],
    sampling: DiffusionSamplingParams | ImageTokenSamplingParams,
) -> dict[str, Any]:
    """What ``dry_run`` prints about the image stage and the joint loss."""
    stack = cfg.stack or {}
    pairs = cfg.batch_size * objs["sampling"].samples_per_prompt
    if isinstance(sampling, ImageTokenSamplingParams):
        shape: dict[str, Any] = {
            "image_tokens": "the model's (vision_config.num_image_tokens)",
            "guidance_scale": sampling.guidance_scale,
            "trains": "text + image tokens"
            if float((stack.get("text") or {}).get("weight", 1.0)) > 0
            else "image tokens only (stack.text.weight: 0)",
        }
    else:
        shape = {
            "resolution": f"{sampling.height}x{sampling.width}",
            "num_inference_steps": sampling.num_inference_steps,
        }
    return {
        "pairs_per_rollout": pairs,
        "images_per_rollout": pairs,
        **shape,
        "loss_weights": {
            name: (stack.get(name) or {}).get("weight", 1.0) for name in ("text", "image")
        },
        "optimizer_steps_per_rollout": 1,
    }


# -- the trainer ----------------------------------------------------------------------------------


class UnifiedModelTrainer(ComposedTrainer):
    """A unified-model recipe as a placement of the loop: the ``text`` and ``image`` stages of
    one model, every role a sibling on every worker (trainside), one backend and one joint
    stack for both."""

    composed: UnifiedConfig

    def after_init(self) -> None:
        self.tokens = image_tokens(self.composed)
        self.sde_steps = None if self.tokens else self.child_sampling.sde_steps or AllSteps()

    # -- placement -----------------------------------------------------------------------------

    def place_roles(self, pool: PoolBase) -> None:
        cfg, image = self.cfg, self.composed.image
        init_world(pool, cfg)
        with placement(pool, fraction=1.0):  # every role a sibling on every worker
            bundle = remote(cfg.bundle, name="bundle")
            text_pipeline = remote(cfg.pipeline, name="text_pipeline", bundle=bundle)
            image_pipeline = remote(image.pipeline, name="image_pipeline", bundle=bundle)
            backend = remote(cfg.backend, name="backend", bundle=bundle)
            text_algorithm = remote(cfg.algorithm, name="text_algorithm", policy=text_pipeline)
            takes: dict[str, Any] = {("policy" if self.tokens else "pipeline"): image_pipeline}
            image_algorithm = remote(image.algorithm, name="image_algorithm", **takes)
            stack = remote(
                cfg.stack,
                name="stack",
                backend=backend,
                text_algorithm=text_algorithm,
                image_algorithm=image_algorithm,
            )
            ops = remote(
                TrainOps,
                name="ops",
                backend=backend,
                pipeline=image_pipeline,
                stack=stack,
                algorithm=image_algorithm,
            )
            if cfg.sync is None:  # the model samples itself, both stages through one sampler
                sampler = remote(
                    JanusPipeline if self.tokens else TransfusionPipeline,
                    name="sampler",
                    text_pipeline=text_pipeline,
                    image_pipeline=image_pipeline,
                )
                self.rollout = remote(cfg.rollout, name="rollout", pipeline=sampler)
            else:  # a served model (HunyuanImage-3.0 on vLLM-Omni) samples on its server
                self.rollout = remote(cfg.rollout, name="rollout")
                remote(SyncSource, name="sync_source", backend=backend, sync=cfg.sync)
            reward = remote(RewardWorker, name="reward", service=cfg.reward)
        self.stages = self.make_stages(
            stack=stack,
            ops=ops,
            text_algorithm=text_algorithm,
            image_algorithm=image_algorithm,
            reward=reward,
        )

    def after_place(self) -> None:
        info = self.trained[0].ops.describe(self.child_sampling)
        if not self.tokens:
            self.latent_shape = info["latent_shape"]
            self.schedules = {mode: sigmas.cpu() for mode, sigmas in info["sigmas"].items()}
        print(
            f"[unirl] unified model: {info['trainable_params']:,} trainable parameters on "
            f"{info['device']} (one backend, text + image losses)",
            flush=True,
        )

    def make_stages(
        self, *, stack: Any, ops: Any, text_algorithm: Any, image_algorithm: Any, reward: Any
    ) -> list[Stage]:
        """``text`` (metrics under ``text/``) and its child ``image`` (scored; its rewards
        reach ``text`` through lineage). Both train the one backend: they share its stack and
        ops (the loop trains stages that share a stack in one call; a checkpoint holds the backend
        in each stage's folder)."""
        cfg = self.cfg
        train_ranks, rollout_ranks = cfg.slab_sizes()
        lora = (cfg.backend or {}).get("lora") is not None
        shared = {"stack": stack, "ops": ops, "train_ranks": train_ranks}
        return [
            Stage(
                track=TEXT_TRACK,
                algorithm=text_algorithm,
                rollout_ranks=rollout_ranks,
                prefix=TEXT_TRACK,
                **shared,
            ),
            Stage(
                track=IMAGE_TRACK,
                parent=TEXT_TRACK,
                reward=reward,
                reward_from_children="mean",
                algorithm=image_algorithm,
                rollout_ranks=rollout_ranks,
                exports_lora=lora,
                exports_model=not lora,  # one model: exported once, from the image stage
                **shared,
            ),
        ]

    # -- request building ------------------------------------------------------------------

    def build_request(
        self, prompts: list[Any], rollout_index: int, *, mode: str = "train"
    ) -> RolloutReq:
        """Ids and groups of the (text, image) pairs; the ``TextRequest`` (seed ids = sample
        ids) and the :class:`DiffusionRequest` with its sampling params (x_T ids = sample ids, SDE steps, σ)."""
        sampling = self.sampling

        def stages(sample_ids: torch.Tensor) -> dict[str, Any]:
            image: ImageTokenRequest | DiffusionRequest
            if self.tokens:
                image = self._token_request(sample_ids, mode)
            else:  # x_T ids = sample ids; the image stage's own sampling params ride along
                image = self.latent_request(
                    self.child_sampling,
                    sample_ids,
                    rollout_index,
                    mode,
                    trains_sde=True,
                    own_params=True,
                )
            return {TEXT_TRACK: text_request(sampling, sample_ids, mode), IMAGE_TRACK: image}

        return self.request_for(prompts, rollout_index, mode, stages)

    def _token_request(self, sample_ids: Any, mode: str) -> ImageTokenRequest:
        """The image-token stage: seed ids = sample ids (their own uniform stream), the
        model's image tokens, the guidance scale and temperature of ``mode``."""
        params = self.child_sampling
        return ImageTokenRequest(
            seed_ids=sample_ids.clone(),
            max_new_tokens=1,  # the pipeline draws the model's num_image_tokens
            temperature=params.temperature_for(mode),
            top_k=params.top_k,
            top_p=params.top_p,
            guidance_scale=params.guidance_scale,
        )

    # -- what the text stage adds ---------------------------------------------------------------

    def track_metrics(self, stage: Stage, track: RolloutTrack) -> dict[str, float]:
        """The text stage's propagated rewards and response lengths (both stages train in one
        joint call of their shared stack: the base's ``train_stages``)."""
        if stage.track != TEXT_TRACK:
            return {}
        return {**response_metrics(track), **kept_reward_stats(track)}

    def gallery(self, path: Path, track: RolloutTrack, limit: int) -> Path:
        """Images captioned with the text the model wrote before drawing them (PNG), and
        ``<path>.jsonl``: prompt, text, reward per image."""
        thoughts = [str(m.get("thought", "")) for m in track.metadata]
        prompts = track.prompts or [""] * len(track)
        captions = [f"{p} | {t}" for p, t in zip(prompts, thoughts, strict=True)]
        sheet = super().gallery(path, dataclasses.replace(track, prompts=captions), limit)
        write_sample_rows(path, track, limit, {"prompt": prompts, "text": thoughts})
        return sheet


def run_unified(cfg: RunConfig, data: dict[str, Any], unified: UnifiedConfig) -> int:
    return UnifiedModelTrainer(cfg, data, unified).run()


__all__ = [
    "ImageStageConfig",
    "UnifiedConfig",
    "UnifiedModelTrainer",
    "check_unified_recipe",
    "image_summary",
    "run_unified",
]
