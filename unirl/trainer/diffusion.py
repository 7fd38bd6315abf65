"""The diffusion trainer: a placement recipe of the loop in ``unirl.trainer.base``.

It builds one stage (the ``diffusion`` track) from the recipe's blocks, every component a
sibling ``Remote`` on the same workers (trainside) or split over slabs (dedicated engines),
and authors the request: ids, groups, the σ schedule, the SDE steps and the x_T recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from unirl.config.require import ConfigError, require
from unirl.config.run import RunConfig
from unirl.config.validate import declared, engine_kind, locate
from unirl.data.media import ReferenceImages, has_references
from unirl.distributed.group import ParallelSizes, placement, remote
from unirl.distributed.group.pool import PoolBase
from unirl.sde.sde_steps import AllSteps
from unirl.trainer.base import StageTrainer
from unirl.trainer.dedicated import build_dedicated_layout
from unirl.trainer.roles import RewardWorker, init_world, stage_roles
from unirl.types import DiffusionSamplingParams, RolloutReq

TRACK = "diffusion"


def check_diffusion_recipe(cfg: RunConfig, objs: dict[str, Any]) -> None:
    """What ``unirl.train_diffusion`` checks before Ray beyond the generic validators: the
    editing inputs (train and eval prompt files) and a reward that can score what the family
    decodes (videos need video scorers)."""
    check_edit_inputs(cfg)
    check_reward_media(cfg)
    check_sequence_parallel_model(cfg)


def check_sequence_parallel_model(cfg: RunConfig) -> None:
    """``parallel.sequence_parallel_size`` > 1: the trained transformer (built on the meta
    device from the family's config) has a Ulysses shard plan and a head count the SP size
    divides; refused here, before Ray. A family whose config is not readable here is checked
    when the backend enables SP (the same errors, from the workers)."""
    sp = cfg.parallel.sequence_parallel_size
    block = cfg.bundle or {}
    if sp == 1 or "_target_" not in block:
        return
    from unirl.models.common.sequence_parallel import PLANS, plan_of

    family = locate(str(block["_target_"]), "bundle")
    on_meta = getattr(family, "trainable_on_meta", None)
    module = on_meta(dict(block)) if on_meta is not None else None
    where = f"parallel.sequence_parallel_size={sp}"
    require(
        on_meta is not None,
        f"{where}: {family.__name__} has no sequence-parallel shard plan (families with one: "
        f"{sorted(PLANS)}); set parallel.sequence_parallel_size=1",
    )
    if module is None:
        return
    planned = [m for m in module.modules() if type(m).__name__ in PLANS]
    require(
        bool(planned),
        f"{where}: {family.__name__} trains a {type(module).__name__}, which has no "
        f"sequence-parallel shard plan (transformers with one: {sorted(PLANS)}); set "
        "parallel.sequence_parallel_size=1",
    )
    check_sequence_parallel_tokens(cfg, family, block, where)
    for transformer in planned:
        plan = plan_of(transformer)
        for name, sub in transformer.named_modules():
            heads = getattr(sub, "heads", None)
            if name and plan.self_attention(name) and isinstance(heads, int):
                require(
                    heads % sp == 0,
                    f"{where}: {type(transformer).__name__} has {heads} attention heads, which "
                    f"do not split over {sp} ranks (Ulysses needs the head count to be a "
                    "multiple of the SP size); choose an SP size that divides it",
                )
                break


def check_sequence_parallel_tokens(
    cfg: RunConfig, family: Any, block: Mapping[str, object], where: str
) -> None:
    """The video's tokens per sample at the recipe's geometry split evenly over the SP group
    (Ulysses gives each rank the same share); refused here instead of at the first forward,
    after the weights have loaded."""
    sampling = cfg.sampling
    if not isinstance(sampling, Mapping):
        return
    sizes = [sampling.get(key) for key in ("height", "width", "num_frames")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
        return
    height, width, frames = (int(v) for v in sizes)  # type: ignore[arg-type]
    tokens = family.video_tokens_of(block, height, width, frames)
    sp = cfg.parallel.sequence_parallel_size
    if tokens is None or tokens % sp == 0:
        return
    dividing = [str(p) for p in range(2, 9) if tokens % p == 0]
    raise ConfigError(
        f"{where}: a {frames}-frame {width}x{height} video is {tokens} transformer tokens per "
        f"sample, which do not split evenly over {sp} ranks; choose a size or frame count "
        f"whose token count is a multiple of {sp}, or an SP size that divides it (up to 8: "
        f"{', '.join(dividing) or 'none'})",
    )


def _references_of(path: str) -> bool:
    from unirl.data import read_prompt_file

    return has_references(read_prompt_file(path))


def check_edit_inputs(cfg: RunConfig) -> None:
    """An editing prompt file (every line has a reference image) needs a family that takes
    references, a reward that compares result with source needs an editing file, and the eval
    file of an editing recipe is an editing set too (and of a plain one, plain); each refused
    here, before Ray, with one line."""
    path = (cfg.data_source or {}).get("path")
    if not path:
        return
    edits = _references_of(str(path))
    if cfg.eval.prompts_path:
        eval_edits = _references_of(cfg.eval.prompts_path)
        kind = "gives every prompt a reference image" if edits else "has plain prompts"
        require(
            eval_edits == edits,
            f"eval.prompts_path {cfg.eval.prompts_path!r} "
            f"{'has no reference images' if edits else 'has reference images'}, but "
            f"data_source.path {path!r} {kind}; give an eval file of the same kind (an "
            "editing or image-to-video set: every line with its 'media' image; "
            "datasets/make_edit_prompts.py writes editing sets), or eval.prompts_path=null to "
            "hold out prompts of the training file",
        )
    if cfg.bundle and "_target_" in cfg.bundle:
        family = locate(str(cfg.bundle["_target_"]), "bundle")
        takes = bool(getattr(family, "takes_references", False))
        require(
            takes or not edits,
            f"data_source.path {path!r} is an editing set (every prompt has a reference image) "
            f"but {family.__name__} takes no reference images; use an editing family "
            "(unirl.models.flux2.Flux2KleinBundle) or a prompt file without 'media'",
        )
        needs = getattr(family, "requires_references", None)
        if callable(needs) and needs(dict(cfg.bundle)):
            require(
                edits,
                f"bundle.path={cfg.bundle.get('path')!r} is an image-to-video model (it starts "
                f"every video from a first frame), but data_source.path {path!r} has no "
                "reference images; give every line a 'media' image (datasets/video/i2v.jsonl "
                "shows the format) or use a text-to-video model",
            )
    for _, target in _reward_scorers(cfg.reward, "reward"):
        scorer = locate(target, "reward")
        if getattr(scorer, "needs_references", False):
            require(
                edits,
                f"reward {target.rsplit('.', 1)[-1]} compares each result with its source "
                f"image, but data_source.path {path!r} has no reference images; use an "
                "editing prompt file (datasets/make_edit_prompts.py) or another reward",
            )


def _reward_scorers(block: Any, where: str) -> list[tuple[str, str]]:
    """``(where, _target_)`` of every block inside the reward block (components, guards,
    nested backends), outermost first."""
    if isinstance(block, dict):
        found = [(where, str(block["_target_"]))] if "_target_" in block else []
        for key, value in block.items():
            found += _reward_scorers(value, f"{where}.{key}")
        return found
    if isinstance(block, list):
        return [f for i, v in enumerate(block) for f in _reward_scorers(v, f"{where}[{i}]")]
    return []


def _image_only_scorers(block: Any, where: str) -> list[tuple[str, str]]:
    """``(where, _target_)`` of the reward backends in ``block`` that score images only (no
    ``score_video`` of their own). A weighted backend is judged by its components; a video
    scorer (``PerFrame`` around an image scorer included) is not looked into."""
    from unirl.reward.base import RewardBackend
    from unirl.reward.multi import WeightedRewardBackend

    if isinstance(block, list):
        return [f for i, v in enumerate(block) for f in _image_only_scorers(v, f"{where}[{i}]")]
    if not isinstance(block, dict):
        return []
    if "_target_" in block:
        cls = locate(str(block["_target_"]), where)
        weighted = isinstance(cls, type) and issubclass(cls, WeightedRewardBackend)
        if isinstance(cls, type) and issubclass(cls, RewardBackend) and not weighted:
            takes_video = cls.score_video is not RewardBackend.score_video
            return [] if takes_video else [(where, str(block["_target_"]))]
    return [
        f
        for key, value in block.items()
        if key != "_target_"
        for f in _image_only_scorers(value, f"{where}.{key}")
    ]


def check_reward_media(cfg: RunConfig) -> None:
    """A video family's track holds videos: every reward backend on it scores videos (an
    image scorer is refused here, before Ray, rather than on the first rollout)."""
    from unirl.models.common.geometry import VideoLatentGeometry

    target = str((cfg.bundle or {}).get("_target_", ""))
    if not target:
        return
    family = locate(target, "bundle")
    if not (isinstance(family, type) and issubclass(family, VideoLatentGeometry)):
        return
    image_only = _image_only_scorers(cfg.reward, "reward")
    if image_only:
        where, scorer = image_only[0]
        raise ConfigError(
            f"{where}: {scorer} scores images, but {family.__name__} decodes videos; wrap it "
            f"as {{_target_: unirl.reward.local.PerFrame, aggregate: mean, scorer: {{...}}}} to "
            "score each frame, or use a video reward (unirl.reward.local.VideoPickScore, "
            "TemporalConsistency)"
        )


class DiffusionTrainer(StageTrainer):
    """A diffusion recipe as a placement of the loop: one stage (the ``diffusion`` track),
    trainside (every role a sibling on every worker) or dedicated (own engine copy, colocated
    or on its own slab, with weight sync). ``run()`` returns the process exit code."""

    sampling: DiffusionSamplingParams

    def __init__(self, cfg: RunConfig, data: dict[str, Any], *, dry: bool = False) -> None:
        super().__init__(cfg, data, dry=dry)
        self.sde_steps = self.sampling.sde_steps or AllSteps()
        # ratio losses train recorded SDE steps; likelihood-free ones (NFT) sample with the ODE;
        # reward-gradient losses (stores_steps) keep the ODE chain's inputs at those steps
        algorithm_cls = locate(str(cfg.algorithm["_target_"]), "algorithm")
        self.trains_sde_steps = bool(
            declared(algorithm_cls, "requires_log_prob", "algorithm", "StageAlgorithm")
        ) or bool(getattr(algorithm_cls, "stores_steps", False))
        self.dedicated: Any = None
        self.references = ReferenceImages(self.sampling.height, self.sampling.width)

    @property
    def algorithm(self) -> Any:
        return self.stages[0].algorithm

    # -- placement -----------------------------------------------------------------------------

    def place_roles(self, pool: PoolBase) -> None:
        cfg = self.cfg
        sync = None
        if engine_kind(cfg) == "trainside":
            init_world(pool, cfg)
            # sequence parallelism: the ranks of one SP group are one data-parallel rank (the
            # same rows for every role); the backend splits each video's tokens over them
            parallel = ParallelSizes(sp=cfg.parallel.sequence_parallel_size)
            with placement(pool, fraction=1.0):  # every role a sibling on every worker
                train = stage_roles(cfg, parallel=parallel)
                reward = remote(RewardWorker, name="reward", service=cfg.reward, parallel=parallel)
                # rollout.reward_overlap: the engine scores chunks through its reward sibling
                overlap = {"reward": reward} if cfg.rollout.get("reward_overlap") else {}
                rollout = remote(
                    cfg.rollout,
                    name="rollout",
                    pipeline=train["pipeline"],
                    parallel=parallel,
                    **overlap,
                )
            algorithm, stack, ops = train["algorithm"], train["stack"], train["ops"]
        else:  # [dedicated engines] colocate / separate layout + weight sync: trainer/dedicated.py
            self.dedicated = sync = build_dedicated_layout(cfg, pool)
            roles = self.dedicated.roles
            rollout, reward, algorithm = self.dedicated.rollout, roles.reward, roles.algorithm
            stack, ops = roles.stack, roles.ops
            print(f"[unirl] {self.dedicated.describe()}", flush=True)
        self.rollout = rollout
        self.stages = self.one_stage(
            TRACK, reward=reward, stack=stack, algorithm=algorithm, ops=ops, sync=sync
        )

    def after_place(self) -> None:
        """Read the family's σ schedules and latent geometry (the driver authors σ and x_T)."""
        info = self.stages[0].ops.describe(self.sampling)
        self.latent_shape = info["latent_shape"]
        self.schedules = {mode: sigmas.cpu() for mode, sigmas in info["sigmas"].items()}
        self.device_name = info["device_name"]
        print(
            f"[unirl] trainable parameters: {info['trainable_params']:,} on {info['device']}",
            flush=True,
        )

    # -- request building ------------------------------------------------------------------

    def build_request(
        self, prompts: list[Any], rollout_index: int, *, mode: str = "train"
    ) -> RolloutReq:
        """The driver-authored request: ids, groups, and the diffusion stage's block (σ
        schedule, SDE steps, x_T recipe: x_T ids = sample ids) under the track's name; an
        editing set's rows carry their source image."""
        spp = self.samples_per_prompt(mode)

        def stages(sample_ids: torch.Tensor) -> dict[str, Any]:
            trains = self.trains_sde_steps
            return {
                TRACK: self.latent_request(
                    self.sampling, sample_ids, rollout_index, mode, trains_sde=trains
                )
            }

        # an editing set: each row carries its source image
        images = self.references.pixels(prompts, repeat=spp) if has_references(prompts) else None
        return self.request_for(prompts, rollout_index, mode, stages, images)


def run_diffusion(cfg: RunConfig, data: dict[str, Any]) -> int:
    return DiffusionTrainer(cfg, data).run()
