"""Small driver-callable roles that adapt plain components (reward service, backend) to the
single-controller layer. They live on the same workers as their siblings."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from unirl.config.require import require
from unirl.config.run import RunConfig
from unirl.distributed.group import Handle, ParallelSizes, remote
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.group.pool import PoolBase
from unirl.types import Images, RolloutReq, RolloutTrack
from unirl.types.resident import unpark


class RewardWorker:
    """Scores this rank's shard of a track with a ``RewardService`` built from ``service``."""

    def __init__(self, *, service: Any) -> None:
        if isinstance(service, dict):
            from hydra.utils import instantiate

            service = instantiate(service, _convert_="object")
        self.service = service

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def score(self, track: RolloutTrack) -> RolloutTrack:
        """The shard with ``rewards``, ``component_rewards`` and ``status`` attached; guard and
        failure metrics ride along in ``metadata[0]['_reward_metrics']`` of the first sample.
        Media the trainside engine parked on this worker are read here, not shipped."""
        with torch.profiler.record_function("unirl/reward"):
            scored, metrics = self.service.score_track(unpark(track, ("decoded",)))
        meta = [dict(m) for m in scored.metadata]
        meta[0]["_reward_metrics"] = metrics
        return dataclasses.replace(scored, metadata=meta, decoded=None)  # the driver has them


def light_track(track: RolloutTrack) -> RolloutTrack:
    """The fields a reward needs (media, reference media, prompts, ids): no latents or
    embeddings on the wire."""
    return RolloutTrack(
        sample_ids=track.sample_ids,
        group_ids=track.group_ids,
        prompts=track.prompts,
        metadata=track.metadata,
        decoded=track.decoded,
        references=track.references,
        status=track.status,
        resident_key=track.resident_key,
    )


