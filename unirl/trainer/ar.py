"""The autoregressive trainer: a placement recipe of the loop in ``unirl.trainer.base``.

One stage, the ``text`` track: a causal-LM family (Qwen3, …) samples completions with the
trained module itself (trainside) or through SGLang's server (a dedicated layout with weight
sync, ``trainer/dedicated.py``), a text reward scores them, and a token-level loss (GRPO,
DRPO) trains on the packed completions. The driver authors the request: ids, groups and the
``TextRequest`` block (generation knobs and per-sample seed ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.config.require import ConfigError, require
from unirl.config.run import RunConfig
from unirl.config.validate import engine_kind
from unirl.data.media import ReferenceImages
from unirl.distributed.group import Handle, placement, remote
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.group.pool import PoolBase
from unirl.trainer.base import StageTrainer, write_sample_rows
from unirl.trainer.dedicated import DedicatedLayout, SyncedRollout
from unirl.trainer.request import (
    text_request,
)
from unirl.trainer.roles import RewardWorker, TrainOps, init_world, stage_roles
from unirl.trainer.stage import Stage
from unirl.types import ARSamplingParams, RolloutReq, RolloutTrack, Texts

TRACK = "text"


PLACED_ENGINES = ("trainside", "sglang")


def check_ar_recipe(cfg: RunConfig, objs: dict[str, Any] | None = None) -> None:
    """Before any Ray work: what this trainer can place. The sampling block is
    ``ARSamplingParams``; the engine is trainside or SGLang's text server (our own dedicated
    engine has no text variant yet: refused here by name). ``objs`` (the validators' objects)
    is not read yet; the entrypoint passes it as to every domain check."""
    target = str((cfg.sampling or {}).get("_target_", ""))
    require(
        target.rsplit(".", 1)[-1] == "ARSamplingParams",
        f"sampling._target_={target or None}: unirl.train_vlm samples text; use "
        "unirl.types.ARSamplingParams",
    )
    image_size = bundle_image_size(cfg)
    path = (cfg.data_source or {}).get("path")
    if path:
        from unirl.data import read_prompt_file
        from unirl.data.media import has_references

        with_images = has_references(read_prompt_file(path))
        family = (cfg.bundle or {}).get("_target_")
        require(
            not with_images or image_size is not None,
            f"data_source.path {path!r} gives every prompt an image, but {family} reads no "
            "images; use a vision-language family (unirl.models.qwen_vl.QwenVLBundle)",
        )
        require(
            with_images or image_size is None,
            f"{family} reads one image per prompt, but data_source.path {path!r} has none; give "
            "every line a media image (datasets/geometry/ shows the format)",
        )
    check_eval_images(cfg)
    kind = engine_kind(cfg)
    if kind not in PLACED_ENGINES:
        raise ConfigError(
            f"rollout._target_={cfg.rollout.get('_target_')} is a {kind!r} engine; unirl.train_vlm "
            "places the trainside engine (unirl.rollout.TrainsideEngine) or SGLang's text server "
            "(unirl.rollout.engine.sglang_llm.SGLangLLMEngine with a FullSync or LoraSync block)"
        )


def check_eval_images(cfg: RunConfig) -> None:
    """The eval file is of the training file's kind: a vision-language family reads one image
    per prompt in eval too (``check_ar_recipe`` requires it of ``data_source.path``), a text
    family none; refused before Ray instead of at the first eval."""
    from unirl.data import read_prompt_file
    from unirl.data.media import has_references

    path = cfg.eval.prompts_path
    if not path:
        return
    with_images = has_references(read_prompt_file(path))
    family = (cfg.bundle or {}).get("_target_")
    if bundle_image_size(cfg) is not None:
        require(
            with_images,
            f"eval.prompts_path {path!r} has no images, but {family} reads one image per prompt; "
            "give every eval line a media image (datasets/geometry/test.jsonl shows the format), "
            "or eval.prompts_path=null to hold out prompts of the training file",
        )
    else:
        require(
            not with_images,
            f"eval.prompts_path {path!r} gives every prompt an image, but {family} reads no "
            "images; use a text eval file or a vision-language family",
        )


def bundle_image_size(cfg: RunConfig) -> int | None:
    """The side images are resized to for a vision-language family (its typed config's
    ``image_size``), None for a text-only one."""
    from unirl.config.component import component_config, config_class_of
    from unirl.config.validate import locate

    block = cfg.bundle or {}
    if "_target_" not in block:
        return None
    family = locate(str(block["_target_"]), "bundle")
    if config_class_of(family) is None:
        return None
    size = getattr(component_config(family, block, "bundle"), "image_size", None)
    return int(size) if size is not None else None


class TextDedicatedLayout(DedicatedLayout):
    """A dedicated-engine layout (colocate / separate, weight sync) whose train slab holds a
    text stage's roles."""

    def _train_roles(self) -> dict[str, Handle]:
        return stage_roles(self.cfg, algorithm_takes="policy", ops_class=ARTrainOps)


class ARTrainOps(TrainOps):
    """:class:`TrainOps` plus what the text trainer reads from its family."""

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def describe_policy(self) -> dict[str, Any]:
        """Trainable parameters, device, vocabulary size and stop tokens of the policy."""
        bundle = self.pipeline.bundle
        return {
            "trainable_params": int(self.backend.num_trainable_params()),
            "device": str(self.backend.device),
            "vocab_size": int(bundle.vocab_size),
            "stop_token_ids": list(bundle.stop_token_ids),
        }


def response_metrics(track: RolloutTrack) -> dict[str, float]:
    """``response_length/mean|min|max`` (tokens) and ``response/clip_ratio`` (the fraction
    cut at ``max_new_tokens``) from the engine's per-sample metadata."""
    lengths = [float(m["response_tokens"]) for m in track.metadata if "response_tokens" in m]
    if not lengths:
        return {}
    clipped = [m.get("finish_reason") == "length" for m in track.metadata]
    return {
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/min": min(lengths),
        "response_length/max": max(lengths),
        "response/clip_ratio": sum(clipped) / len(clipped),
    }


class ARTrainer(StageTrainer):
    """A text recipe as a placement of the loop: one stage (the ``text`` track), trainside
    (every role a sibling on every worker) or on SGLang's server (colocated or on its own
    slab, with weight sync). ``run()`` returns the process exit code."""

    sampling: ARSamplingParams

    def __init__(self, cfg: RunConfig, data: dict[str, Any], *, dry: bool = False) -> None:
        check_ar_recipe(cfg)
        super().__init__(cfg, data, dry=dry)
        size = bundle_image_size(cfg)  # a vision-language family: one image per prompt
        self.images = ReferenceImages(size, size) if size is not None else None

    # -- placement -----------------------------------------------------------------------------

    def place_roles(self, pool: PoolBase) -> None:
        cfg = self.cfg
        sync = None
        rollout: Handle | SyncedRollout
        if engine_kind(cfg) == "trainside":
            init_world(pool, cfg)
            with placement(pool, fraction=1.0):  # every role a sibling on every worker
                train = stage_roles(cfg, algorithm_takes="policy", ops_class=ARTrainOps)
                rollout = remote(cfg.rollout, name="rollout", pipeline=train["pipeline"])
                reward = remote(RewardWorker, name="reward", service=cfg.reward)
            algorithm, stack, ops = train["algorithm"], train["stack"], train["ops"]
        else:  # SGLang's server: colocate / separate layout + weight sync (trainer/dedicated.py)
            sync = layout = TextDedicatedLayout(cfg, pool)
            rollout, reward = layout.rollout, layout.roles.reward
            algorithm, stack, ops = layout.roles.algorithm, layout.roles.stack, layout.roles.ops
            print(f"[unirl] {layout.describe()}", flush=True)
        self.rollout = rollout
        self.stages = self.one_stage(
            TRACK,
            reward=reward,
            stack=stack,
            algorithm=algorithm,
            ops=ops,
            sync=sync,
            exports_model=(cfg.backend or {}).get("lora") is None,  # a transformers causal LM
        )

    def after_place(self) -> None:
        info = self.stages[0].ops.describe_policy()
        print(
            f"[unirl] trainable parameters: {info['trainable_params']:,} on {info['device']} "
            f"(vocabulary {info['vocab_size']:,}, stop tokens {info['stop_token_ids']})",
            flush=True,
        )

    # -- request building ------------------------------------------------------------------

    def build_request(
        self, prompts: list[Any], rollout_index: int, *, mode: str = "train"
    ) -> RolloutReq:
        """Ids, groups and the text stage's ``TextRequest`` (seed ids = sample ids, so every
        sample's draws follow from ``(seed, sample id)``)."""
        sampling, images = self.sampling, None
        if self.images is not None:  # a vision-language family: each prompt's diagram
            images = self.images.pixels(prompts, repeat=self.samples_per_prompt(mode))
        stages = lambda sample_ids: {TRACK: text_request(sampling, sample_ids, mode)}  # noqa: E731
        return self.request_for(prompts, rollout_index, mode, stages, images)

    # -- what differs from media tracks ----------------------------------------------------------

    def track_metrics(self, stage: Stage, track: RolloutTrack) -> dict[str, float]:
        """The rollout's response-length statistics."""
        return response_metrics(track)

    def gallery(self, path: Path, track: RolloutTrack, limit: int) -> Path:
        """The first ``limit`` samples as JSON lines (prompt, completion, reward, length,
        finish reason) in ``<path>.jsonl``."""
        texts = track.decoded.texts if isinstance(track.decoded, Texts) else []
        meta = track.metadata or [{} for _ in range(len(track))]
        return write_sample_rows(
            path,
            track,
            min(limit, len(texts)),
            {
                "prompt": track.prompts or [""] * len(track),
                "completion": texts,
                **{
                    key: [m.get(key) for m in meta]
                    for key in ("answer", "response_tokens", "finish_reason")
                },
            },
        )


def run_ar(cfg: RunConfig, data: dict[str, Any]) -> int:
    return ARTrainer(cfg, data).run()
