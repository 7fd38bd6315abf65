"""The diffusion trainer: one placement block, one visible loop.

    rollout (sample + record) -> reward -> advantages -> train -> [sync]

Every component is a sibling ``Remote`` on the same workers (colocate layout), built from its
recipe block by ``_target_``. The driver owns the data position, the σ schedule, the x_T and
SDE-step recipes, advantages, logging, eval and checkpoint cadence.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate

from unirl.algorithms.advantages import advantages_for
from unirl.config.run import RunConfig
from unirl.config.validate import engine_kind, locate
from unirl.distributed.group import DevicePool, placement, remote
from unirl.logging import LocalTracker, contact_sheet
from unirl.logging.progress import progress_bar
from unirl.sde import sigmas_from_scheduler_config
from unirl.sde.sde_steps import AllSteps
from unirl.train.checkpoint import fault_point, write_failure
from unirl.trainer.base import (
    DRIVER_STATE,
    OutputDir,
    make_trackers,
    mean_over_ranks,
    resolve_resume,
    write_json_atomic,
)
from unirl.trainer.dedicated import build_dedicated_layout, plan_dedicated_roles, unpack_roles
from unirl.trainer.roles import RewardWorker, TrainOps, light_track, pixels_of
from unirl.types import (
    STATUS_OK,
    DiffusionSamplingParams,
    RolloutReq,
    RolloutTrack,
    Texts,
)

TRACK = "diffusion"


def plan_roles(cfg: RunConfig) -> list[tuple[str, str, str]]:
    """``(role, _target_, slab)`` in creation order — printed by ``dry_run``."""
    if engine_kind(cfg) != "trainside":
        return plan_dedicated_roles(cfg)
    blocks = [
        ("bundle", cfg.bundle),
        ("pipeline", cfg.pipeline),
        ("backend", cfg.backend),
        ("rollout", cfg.rollout),
        ("reward", cfg.reward),
        ("algorithm", cfg.algorithm),
        ("stack", cfg.stack),
    ]
    if cfg.sync is not None:
        blocks.append(("sync", cfg.sync))
    return [
        (name, str((block or {}).get("_target_", "?")), "all workers (colocate)")
        for name, block in blocks
    ]


class DiffusionTrainer:
    """Runs a diffusion recipe end to end; ``run()`` returns the process exit code."""

    def __init__(self, cfg: RunConfig, data: dict[str, Any]) -> None:
        self.cfg = cfg
        self.data = data
        self.out = OutputDir(cfg.output_dir)
        self.sampling: DiffusionSamplingParams = instantiate(cfg.sampling, _convert_="object")
        self.sde_steps = self.sampling.sde_steps or AllSteps()
        self.data_source = instantiate(cfg.data_source, _convert_="object")
        self.data_source.set_prompts_per_rollout(cfg.batch_size)
        self.start_rollout = 0
        self.eval_tracker: LocalTracker | None = None  # opened by run(), after resume discovery
        # ratio losses train recorded SDE steps; likelihood-free ones (NFT) sample with the ODE
        algorithm_cls = locate(str(cfg.algorithm["_target_"]), "algorithm")
        self.trains_sde_steps = bool(getattr(algorithm_cls, "requires_log_prob", True))

    # -- request building ------------------------------------------------------------------

    def build_request(
        self, prompts: list[Any], rollout_index: int, *, mode: str = "train"
    ) -> RolloutReq:
        """The driver-authored request: ids, groups, σ schedule, SDE steps and the x_T recipe."""
        spp = (
            self.sampling.samples_per_prompt
            if mode == "train"
            else self.cfg.eval.samples_per_prompt
        )
        b = len(prompts)
        n = b * spp
        base = rollout_index * n if mode == "train" else 10**12 + rollout_index * n
        texts = [ex.prompt for ex in prompts for _ in range(spp)]
        metadata = [dict(ex.metadata) for ex in prompts for _ in range(spp)]
        steps = (
            self.sampling.num_inference_steps
            if mode == "train"
            else self.sampling.eval_num_inference_steps
        )
        sigmas = self.sigmas(steps)
        if mode == "train" and self.trains_sde_steps:
            chosen = self.sde_steps.select(steps, seed=self.cfg.seed, rollout_index=rollout_index)
            sde_indices = torch.tensor([list(chosen)] * n, dtype=torch.long)
        else:
            sde_indices = torch.zeros((n, 0), dtype=torch.long)
        group_base = rollout_index * b
        return RolloutReq(
            sample_ids=torch.arange(base, base + n, dtype=torch.long),
            group_ids=torch.arange(group_base, group_base + b, dtype=torch.long).repeat_interleave(
                spp
            ),
            primitives={"text": Texts(texts=texts)},
            metadata=metadata,
            sde_indices=sde_indices,
            sampling_params=self.sampling,
            sigmas=sigmas,
            init_noise_shape=tuple(self.latent_shape),
            seed=self.cfg.seed if mode == "train" else self.cfg.eval.seed,
            rollout_index=rollout_index,
            mode=mode,  # type: ignore[arg-type]
        )

    def sigmas(self, steps: int) -> torch.Tensor:
        return sigmas_from_scheduler_config(
            self.scheduler_config, steps, image_seq_len=self.image_seq_len
        )

    # -- the loop ------------------------------------------------------------------------------

    def run(self, after_loop: Any = None) -> int:
        """The whole run; ``after_loop(trainer, ops)`` (the benchmark) runs before shutdown."""
        cfg = self.cfg
        self.out.write_config(self.data)
        resume_from = resolve_resume(cfg, self.out)  # verified here, before any Ray work
        trackers = make_trackers(cfg, self.out, self.data)
        self.eval_tracker = LocalTracker(self.out.root, prefix="eval_metrics")
        pool = DevicePool(
            cfg.num_devices,
            devices_per_node=cfg.devices_per_node,
            device=cfg.device,
            cpus_per_worker=cfg.cpus_per_worker,
            call_timeout_s=cfg.call_timeout_s,
            heartbeat_timeout_s=cfg.heartbeat_timeout_s,
            stall_factor=cfg.stall_factor,
            stall_floor_s=cfg.stall_floor_s,
            log_to_driver=True,
        )
        dedicated = None
        try:
            if engine_kind(cfg) == "trainside":
                if cfg.num_devices > 1:
                    pool.init_process_group(list(range(cfg.num_devices)), group_name="world")
                with placement(pool, fraction=1.0):
                    bundle = remote(cfg.bundle, name="bundle")
                    pipeline = remote(cfg.pipeline, name="pipeline", bundle=bundle)
                    backend = remote(cfg.backend, name="backend", bundle=bundle)
                    rollout = remote(cfg.rollout, name="rollout", pipeline=pipeline)
                    reward = remote(RewardWorker, name="reward", service=cfg.reward)
                    algorithm = remote(cfg.algorithm, name="algorithm", pipeline=pipeline)
                    stack = remote(cfg.stack, name="stack", backend=backend, algorithm=algorithm)
                    self.algorithm = algorithm
                    ops = remote(
                        TrainOps, name="ops", backend=backend, pipeline=pipeline, stack=stack
                    )
            else:  # [dedicated engines] colocate / separate layout + weight sync: trainer/dedicated.py
                dedicated = build_dedicated_layout(cfg, pool)
                roles = unpack_roles(dedicated)
                bundle, pipeline, backend, rollout, reward, algorithm, stack, ops = roles
                self.algorithm = algorithm
                print(f"[unirl] {dedicated.describe()}", flush=True)
            info = ops.describe(self.sampling.height, self.sampling.width)
            self.scheduler_config = info["scheduler_config"]
            self.latent_shape = info["latent_shape"]
            self.image_seq_len = info["image_seq_len"]
            self.device_name = info["device_name"]
            print(
                f"[unirl] trainable parameters: {info['trainable_params']:,} on {info['device']}",
                flush=True,
            )

            if resume_from is not None:
                self._resume(resume_from, ops, stack)
            self._trim_history(trackers.local, resume_from)
            bar = progress_bar(
                cfg.num_rollouts,
                initial=self.start_rollout,
                mode=cfg.logging.progress,
                desc="rollouts",
            )
            for rollout_index in range(self.start_rollout, cfg.num_rollouts):
                metrics = self._one_rollout(rollout_index, rollout, reward, stack)
                # [dedicated engines] sync/* metrics; the next sync is due per sync_interval
                if dedicated is not None:
                    metrics.update(dedicated.after_train(rollout_index))
                trackers.log(rollout_index, metrics)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.4f}")
                done = rollout_index + 1
                if cfg.eval_interval and (
                    done % cfg.eval_interval == 0 or done == cfg.num_rollouts
                ):
                    self._evaluate(done, rollout, reward, ops)
                if cfg.save_interval and (
                    done % cfg.save_interval == 0 or done == cfg.num_rollouts
                ):
                    self._save(done, ops, stack)
            bar.close()
            if after_loop is not None:
                after_loop(self, ops)
            if (cfg.backend or {}).get("lora") is not None:
                ops.export_lora(str(self.out.root / "lora"))
        finally:
            trackers.close()
            pool.shutdown()
        print(
            f"[unirl] finished {cfg.num_rollouts} rollouts; outputs in {self.out.root}", flush=True
        )
        return 0

    def _one_rollout(
        self, rollout_index: int, rollout: Any, reward: Any, stack: Any
    ) -> dict[str, float]:
        cfg = self.cfg
        t_start = time.perf_counter()
        prompts = self.data_source.next_batch()
        req = self.build_request(prompts, rollout_index)

        t0 = time.perf_counter()
        self.algorithm.begin_rollout(rollout_index, "train")
        resp = rollout.generate(req)
        self.algorithm.end_rollout(rollout_index, "train")
        t_rollout = time.perf_counter() - t0
        track = resp.tracks[TRACK]

        t0 = time.perf_counter()
        scored = reward.score(light_track(track))
        t_reward = time.perf_counter() - t0
        reward_metrics = self._reward_metrics(scored)
        track = dataclasses.replace(
            track,
            rewards=scored.rewards,
            component_rewards=scored.component_rewards,
            status=scored.status,
        )
        track, adv_metrics = advantages_for(track, cfg.advantage)
        if cfg.logging.gallery_interval and rollout_index % cfg.logging.gallery_interval == 0:
            self._train_gallery(rollout_index, track, rollout)

        t0 = time.perf_counter()
        progress = rollout_index / max(cfg.num_rollouts, 1)
        # the trainer needs no pixels: keep them off the wire
        per_rank = stack.train_track(
            dataclasses.replace(track, decoded=None), rollout_index, progress
        )
        t_train = time.perf_counter() - t0
        steps = [
            mean_over_ranks([rank["steps"][u] for rank in per_rank])
            for u in range(len(per_rank[0]["steps"]))
        ]
        checksums = [rank["param_checksum"] for rank in per_rank]
        if any(c != checksums[0] for c in checksums):
            raise RuntimeError(
                f"rollout {rollout_index}: train ranks hold different weights after the update "
                f"(parameter checksums {checksums}); data-parallel gradient sync is broken"
            )
        train_metrics = {f"train/{k}": v for k, v in mean_over_ranks(steps).items()}
        train_metrics.update(mean_over_ranks(self.algorithm.after_train(rollout_index)))
        if any(s.get("nonfinite/skipped_step") for s in steps):
            print(
                f"[unirl] rollout {rollout_index}: skipped a non-finite optimizer step", flush=True
            )

        total = time.perf_counter() - t_start
        n = len(track)
        metrics = {
            **reward_metrics,
            **adv_metrics,
            **train_metrics,
            **{f"time/{k}": v for k, v in resp.timings.items()},
            "time/rollout_call": t_rollout,
            "time/reward": t_reward,
            "time/train": t_train,
            "time/total": total,
            "throughput/samples_per_s": n / total,
            "train/param_checksum": checksums[0],
            "data/epoch": float(self.data_source.epoch),
            "data/prompts_crc32": float(zlib.crc32("\n".join(track.prompts or []).encode())),
            "data/first_sample_id": float(req.sample_ids[0]),
        }
        return metrics

    def _reward_metrics(self, scored: RolloutTrack) -> dict[str, float]:
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
        shard_metrics = [
            m.pop("_reward_metrics") for m in scored.metadata if "_reward_metrics" in m
        ]
        for k, v in mean_over_ranks(shard_metrics).items():
            if k.startswith("guard/") or k.startswith("ocr/"):
                out[k] = v
            elif k in ("reward/dropped_groups", "reward/dropped_samples") or k.startswith(
                "reward/failures/"
            ):
                out[k] = v * len(shard_metrics)  # counts: sum over ranks
        return out

    def _train_gallery(self, rollout_index: int, track: RolloutTrack, rollout: Any) -> None:
        """The contact sheet of a training rollout. Media parked on the workers are fetched
        before training (the update frees them): the first rows of every rank's shard, as
        many as the sheet draws, so each rank is asked only for samples it holds."""
        limit = self.cfg.logging.gallery_max_images
        if track.decoded is None:
            ranks = self.cfg.num_devices
            per_rank = len(track) // ranks
            take = min(per_rank, -(-limit // ranks))
            rows = torch.cat(
                [torch.arange(r * per_rank, r * per_rank + take) for r in range(ranks)]
            )
            track = track.select(rows)
            track = dataclasses.replace(
                track, decoded=rollout.fetch_decoded(light_track(track)).decoded
            )
        path = self.out.root / "samples" / f"rollout_{rollout_index:06d}.png"
        self._gallery(path, track, limit)

    def _gallery(self, path: Path, track: RolloutTrack, limit: int) -> None:
        pixels = pixels_of(track)[:limit]
        rewards = track.rewards.tolist() if track.rewards is not None else [math.nan] * len(track)
        prompts = track.prompts or [""] * len(track)
        captions = [f"{r:.3f} | {p}" for r, p in zip(rewards[:limit], prompts[:limit])]
        contact_sheet(pixels, captions, path)

    # -- eval, checkpoints ---------------------------------------------------------------------

    def _eval_prompts(self) -> list[Any]:
        from unirl.data import read_prompt_file

        path = self.cfg.eval.prompts_path or self.data_source.path
        return read_prompt_file(path)[: self.cfg.eval.num_prompts]

    def _evaluate(self, done: int, rollout: Any, reward: Any, ops: Any) -> None:
        prompts = self._eval_prompts()
        n_ranks = self.cfg.num_devices
        spp = self.cfg.eval.samples_per_prompt
        keep = (len(prompts) * spp // n_ranks) * n_ranks // spp
        prompts = prompts[: max(keep, 0)]
        if not prompts:
            return
        used_ema = ops.use_eval_weights(self.cfg.eval.use_ema)[0]
        try:
            req = self.build_request(prompts, done, mode="eval")
            self.algorithm.begin_rollout(done, "eval")
            resp = rollout.generate(req)
            self.algorithm.end_rollout(done, "eval")
        finally:
            ops.use_eval_weights(False)
        scored = reward.score(light_track(resp.tracks[TRACK]))
        metrics = {f"eval/{k}": v for k, v in self._reward_metrics(scored).items()}
        metrics["eval/used_ema"] = float(bool(used_ema))
        if self.eval_tracker is None:  # _evaluate driven without run() (tests, tools)
            self.eval_tracker = LocalTracker(self.out.root, prefix="eval_metrics")
        self.eval_tracker.log(done, metrics)
        track = resp.tracks[TRACK]
        track = dataclasses.replace(track, rewards=scored.rewards)
        self._gallery(self.out.root / "eval" / f"step_{done:06d}.png", track, 64)
        print(
            f"[unirl] eval after {done} rollouts: reward {metrics['eval/reward/mean']:.4f}",
            flush=True,
        )

    def _save(self, done: int, ops: Any, stack: Any) -> None:
        """The backend writes its files (atomically, with a manifest); ``driver_state.json``
        goes in last and marks the folder complete. A failed write removes the folder."""
        path = self.out.checkpoint(done)
        extra = {"rollout_index": done}
        ops.save_checkpoint(str(path), extra)
        fault_point("kill_during_checkpoint", done)  # test hook: UNIRL_FAULT
        state = {
            "next_rollout": done,
            "data": self.data_source.state_dict(),
            "stack": stack.state(),
            "algorithm": self.algorithm.algorithm_state(),
            "seed": self.cfg.seed,
        }
        try:
            write_json_atomic(path / DRIVER_STATE, state)  # written last: marks completion
        except Exception as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise write_failure(path, path / DRIVER_STATE, exc) from exc
        print(f"[unirl] checkpoint {path}", flush=True)

    def _resume(self, path: Path, ops: Any, stack: Any) -> None:
        state = json.loads((path / DRIVER_STATE).read_text())
        ops.load_checkpoint(str(path))
        self.data_source.load_state_dict(state["data"])
        stack.load_state(state["stack"])
        self.algorithm.load_algorithm_state(state.get("algorithm", {}))
        self.start_rollout = int(state["next_rollout"])

    def _trim_history(self, local: LocalTracker | None, resume_from: Path | None) -> None:
        """Keep the history the run continues from: train rows of rollouts before
        ``start_rollout``, eval rows up to it (the eval at a checkpoint's step is logged before
        the checkpoint). A fresh start drops everything an earlier run left in output_dir."""
        start = self.start_rollout
        dropped = local.truncate_after(start - 1) if local is not None else 0
        assert self.eval_tracker is not None
        dropped_eval = self.eval_tracker.truncate_after(start)
        rows = f"metrics.jsonl rows: {dropped}, eval_metrics.jsonl rows: {dropped_eval}"
        if resume_from is not None:
            print(
                f"[unirl] resumed from {resume_from} at rollout {start}; dropped what was "
                f"logged after it ({rows})",
                flush=True,
            )
        elif dropped or dropped_eval:
            why = (
                f"resume=auto found no complete checkpoint in {self.out.checkpoints}"
                if self.cfg.resume == "auto"
                else "a fresh run (resume=null) into an output_dir with history"
            )
            print(
                f"[unirl] {why}: starting from rollout 0; dropped what an earlier run logged "
                f"({rows})",
                flush=True,
            )


def run_diffusion(cfg: RunConfig, data: dict[str, Any]) -> int:
    return DiffusionTrainer(cfg, data).run()