class TrainOps:
    """The trainer's hands on a worker: checkpoint, export, the sampling and eval weight
    switches, measurements; callable from the driver."""

    def __init__(
        self, *, backend: Any, pipeline: Any, stack: Any = None, algorithm: Any = None
    ) -> None:
        self.backend = backend
        self.pipeline = pipeline
        self.stack = stack
        self.algorithm = algorithm
        self._eval_ctx: contextlib.ExitStack | None = None
        self._sampling_ctx: contextlib.ExitStack | None = None
        self._profiler: Any = None

    @distributed(dispatch=Dispatch.BROADCAST)
    def begin_sampling(self, mode: str) -> str | None:
        """Switch in the adapter the algorithm samples ``mode`` rollouts with (NFT: its old
        adapter for train rollouts) and, with ``backend.fsdp.gather_for_sampling``, keep
        sharded blocks gathered until :meth:`end_sampling`; returns the adapter's name, or
        None when the adapter does not change. A rollout that raised never reached
        :meth:`end_sampling`: those switches are undone first."""
        self.end_sampling()
        name = self.algorithm.sampling_adapter(mode) if self.algorithm is not None else None
        self._sampling_ctx = ctx = contextlib.ExitStack()
        if name is not None:
            ctx.enter_context(self.backend.set_active_adapter(name))
        ctx.enter_context(self.backend.gathered_for_sampling())
        return name

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def sampling_switches(self) -> tuple[str, ...]:
        """The rollout modes (``train``, ``eval``) for which :meth:`begin_sampling` changes
        anything: the algorithm's sampling adapter, or blocks kept gathered
        (``backend.fsdp.gather_for_sampling`` on a sharded run). The driver skips both calls
        for the other modes (most recipes: every mode)."""
        gathers = bool(
            getattr(self.backend, "is_sharded", False)
            and getattr(getattr(self.backend, "fsdp_config", None), "gather_for_sampling", False)
        )
        adapter = getattr(self.algorithm, "sampling_adapter", None)
        return tuple(
            mode
            for mode in ("train", "eval")
            if gathers or (adapter is not None and adapter(mode) is not None)
        )

    @distributed(dispatch=Dispatch.BROADCAST)
    def end_sampling(self) -> None:
        if self._sampling_ctx is not None:
            ctx, self._sampling_ctx = self._sampling_ctx, None
            ctx.close()

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def describe(self, sampling: Any) -> dict[str, Any]:
        """What the driver needs to author requests, from the family: the latent of one
        sample and the σ schedule of the train and eval step counts at the sampling size
        (the family's σ policy, so the driver pins exactly what its pipeline would use)."""
        bundle = self.pipeline.bundle
        latents: dict[str, Any] = {}
        if hasattr(sampling, "height"):  # an image-token stage (Janus) has no latent or σ
            height, width = int(sampling.height), int(sampling.width)
            latents = {
                "latent_shape": tuple(bundle.latent_shape_for(sampling)),
                "sigmas": {
                    "train": bundle.sigmas(int(sampling.num_inference_steps), height, width),
                    "eval": bundle.sigmas(int(sampling.eval_num_inference_steps), height, width),
                },
            }
        return {
            **latents,
            "trainable_params": int(self.backend.num_trainable_params()),
            "device": str(self.backend.device),
            "device_name": torch.cuda.get_device_name(self.backend.device)
            if self.backend.device.type == "cuda"
            else "cpu",
        }

    @distributed(dispatch=Dispatch.BROADCAST)
    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> None:
        self.backend.save_checkpoint(path, extra=extra)

    @distributed(dispatch=Dispatch.BROADCAST)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self.backend.load_checkpoint(path)

    @distributed(dispatch=Dispatch.BROADCAST)
    def export_lora(self, path: str, ema: bool = False) -> bool:
        """Write the trained LoRA to ``path`` (diffusers + peft formats); with ``ema=True``
        the EMA weights (what eval samples with) instead. Returns False, writing nothing,
        when ``ema`` is asked of a backend without EMA."""
        return self._export(self.backend.export_lora, path, ema)

    @distributed(dispatch=Dispatch.BROADCAST)
    def export_model(self, path: str, ema: bool = False) -> bool:
        """Write the whole trained model to ``path`` as a ``save_pretrained`` folder with its
        tokenizer (``FSDPBackend.export_pretrained``); with ``ema=True`` the EMA weights.
        Returns False, writing nothing, when ``ema`` is asked of a backend without EMA."""
        return self._export(self.backend.export_pretrained, path, ema)

    def _export(self, write: Callable[[str], object], path: str, ema: bool) -> bool:
        """``write(path)`` with the trained weights, or with the EMA weights swapped in;
        False, writing nothing, for ``ema`` on a backend without EMA."""
        if ema and not getattr(self.backend, "has_ema", False):
            return False
        with self.backend.ema_weights() if ema else contextlib.nullcontext():
            write(path)
        return True

    @distributed(dispatch=Dispatch.BROADCAST)
    def use_eval_weights(self, enabled: bool) -> bool:
        """Swap EMA weights in (``True``) or back out (``False``); returns whether EMA exists."""
        has_ema = getattr(self.backend, "has_ema", False)
        if enabled and has_ema and self._eval_ctx is None:
            self._eval_ctx = contextlib.ExitStack()
            self._eval_ctx.enter_context(self.backend.ema_weights())
        elif not enabled and self._eval_ctx is not None:
            self._eval_ctx.close()
            self._eval_ctx = None
        return bool(has_ema)

    @distributed(dispatch=Dispatch.BROADCAST)
    def device_stats(self) -> dict[str, float]:
        """Peak device memory of this worker (GiB); zeros on CPU."""
        device = self.backend.device
        if device.type != "cuda":
            return {"peak_allocated_gib": 0.0, "peak_reserved_gib": 0.0}
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
        }

    @distributed(dispatch=Dispatch.BROADCAST)
    def start_profile(self) -> None:
        """Start ``torch.profiler`` on this worker (CPU ops, and CUDA kernels on a GPU) until
        :meth:`stop_profile`."""
        from torch.profiler import ProfilerActivity, profile

        require(self._profiler is None, "a profile is already running on this worker")
        activities = [ProfilerActivity.CPU]
        if self.backend.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities)
        self._profiler.__enter__()

    @distributed(dispatch=Dispatch.BROADCAST)
    def stop_profile(self, directory: str) -> dict[str, Any]:
        """Stop the profile; write ``trace_rank<r>.json.gz`` (Chrome trace) under
        ``directory`` and return :func:`unirl.logging.trace.summarize_trace` of it."""
        import gzip
        import json
        import shutil
        import tempfile
        from pathlib import Path

        from unirl.logging.trace import summarize_trace

        require(self._profiler is not None, "stop_profile without start_profile")
        prof, self._profiler = self._profiler, None
        if self.backend.device.type == "cuda":
            torch.cuda.synchronize(self.backend.device)
        prof.__exit__(None, None, None)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            trace = json.loads(raw.read_text())
            with raw.open("rb") as src, gzip.open(out / f"trace_rank{rank}.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        return summarize_trace(trace)

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def count_flops(self, req: RolloutReq, rollout_index: int) -> list[dict[str, float]]:
        """FLOPs of one rollout and one training pass over this rank's shard, counted with
        ``torch.utils.flop_counter.FlopCounterMode`` (not timed; weights do change)."""
        from torch.utils.flop_counter import FlopCounterMode

        # the trained modules' classes, and the class of what the backend wraps (a container
        # called at the top level names its children by attribute, not class: Wan 2.2's
        # WanExperts)
        bundle = self.pipeline.bundle
        modules = [*bundle.trainable_modules.values(), getattr(bundle, "trainable_module", None)]
        trained = sorted({type(m).__name__ for m in modules if m is not None})
        formulas = attention_flop_formulas()
        with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
            resp = self.pipeline.generate(req)
        rollout_total = counter.get_total_flops()
        rollout_transformer = _modules_flops(counter, trained)
        track = resp.tracks[self.pipeline.track_name]
        n = len(track)
        gen = torch.Generator().manual_seed(rollout_index)
        rewards = torch.randn(n, generator=gen)
        track = dataclasses.replace(track, rewards=rewards)
        track, _ = track.compute_advantages()
        with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
            self.stack.train_track(track, rollout_index)
        return [
            {
                "rollout_total": float(rollout_total),
                "rollout_transformer": float(rollout_transformer),
                "train_total": float(counter.get_total_flops()),
                "train_transformer": float(_modules_flops(counter, trained)),
                "samples": float(n),
            }
        ]


def pixels_of(track: RolloutTrack) -> torch.Tensor:
    decoded = track.decoded
    if not isinstance(decoded, Images):
        raise TypeError(f"expected decoded Images on the track, got {type(decoded).__name__}")
    return decoded.pixels


def attention_flops(query: Any, key: Any, value: Any) -> int:
    """FLOPs of one attention forward on ``[b, h, s, d]`` shapes, grouped-query included
    (``h_q`` a multiple of the key/value heads): ``QK^T`` and ``PV`` at the query's heads."""
    b, h_q, s_q, d_q = query
    s_k, d_v = key[2], value[3]
    require(
        key[0] == value[0] == b and key[1] == value[1] and h_q % key[1] == 0,
        f"attention FLOPs: q{tuple(query)} k{tuple(key)} v{tuple(value)} are not [b, h, s, d] "
        "with the query's heads a multiple of the key/value heads",
    )
    return 2 * b * h_q * s_q * s_k * (d_q + d_v)


def attention_flop_formulas() -> dict[Any, Any]:
    """``FlopCounterMode(custom_mapping=...)`` for the fused attention kernels, counting
    grouped-query attention (``enable_gqa``, which transformers passes for an unmasked
    Qwen2.5-VL / Qwen3 text encoder) at the query's heads; the backward is twice the forward
    (four matmuls). The torch of the GPU image asserts equal heads there and failed the count
    on Qwen-Image (fifteenth session, call 15)."""
    aten = torch.ops.aten

    def forward(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
        return attention_flops(query, key, value)

    def backward(_grad: Any, query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
        return 2 * attention_flops(query, key, value)

    # the last one is the CPU kernel, which torch's own table leaves uncounted (a CPU count
    # missed every attention FLOP; tests/tools/test_wan_flops.py)
    names = [
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ]
    return {
        **{getattr(aten, name): forward for name in names if hasattr(aten, name)},
        **{
            getattr(aten, f"{name}_backward"): backward
            for name in names
            if hasattr(aten, f"{name}_backward")
        },
    }


def _modules_flops(counter: Any, class_names: list[str]) -> int:
    """FLOPs of the outermost modules whose counter name mentions one of ``class_names`` (the
    trained modules; peft / FSDP wrappers keep the class name in the counter's module path),
    each counted once: the counter names a module called at the top level by its class, so
    modules of one class (two experts) add into one entry, and a matched module's children
    (a container's experts) are inside its count already."""
    counts = counter.get_flop_counts()
    matched = [
        name
        for name in counts
        if name != "Global" and any(class_name in name for class_name in class_names)
    ]
    outermost = [
        name for name in matched if not any(name.startswith(other + ".") for other in matched)
    ]
    return sum(sum(counts[name].values()) for name in outermost)


def init_world(pool: PoolBase, cfg: RunConfig) -> None:
    """One torch.distributed group ``world`` over every worker of ``pool`` when the run has
    more than one device (the data-parallel collectives of the colocated roles)."""
    if cfg.num_devices > 1:
        pool.init_process_group(tuple(range(cfg.num_devices)), group_name="world")


def stage_roles(
    blocks: Any,
    *,
    prefix: str = "",
    algorithm_takes: str = "pipeline",
    ops_class: type = TrainOps,
    parallel: ParallelSizes | None = None,
) -> dict[str, Handle]:
    """One stage's roles in the current placement block, from ``blocks`` (a ``RunConfig`` or
    a composed recipe's stage block: ``bundle``, ``pipeline``, ``backend``, ``algorithm``,
    ``stack``): bundle and pipeline, then, when ``blocks.backend`` is set, backend, algorithm
    (given the pipeline as ``algorithm_takes``: ``pipeline`` for a diffusion loss, ``policy``
    for a token loss), stack and ops (``ops_class``). Named ``<prefix>_<role>`` (plain names
    without a prefix). ``parallel``: their model-parallel sizes (``sp`` > 1: the backend gets
    ``sequence_parallel_size`` and splits the bundle's transformer over each SP group)."""
    parallel = parallel or ParallelSizes()
    name = (lambda role: f"{prefix}_{role}") if prefix else (lambda role: role)
    bundle = remote(blocks.bundle, name=name("bundle"), parallel=parallel)
    pipeline = remote(blocks.pipeline, name=name("pipeline"), bundle=bundle, parallel=parallel)
    roles = {"bundle": bundle, "pipeline": pipeline}
    if blocks.backend is None:  # a frozen stage (a prompt enhancer's drawer)
        return roles
    sp = {"sequence_parallel_size": parallel.sp} if parallel.sp > 1 else {}
    backend = remote(blocks.backend, name=name("backend"), bundle=bundle, parallel=parallel, **sp)
    needs: dict[str, Any] = {algorithm_takes: pipeline}  # the policy / the pipeline it replays
    algorithm = remote(blocks.algorithm, name=name("algorithm"), parallel=parallel, **needs)
    stack = remote(
        blocks.stack, name=name("stack"), backend=backend, algorithm=algorithm, parallel=parallel
    )
    ops = remote(
        ops_class,
        name=name("ops"),
        backend=backend,
        pipeline=pipeline,
        stack=stack,
        algorithm=algorithm,
        parallel=parallel,
    )
    return {**roles, "backend": backend, "algorithm": algorithm, "stack": stack, "ops": ops}
