"""What every domain trainer shares: the loop over stages (``StageTrainer``) and trackers;
the output folder and resume discovery are in ``output.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from unirl.algorithms.advantages import advantages_for
from unirl.config.dry_run import print_plan
from unirl.config.require import ConfigError, require
from unirl.config.run import RunConfig
from unirl.config.secrets import redact_secrets, secret_values
from unirl.distributed.group import DevicePool, DevicePoolConfig, DryRunPool, StalledCallError
from unirl.distributed.group.pool import PoolBase
from unirl.logging import LocalTracker, build_trackers, contact_sheet, edit_sheet, video_sheet
from unirl.logging.progress import RolloutProgress
from unirl.logging.report import refresh_run_views
from unirl.train.checkpoint import CheckpointError, fault_point, write_failure
from unirl.trainer.console import TRAIN_LOG, ConsoleLog
from unirl.trainer.dynamic_sampling import fill_informative
from unirl.trainer.model_card import write_model_card
from unirl.trainer.output import (
    DRIVER_STATE,
    OutputDir,
    incompatible_resume,
    resolve_resume,
    write_json_atomic,
)
from unirl.trainer.request import diffusion_request, prompt_request
from unirl.trainer.roles import light_track, pixels_of
from unirl.trainer.run_info import RunInfo
from unirl.trainer.stage import ComposedStageConfig, Stage, order_stages, propagate_rewards
from unirl.trainer.stop import StopRequest, stop_line
from unirl.types import STATUS_OK, ARSamplingParams, Images, RolloutReq, RolloutTrack, Videos


def make_trackers(cfg: RunConfig, out: OutputDir, data: dict[str, Any]) -> Any:
    return build_trackers(
        cfg.logging.trackers,
        out.root,
        config=redact_secrets(data),
        wandb_project=cfg.logging.wandb_project,
        wandb_run_name=cfg.logging.wandb_run_name,
    )


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average metrics dicts (equal-size shards, so means of means are exact means)."""
    keys: list[str] = []
    for d in per_rank:
        keys.extend(k for k in d if k not in keys)
    out = {}
    for k in keys:
        vals = [float(d[k]) for d in per_rank if k in d]
        if k.endswith("/max") or k.endswith("_max"):
            out[k] = max(vals)
        elif k.endswith("/min"):
            out[k] = min(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out


# -- the loop, once for every domain ------------------------------------------------------------


def reward_metrics(scored: RolloutTrack) -> dict[str, float]:
    """``reward/mean``, ``reward/std``, per component, and every counter or statistic the
    reward service reported on its shards (``guard/*``, ``<scorer>/failures``,
    ``<scorer>/nonfinite``, …): counts are summed over shards, the rest averaged."""
    assert scored.rewards is not None
    ok = scored.status == STATUS_OK
    rewards = scored.rewards.float()[ok]
    out = {
        "reward/mean": float(rewards.mean()) if rewards.numel() else math.nan,
        "reward/std": float(rewards.std(unbiased=False)) if rewards.numel() > 1 else 0.0,
    }
    for name, values in (scored.component_rewards or {}).items():
        v = values.float()[ok]
        out[f"reward/{name}/mean"] = float(v.mean()) if v.numel() else math.nan
        out[f"reward/{name}/std"] = float(v.std(unbiased=False)) if v.numel() > 1 else 0.0
    shards = [m.pop("_reward_metrics") for m in scored.metadata if "_reward_metrics" in m]
    for key, value in mean_over_ranks(shards).items():
        out[key] = value * len(shards) if is_count(key) else value
    return out


@contextlib.contextmanager
def after_failure_skip_stalled(cleanup: Callable[[], Any]) -> Iterator[None]:
    """Run ``cleanup`` (calls on the workers) after the block, as a ``finally`` would, except
    after a :class:`StalledCallError`: the stalled worker would stall the cleanup call too, so
    the run would fail a second bound later naming the cleanup (``ops.end_sampling``) instead
    of the call that stalled (``rollout.generate``). After another failure the cleanup still
    runs, and an error of its own never replaces the one that ended the block."""
    try:
        yield
    except StalledCallError:
        raise
    except BaseException:
        with contextlib.suppress(Exception):
            cleanup()
        raise
    cleanup()


def degenerate_sampling_warnings(cfg: RunConfig) -> list[str]:
    """Legal settings that make training a no-op, as warning lines printed on the first
    rollout: greedy token sampling (``sampling.temperature=0``) draws the same completion for
    every sample of a group, so every advantage, and every gradient, is zero."""
    from unirl.types import ARSamplingParams

    sampling = cfg.sampling or {}
    target = str(sampling.get("_target_", "")) if isinstance(sampling, dict) else ""
    if target.rsplit(".", 1)[-1] != "ARSamplingParams":
        return []
    params = ARSamplingParams(**{k: v for k, v in sampling.items() if not k.startswith("_")})
    group = params.samples_per_prompt
    if params.temperature != 0 or group < 2:
        return []
    return [
        f"[unirl] warning: sampling.temperature=0 samples greedily: the {group} completions of "
        "each prompt are identical, so every group's advantages and the gradients are zero and "
        "the run trains nothing; set sampling.temperature > 0 (e.g. 1.0) to train"
    ]


def write_sample_rows(
    path: Path, track: RolloutTrack, limit: int, columns: dict[str, list[Any]]
) -> Path:
    """``<path>.jsonl``: one JSON line per sample of the first ``limit``: its ``sample_id``,
    the given ``columns`` (one value per sample) and its ``reward`` (NaN before scoring)."""
    out = path.with_suffix(".jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    rewards = track.rewards.tolist() if track.rewards is not None else [math.nan] * len(track)
    with out.open("w", encoding="utf-8") as f:
        for i in range(min(limit, len(track))):
            row = {
                "sample_id": int(track.sample_ids[i]),
                **{name: values[i] for name, values in columns.items()},
                "reward": rewards[i],
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out


def is_count(key: str) -> bool:
    """Metrics that count events (summed over shards rather than averaged)."""
    leaf = key.rsplit("/", 1)[-1]
    return (
        leaf in ("failures", "nonfinite", "dropped_groups", "dropped_samples")
        or key.startswith("reward/failures/")
        or leaf.endswith("_count")
    )


class StageTrainer:
    """The loop of every domain, over the stages of each response:

        rollout -> reward on scored tracks -> propagate to parents -> advantages per track
                -> train per stage -> sync per stage

    plus what every run shares: the output folder, resume, trackers, periodic eval, checkpoint
    cadence and export. A domain trainer is a placement recipe: :meth:`place` builds its roles
    in placement blocks and sets ``self.rollout`` (the engine the driver calls) and
    ``self.stages``; :meth:`build_request` authors the request of the root track.
    ``run()`` returns the process exit code.
    """

    # the recipe's sampling block, built here (each domain narrows its type); a diffusion
    # stage's author also reads the family's σ schedules, latent shape (after_place) and the
    # recipe's SDE-step schedule
    sampling: Any
    schedules: dict[str, torch.Tensor]
    latent_shape: tuple[int, ...]
    sde_steps: Any

    def __init__(self, cfg: RunConfig, data: dict[str, Any], *, dry: bool = False) -> None:
        """``dry``: built only to plan (:meth:`plan`): no output folder is made."""
        from hydra.utils import instantiate

        self.cfg = cfg
        self.data = data
        self.out = OutputDir(cfg.output_dir, create=not dry)
        self.data_source = instantiate(cfg.data_source, _convert_="object")
        self.data_source.set_prompts_per_rollout(cfg.batch_size)
        self.sampling = instantiate(cfg.sampling, _convert_="object")
        self.eval_held_out = self._hold_out_eval_prompts()
        self.start_rollout = 0
        self.rollout: Any = None
        self.stages: list[Stage] = []
        self.eval_tracker: LocalTracker | None = None

    def _hold_out_eval_prompts(self) -> list[Any]:
        """Without ``eval.prompts_path`` the eval set is the last ``eval.num_prompts`` prompts
        of the training file, held out of training (never evaluate on what was trained on)."""
        cfg = self.cfg
        if cfg.eval.prompts_path or not cfg.eval_interval:
            return []
        hold_out = getattr(self.data_source, "hold_out", None)
        if hold_out is None:
            raise ConfigError(
                f"eval.prompts_path is null and {type(self.data_source).__name__} cannot hold "
                "prompts out of training; give eval.prompts_path (a held-out prompt file)"
            )
        return list(hold_out(cfg.eval.num_prompts))

    # -- the domain's part -------------------------------------------------------------------

    def place_roles(self, pool: PoolBase) -> None:
        """Build every role in its placement block; set ``self.rollout`` and ``self.stages``.
        Nothing here may call a role except behind ``pool.plans_only`` (the dry run places
        on a :class:`DryRunPool` with this same method)."""
        raise NotImplementedError

    def one_stage(
        self,
        track: str,
        *,
        reward: Any,
        stack: Any,
        algorithm: Any,
        ops: Any,
        sync: Any,
        exports_model: bool = False,
    ) -> list[Stage]:
        """The stage list of a one-stage recipe (diffusion, text): its ranks from the recipe's
        slabs; it exports its adapter after a LoRA run; ``exports_model``: the whole trained
        model as a ``save_pretrained`` folder (a full fine-tune of a transformers family)."""
        train_ranks, rollout_ranks = self.cfg.slab_sizes()
        return [
            Stage(
                track=track,
                reward=reward,
                stack=stack,
                algorithm=algorithm,
                ops=ops,
                sync=sync,
                train_ranks=train_ranks,
                rollout_ranks=rollout_ranks,
                exports_lora=(self.cfg.backend or {}).get("lora") is not None,
                exports_model=exports_model,
            )
        ]

    def after_place(self) -> None:
        """What the driver reads from the placed roles (the family's σ schedules and latent
        geometry, parameter counts); runs in a real run only."""

    def place(self, pool: PoolBase) -> None:
        """:meth:`place_roles`, then :meth:`after_place`, then which modes each trained
        stage's weights switch for sampling (two calls per rollout saved where none do)."""
        self.place_roles(pool)
        self.after_place()
        asked: dict[int, tuple[str, ...]] = {}  # stages that share ops (unified) ask once
        for i, stage in enumerate(self.stages):
            if stage.trains:
                key = id(stage.ops)
                if key not in asked:
                    asked[key] = tuple(stage.ops.sampling_switches())
                self.stages[i] = dataclasses.replace(stage, sampling_switches=asked[key])

    def planned(self) -> list[tuple[str, str, str]]:
        """The placement plan ``dry_run`` prints: :meth:`place_roles` on a :class:`DryRunPool`
        of the recipe's pool (no Ray, no weights); ``(role, target, where)`` rows, the same
        rows the real run prints once its roles are up (a trainer built with ``dry=True``
        writes nothing)."""
        refusal = self.recorded_resume_refusal()
        if refusal is not None:  # what the run would refuse before Ray, the plan refuses too
            raise ConfigError(refusal)
        pool = DryRunPool(DevicePoolConfig.of(self.cfg))
        self.place_roles(pool)
        return pool.plan_rows()

    def recorded_resume_refusal(self) -> str | None:
        """For a dry run of a resume: :func:`incompatible_resume` against the recipe recorded
        in the checkpoint it would load (``resume=<folder>``, or the newest
        ``checkpoints/step_*`` for ``auto``), read from its ``driver_state.json`` alone (the
        run verifies the files too, before Ray)."""
        cfg = self.cfg
        if cfg.resume in (None, "", "none", "null"):
            return None
        if cfg.resume == "auto":
            folders = self.out.checkpoint_folders()
            path = folders[-1] if folders else None
        else:
            path = Path(cfg.resume)
        if path is None or not (path / DRIVER_STATE).is_file():
            return None
        return incompatible_resume(self.data, path, self._driver_state(path).get("config"))

    def build_request(
        self, prompts: list[Any], rollout_index: int, *, mode: str = "train"
    ) -> RolloutReq:
        """The driver-authored request of the root track."""
        raise NotImplementedError

    def samples_per_prompt(self, mode: str) -> int:
        """Samples of each prompt in a ``mode`` rollout: the recipe's sampling block's in
        training, ``eval.samples_per_prompt`` in eval."""
        if mode == "train":
            return int(self.sampling.samples_per_prompt)
        return int(self.cfg.eval.samples_per_prompt)

    def request_for(
        self,
        prompts: list[Any],
        rollout_index: int,
        mode: str,
        stages: Callable[[torch.Tensor], dict[str, Any]],
        images: torch.Tensor | None = None,
    ) -> RolloutReq:
        """:func:`~unirl.trainer.request.prompt_request` with this trainer's recipe, samples
        per prompt of ``mode`` and sampling block."""
        spp = self.samples_per_prompt(mode)
        return prompt_request(
            self.cfg,
            prompts,
            spp,
            rollout_index,
            mode,
            stages=stages,
            sampling_params=self.sampling,
            images=images,
        )

    def latent_request(
        self, sampling: Any, noise_ids: torch.Tensor, rollout_index: int, mode: str, **kw: Any
    ) -> Any:
        """A diffusion stage's block (:func:`~unirl.trainer.request.diffusion_request`) from
        the σ schedules, SDE-step schedule and latent shape this trainer read from its family
        (``self.schedules``, ``self.sde_steps``, ``self.latent_shape``) and the recipe's seed;
        ``kw``: ``trains_sde``, ``sample_ids`` (a fan-out), ``own_params``."""
        return diffusion_request(
            sampling,
            self.sde_steps,
            self.schedules,
            self.latent_shape,
            noise_ids=noise_ids,
            seed=self.cfg.seed,
            rollout_index=rollout_index,
            train=mode == "train",
            **kw,
        )

    def gallery(self, path: Path, track: RolloutTrack, limit: int) -> Path:
        """Draw a track's media with their rewards and prompts: images as a PNG contact sheet,
        edits as ``source | result`` tiles, videos as an animated GIF (``path``'s suffix
        becomes ``.gif``)."""
        rewards = track.rewards.tolist() if track.rewards is not None else [math.nan] * len(track)
        prompts = track.prompts or [""] * len(track)
        captions = [f"{r:.3f} | {p}" for r, p in zip(rewards[:limit], prompts[:limit])]
        if isinstance(track.decoded, Videos):
            video = track.decoded
            return video_sheet(
                video.frames[:limit], captions, path.with_suffix(".gif"), fps=video.fps
            )
        pixels = pixels_of(track)[:limit]
        if isinstance(track.references, Images):
            return edit_sheet(track.references.pixels[:limit], pixels, captions, path)
        return contact_sheet(pixels, captions, path)

    # -- stages --------------------------------------------------------------------------------

    @property
    def trained(self) -> list[Stage]:
        return [s for s in self.stages if s.trains]

    @property
    def scored(self) -> list[Stage]:
        return [s for s in self.stages if s.reward is not None]

    def _ops_path(self, path: Path, stage: Stage) -> Path:
        """A checkpoint or export folder of one training stage (its own sub-folder when
        several stages train)."""
        return path if len(self.trained) == 1 else path / stage.track

    @contextlib.contextmanager
    def _sampling(self, mode: str) -> Iterator[None]:
        """Each training stage's sampling weights around a rollout: the trainer switches in
        the adapter its algorithm declares (NFT samples train rollouts with its old adapter);
        eval may also swap EMA weights in (see :meth:`evaluate`)."""
        switching: dict[int, Any] = {}  # one call per ops role (stages may share one)
        for stage in self.trained:
            if stage.sampling_switches is None or mode in stage.sampling_switches:
                switching.setdefault(id(stage.ops), stage.ops)
        for ops in switching.values():
            ops.begin_sampling(mode)
        with after_failure_skip_stalled(lambda: [ops.end_sampling() for ops in switching.values()]):
            yield

    # -- the run -------------------------------------------------------------------------------

    def run(self, after_loop: Callable[[Any, Any], None] | None = None) -> int:
        """The whole run; ``after_loop(trainer, ops)`` (the benchmark) runs before shutdown.
        The console goes to ``train.log`` as well, with the traceback of a failure
        (``ConsoleLog``); a resumed run appends to it."""
        resuming = self.cfg.resume not in (None, "", "none", "null")
        self.run_info: RunInfo | None = None  # run.json, once the run passed its checks
        secrets = secret_values(self.data)  # masked on the console and in train.log
        with ConsoleLog(self.out.root / TRAIN_LOG, append=resuming, secrets=secrets):
            try:
                code = self._run(after_loop)
            except BaseException:
                self._end_run_info("failed")
                raise
            self._end_run_info("finished" if code == 0 else "stopped")
            return code

    def _end_run_info(self, status: str) -> None:
        """``run.json`` gets the run's end, and the report shows it (never raises)."""
        if self.run_info is None:
            return
        try:
            self.run_info.end(status)
        except OSError as exc:  # a full disk must not hide how the run ended
            print(f"[unirl] warning: could not write {self.run_info.path}: {exc}", flush=True)
        refresh_run_views(self.out.root)

    def _run(self, after_loop: Callable[[Any, Any], None] | None) -> int:
        cfg = self.cfg
        resume_from = resolve_resume(cfg, self.out)  # verified here, before any Ray work
        state = self._driver_state(resume_from) if resume_from is not None else None
        if resume_from is not None and state is not None:  # before any model is built
            refusal = incompatible_resume(self.data, resume_from, state.get("config"))
            if refusal is not None:
                raise ConfigError(refusal)
        if state is not None:  # the prompt position too: a mismatch is refused here
            self.data_source.load_state_dict(state["data"])
        if cfg.overwrite and resume_from is None:
            removed = self.out.clear_run()
            if removed:
                print(
                    f"[unirl] overwrite=true: removed {', '.join(removed)} from {self.out.root}",
                    flush=True,
                )
        if resume_from is not None and state is not None:
            drift = self.out.keep_config_before_resume(self.data, resume_from, state.get("config"))
            if drift is not None:
                print(drift, flush=True)
        if resume_from is None:
            self.out.write_config(self.data)
        # a resume writes config.yaml once its checkpoint has loaded: a refused one (weights
        # that do not fit) leaves the recipe that wrote the checkpoint in place
        self.run_info = RunInfo(self.out.root, resumed=resume_from is not None)
        if self.eval_held_out:
            print(
                f"[unirl] eval: the last {len(self.eval_held_out)} prompts of "
                f"{self.data_source.path} are held out of training (eval.prompts_path is null)",
                flush=True,
            )
        self.trackers = trackers = make_trackers(cfg, self.out, self.data)
        self.eval_tracker = LocalTracker(self.out.root, prefix="eval_metrics")
        pool = DevicePool(DevicePoolConfig.of(cfg))  # the recipe's pool knobs, taken whole
        bar: RolloutProgress | None = None
        # SIGINT / SIGTERM: finish the rollout under way, checkpoint, stop (a second: at once)
        stop = StopRequest()
        stopped: tuple[str, int, Path | None] | None = None  # signal, rollouts done, checkpoint
        try:
            with stop:
                self.place(pool)
                print_plan(pool.plan_rows())
                self.stages = order_stages(self.stages)
                if resume_from is not None and state is not None:
                    self.resume(resume_from, state)
                if resume_from is not None:
                    self.out.write_config(self.data)
                self.trim_history(trackers.local, resume_from)
                # a bar in a terminal (messages written through it), else one line per rollout
                bar = RolloutProgress(
                    cfg.num_rollouts,
                    initial=self.start_rollout,
                    mode=cfg.logging.progress,
                    reward_key=self.scored[-1].key("reward/mean"),
                )
                if cfg.eval_interval and cfg.eval.at_start and self.start_rollout == 0:
                    self.evaluate(0)  # the baseline every later eval is read against
                for rollout_index in range(self.start_rollout, cfg.num_rollouts):
                    if stop.requested:  # before this run's first rollout: nothing to save
                        stopped = (stop.requested, rollout_index, None)
                        break
                    metrics = self.one_rollout(rollout_index)
                    trackers.log(rollout_index, metrics)
                    done = rollout_index + 1
                    bar.rollout_done(done, metrics)
                    if cfg.eval_interval and (
                        done % cfg.eval_interval == 0 or done == cfg.num_rollouts
                    ):
                        self.evaluate(done)
                    saved = None
                    if cfg.save_interval and (
                        done % cfg.save_interval == 0 or done == cfg.num_rollouts
                    ):
                        saved = self.save(done)
                    if stop.requested and done < cfg.num_rollouts:
                        stopped = (stop.requested, done, saved or self.save(done))
                        break
                bar.close()
                refresh_run_views(self.out.root)  # curves/ and report.html with the last rollout
                if stopped is None:
                    if after_loop is not None:
                        after_loop(self, self.trained[0].ops)
                    self.export()
                for stage in self.stages:  # leave sync groups cleanly (a failed run shuts down)
                    if stage.sync is not None:
                        stage.sync.close()
        finally:
            if bar is not None:
                bar.close()
            trackers.close()
            pool.shutdown()
        if stopped is not None:
            print(stop_line(*stopped, cfg.num_rollouts, self.out.root), file=sys.stderr, flush=True)
            return stop.exit_code
        print(
            f"[unirl] finished {cfg.num_rollouts} rollouts; outputs in {self.out.root}", flush=True
        )
        return 0

    def one_rollout(self, rollout_index: int) -> dict[str, float]:
        """One turn of the loop; returns the rollout's metrics row."""
        cfg = self.cfg
        if not getattr(self, "_warned_sampling", False):  # the run's first rollout
            self._warned_sampling = True
            for line in degenerate_sampling_warnings(cfg):
                print(line, flush=True)
        t_start = time.perf_counter()
        prompts = self.data_source.next_batch()
        req = self.build_request(prompts, rollout_index)

        t0 = time.perf_counter()
        with self._sampling("train"):
            resp = self.rollout.generate(req)
        t_rollout = time.perf_counter() - t0
        tracks = dict(resp.tracks)
        metrics: dict[str, float] = {}

        t0 = time.perf_counter()
        metrics.update(self.score_tracks(tracks))
        t_reward = time.perf_counter() - t0
        if cfg.dynamic_sampling.enabled:  # DAPO: only groups whose rewards differ, refilled
            tracks, refill = self.refill_informative(tracks, rollout_index)
            metrics.update(refill)

        # advantages per trained track, galleries of scored ones, then train and sync per stage
        t0 = time.perf_counter()
        for stage in self.stages:
            if not stage.trains:
                continue
            track, adv_metrics = advantages_for(tracks[stage.track], cfg.advantage)
            tracks[stage.track] = track
            metrics.update({stage.key(k): v for k, v in adv_metrics.items()})
        for stage in self.scored:
            if cfg.logging.gallery_interval and rollout_index % cfg.logging.gallery_interval == 0:
                self.train_gallery(rollout_index, tracks[stage.track], stage)
        t_train_start = time.perf_counter()
        for group in self.train_groups():
            metrics.update(self.train_stages(group, tracks, rollout_index))
        t_train = time.perf_counter() - t_train_start
        for stage in self.stages:
            if stage.sync is not None:  # sync/* metrics; the next sync is due per its interval
                metrics.update(
                    {stage.key(k): v for k, v in stage.sync.after_train(rollout_index).items()}
                )
        del t0

        total = time.perf_counter() - t_start
        main = tracks[self.scored[-1].track]
        metrics.update(
            {
                **{f"time/{k}": v for k, v in resp.timings.items()},
                "time/rollout_call": t_rollout,
                "time/reward": t_reward,
                "time/train": t_train,
                "time/total": total,
                "throughput/samples_per_s": len(main) / total,
                "data/epoch": float(self.data_source.epoch),
                "data/prompts_crc32": float(zlib.crc32("\n".join(main.prompts or []).encode())),
                "data/first_sample_id": float(req.sample_ids[0]),
            }
        )
        return metrics

    def score_tracks(self, tracks: dict[str, RolloutTrack]) -> dict[str, float]:
        """Reward on the scored tracks, then up the lineage (children come first); ``tracks``
        is updated in place; returns the reward metrics."""
        metrics: dict[str, float] = {}
        for stage in self.stages:
            track = tracks[stage.track]
            if stage.reward is not None:
                if track.rewards is not None and track.component_rewards is not None:
                    scored = track  # scored while it was sampled (rollout.reward_overlap)
                else:
                    scored = stage.reward.score(light_track(track))
                metrics.update({stage.key(k): v for k, v in reward_metrics(scored).items()})
                track = dataclasses.replace(
                    track,
                    rewards=scored.rewards,
                    component_rewards=scored.component_rewards,
                    status=scored.status,
                )
            tracks[stage.track] = track
            if stage.parent is not None:
                parent = propagate_rewards(track, tracks[stage.parent], stage.reward_from_children)
                tracks[stage.parent] = parent
        return metrics

    def refill_informative(
        self, tracks: dict[str, RolloutTrack], rollout_index: int
    ) -> tuple[dict[str, RolloutTrack], dict[str, float]]:
        """Dynamic sampling (``unirl.trainer.dynamic_sampling``): the one trained stage's
        track cut to its groups whose rewards differ, refilled with freshly sampled and scored
        prompts until ``batch_size`` groups; extra round r samples as rollout index
        ``num_rollouts · r + rollout_index`` (sample and group ids no rollout uses)."""
        require(
            len(self.stages) == 1,
            "dynamic_sampling.enabled needs a recipe with one stage; set it to false",
        )
        stage = self.stages[0]

        def sample_more(round_index: int) -> RolloutTrack:
            index = self.cfg.num_rollouts * round_index + rollout_index
            req = self.build_request(self.data_source.next_batch(), index)
            with self._sampling("train"):
                more = dict(self.rollout.generate(req).tracks)
            self.score_tracks(more)
            return more[stage.track]

        track, metrics = fill_informative(
            tracks[stage.track],
            sample_more,
            groups_wanted=self.cfg.batch_size,
            max_rounds=self.cfg.dynamic_sampling.max_rounds,
        )
        return {**tracks, stage.track: track}, metrics

    def train_groups(self) -> list[list[Stage]]:
        """The trained stages grouped by the stack that trains them, in stage order: stages
        that share one stack (a unified model's text and image) train in one call."""
        groups: dict[int, list[Stage]] = {}
        for stage in self.trained:
            groups.setdefault(id(stage.stack), []).append(stage)
        return list(groups.values())

    def train_stages(
        self, stages: list[Stage], tracks: dict[str, RolloutTrack], rollout_index: int
    ) -> dict[str, float]:
        """One training call of a stack on its stages' tracks (advantages attached; no media
        on the wire): ``train_track(track, k)`` for one stage, ``train_tracks(k, **tracks)``
        (one joint optimizer step) for several. Checks that every data-parallel rank holds the
        same weights afterwards; ``train/*`` under the stage's prefix (a joint step's once,
        unprefixed), then each stage's ``after_train`` and :meth:`track_metrics`."""
        stack = stages[0].stack
        light = {s.track: dataclasses.replace(tracks[s.track], decoded=None) for s in stages}
        if len(stages) == 1:
            per_rank = stack.train_track(light[stages[0].track], rollout_index)
        else:
            per_rank = stack.train_tracks(rollout_index=rollout_index, **light)
        steps = [
            mean_over_ranks([rank["steps"][u] for rank in per_rank])
            for u in range(len(per_rank[0]["steps"]))
        ]
        checksums = [rank["param_checksum"] for rank in per_rank]
        names = " + ".join(repr(s.track) for s in stages)
        if any(c != checksums[0] for c in checksums):
            raise RuntimeError(
                f"rollout {rollout_index}, stage {names}: train ranks hold different "
                f"weights after the update (parameter checksums {checksums}); data-parallel "
                "gradient sync is broken"
            )
        prefix = stages[0].prefix if len(stages) == 1 else ""
        key = (lambda k: f"{prefix}/{k}") if prefix else (lambda k: k)
        out = {key(f"train/{k}"): v for k, v in mean_over_ranks(steps).items()}
        for stage in stages:  # each loss node's own end-of-rollout metrics (KL control, …)
            after = mean_over_ranks(self._after_train(stage, stages, per_rank, rollout_index))
            out.update({stage.key(k): v for k, v in after.items()})
        out[key("train/param_checksum")] = checksums[0]
        if any(s.get("nonfinite/skipped_step") for s in steps):
            print(
                f"[unirl] rollout {rollout_index}, stage {names}: skipped a non-finite "
                "optimizer step",
                flush=True,
            )
        for stage in stages:
            extra = self.track_metrics(stage, tracks[stage.track])
            out.update({stage.key(k): v for k, v in extra.items()})
        return out

    @staticmethod
    def _after_train(
        stage: Stage, stages: list[Stage], per_rank: list[Any], rollout_index: int
    ) -> list[dict[str, float]]:
        """Each rank's ``after_train`` metrics of ``stage``'s algorithm: from the train reply
        (the stack runs it; ``after_train`` for one stage, ``after_train_by_track`` for a
        joint step), else (a stack that does not report it) by calling the algorithm."""
        if len(stages) == 1 and all("after_train" in r for r in per_rank):
            return [r["after_train"] for r in per_rank]
        if all(stage.track in r.get("after_train_by_track", {}) for r in per_rank):
            return [r["after_train_by_track"][stage.track] for r in per_rank]
        return list(stage.algorithm.after_train(rollout_index))

    def track_metrics(self, stage: Stage, track: RolloutTrack) -> dict[str, float]:
        """A domain's own metrics of a trained track (response lengths, rewrite counters),
        unprefixed; :meth:`train_stages` files them under the stage's prefix."""
        return {}

    def train_gallery(self, rollout_index: int, track: RolloutTrack, stage: Stage) -> None:
        """The contact sheet of a training rollout. Media parked on the rollout workers are
        fetched before training (the update frees them): the first rows of every rollout
        rank's shard, as many as the sheet draws, so each rank is asked only for what it holds."""
        limit = self.cfg.logging.gallery_max_images
        if track.decoded is None:
            ranks = stage.rollout_ranks
            per_rank = len(track) // ranks
            take = min(per_rank, -(-limit // ranks))
            rows = torch.cat(
                [torch.arange(r * per_rank, r * per_rank + take) for r in range(ranks)]
            )
            track = track.select(rows)
            track = dataclasses.replace(
                track, decoded=self.rollout.fetch_decoded(light_track(track)).decoded
            )
        prefix = f"{stage.prefix}_" if stage.prefix else ""
        sheet = self.gallery(
            self.out.root / "samples" / f"{prefix}rollout_{rollout_index:06d}.png", track, limit
        )
        trackers = getattr(self, "trackers", None)
        if trackers is not None:  # TensorBoard / W&B get the training samples too
            trackers.log_external(rollout_index, {}, media={f"samples/{prefix}samples": sheet})

    # -- eval, checkpoints, export -----------------------------------------------------------------

    def eval_prompts(self) -> list[Any]:
        """The first ``eval.num_prompts`` prompts of ``eval.prompts_path`` (or the prompts held
        out of the training file), cut to a multiple of what the rollout ranks can split
        evenly."""
        from unirl.data import read_prompt_file

        if self.cfg.eval.prompts_path:
            prompts = read_prompt_file(self.cfg.eval.prompts_path)[: self.cfg.eval.num_prompts]
        else:
            prompts = self.eval_held_out
        ranks = self.stages[-1].rollout_ranks  # the root stage's engine samples the request
        spp = self.cfg.eval.samples_per_prompt
        keep = (len(prompts) * spp // ranks) * ranks // spp
        return prompts[: max(keep, 0)]

    def evaluate(self, done: int) -> None:
        """Fixed prompts, ODE sampling, EMA weights when present; ``eval/*`` metrics and a
        contact sheet per scored track."""
        prompts = self.eval_prompts()
        if not prompts:
            return
        used_ema = [bool(s.ops.use_eval_weights(self.cfg.eval.use_ema)[0]) for s in self.trained]
        with after_failure_skip_stalled(
            lambda: [s.ops.use_eval_weights(False) for s in self.trained]
        ):
            req = self.build_request(prompts, done, mode="eval")
            with self._sampling("eval"):
                resp = self.rollout.generate(req)
        metrics: dict[str, float] = {}
        sheets: dict[str, Path] = {}
        for stage in self.scored:
            scored = stage.reward.score(light_track(resp.tracks[stage.track]))
            metrics.update({f"eval/{stage.key(k)}": v for k, v in reward_metrics(scored).items()})
            track = dataclasses.replace(resp.tracks[stage.track], rewards=scored.rewards)
            prefix = f"{stage.prefix}_" if stage.prefix else ""
            sheet = self.out.root / "eval" / f"{prefix}step_{done:06d}.png"
            sheets[f"eval/{prefix}samples"] = self.gallery(sheet, track, 64)
        metrics["eval/used_ema"] = float(any(used_ema))
        if self.eval_tracker is None:  # evaluate driven without run() (tests, tools)
            self.eval_tracker = LocalTracker(self.out.root, prefix="eval_metrics")
        self.eval_tracker.log(done, metrics)
        trackers = getattr(self, "trackers", None)
        if trackers is not None:  # TensorBoard / W&B see eval next to training
            trackers.log_external(done, metrics, media=sheets)
        main = self.scored[-1].key("reward/mean")
        print(
            f"[unirl] eval after {done} rollouts: reward {metrics[f'eval/{main}']:.4f}", flush=True
        )
        refresh_run_views(self.out.root)  # curves/ and report.html (a failure: one warning)

    def save(self, done: int) -> Path:
        """Each training stage's backend writes its files (atomically, with a manifest);
        ``driver_state.json`` goes in last and marks the folder complete. A failed write
        removes the folder. Then ``keep_last`` prunes older checkpoints."""
        path = self.out.checkpoint(done)
        for stage in self.trained:
            stage.ops.save_checkpoint(str(self._ops_path(path, stage)), {"rollout_index": done})
        self.export(path / "export")  # what eval showed, loadable by diffusers at every step
        fault_point("kill_during_checkpoint", done)  # test hook: UNIRL_FAULT
        state = {
            "next_rollout": done,
            "data": self.data_source.state_dict(),
            "stages": {
                s.track: {"stack": s.stack.state(), "algorithm": s.algorithm.algorithm_state()}
                for s in self.trained
            },
            "seed": self.cfg.seed,
            "config": redact_secrets(self.data),  # what a resume compares its recipe with
        }
        try:
            write_json_atomic(path / DRIVER_STATE, state)  # written last: marks completion
        except Exception as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise write_failure(path, path / DRIVER_STATE, exc) from exc
        print(f"[unirl] checkpoint {path}", flush=True)
        removed = self.out.prune_checkpoints(self.cfg.keep_last, current=path)
        if removed:
            names = ", ".join(p.name for p in removed)
            print(f"[unirl] keep_last={self.cfg.keep_last}: removed {names}", flush=True)
        return path

    @staticmethod
    def _driver_state(path: Path) -> dict[str, Any]:
        state = json.loads((path / DRIVER_STATE).read_text())
        assert isinstance(state, dict)
        return state

    def resume(self, path: Path, state: dict[str, Any]) -> None:
        """The stages' weights, optimizer and algorithm state from ``path`` (``state``: its
        ``driver_state.json``); the data position was loaded before placement (``_run``)."""
        stages = state.get("stages", {})
        missing = [s.track for s in self.trained if s.track not in stages]
        if missing:
            raise CheckpointError(
                f"{path / DRIVER_STATE} holds no state for stage(s) {missing} (it has "
                f"{sorted(stages)}); resume a checkpoint of this recipe"
            )
        for stage in self.trained:
            stage.ops.load_checkpoint(str(self._ops_path(path, stage)))
            stage.stack.load_state(stages[stage.track]["stack"])
            stage.algorithm.load_algorithm_state(stages[stage.track].get("algorithm", {}))
        self.start_rollout = int(state["next_rollout"])

    def trim_history(self, local: LocalTracker | None, resume_from: Path | None) -> None:
        """Keep the history the run continues from: train rows of rollouts before
        ``start_rollout``, eval rows up to it (the eval at a checkpoint's step is logged before
        the checkpoint). A start from 0 drops everything an earlier run left in output_dir."""
        start = self.start_rollout
        dropped = local.truncate_after(start - 1) if local is not None else 0
        assert self.eval_tracker is not None
        # a start from 0 evaluates the baseline again: no earlier eval row survives
        dropped_eval = self.eval_tracker.truncate_after(start if start > 0 else -1)
        rows = f"metrics.jsonl rows: {dropped}, eval_metrics.jsonl rows: {dropped_eval}"
        if resume_from is not None:
            print(
                f"[unirl] resumed from {resume_from} at rollout {start}; dropped what was "
                f"logged after it ({rows})",
                flush=True,
            )
        elif dropped or dropped_eval:
            why = f"resume={self.cfg.resume} found no complete checkpoint in {self.out.checkpoints}"
            print(
                f"[unirl] {why}: starting from rollout 0; dropped what an earlier run logged "
                f"({rows})",
                flush=True,
            )

    def export(self, root: Path | None = None) -> None:
        """The trained LoRA of each stage in the diffusers / PEFT format: ``lora/`` and, when
        the backend keeps an EMA (the weights eval samples with), ``lora_ema/`` beside it; a
        full fine-tune of a transformers model as a ``save_pretrained`` folder ``model/`` (and
        ``model_ema/``). ``root``: the run folder (the end of the run) or a checkpoint's
        ``export/``."""
        root = self.out.root if root is None else root
        for stage in self.trained:
            if stage.exports_lora:
                stage.ops.export_lora(str(self._ops_path(root / "lora", stage)))
                stage.ops.export_lora(str(self._ops_path(root / "lora_ema", stage)), True)
            # one model folder when one stage exports a model (a unified model's two stages
            # train the same module: it is written once, from the image stage)
            models = [s for s in self.trained if s.exports_model]
            if stage.exports_model:
                for name, ema in (("model", False), ("model_ema", True)):
                    folder = root / name if len(models) == 1 else root / name / stage.track
                    if stage.ops.export_model(str(folder), ema)[0]:
                        write_model_card(folder, self.out.root, prefix=self._prefix_of(stage))
            if stage.exports_lora:
                for name in ("lora", "lora_ema"):
                    folder = self._ops_path(root / name, stage)
                    if folder.is_dir():
                        write_model_card(folder, self.out.root, prefix=self._prefix_of(stage))

    @staticmethod
    def _prefix_of(stage: Stage) -> str:
        return f"{stage.prefix}/" if stage.prefix else ""


class ComposedTrainer(StageTrainer):
    """A composed recipe's trainer (``pe``, ``unified``): the recipe's own blocks are the root
    text stage (``sampling``: its ``ARSamplingParams``); ``composed`` is the typed composed
    block and ``child_sampling`` its child stage's sampling block (``pe.diffusion.sampling``,
    ``unified.image.sampling``), built here; :meth:`after_init` derives the rest."""

    sampling: ARSamplingParams

    def __init__(
        self,
        cfg: RunConfig,
        data: dict[str, Any],
        composed: ComposedStageConfig,
        *,
        dry: bool = False,
    ) -> None:
        from hydra.utils import instantiate

        super().__init__(cfg, data, dry=dry)
        self.composed = composed
        self.child_sampling: Any = instantiate(composed.child().sampling, _convert_="object")
        self.after_init()

    def after_init(self) -> None:
        """What a composed trainer reads off its block once it is built (SDE-step schedule,
        what its child stage trains)."""
