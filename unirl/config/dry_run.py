"""``dry_run=true``: compose, validate, print the placement plan and batch geometry, exit 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from unirl.config.geometry import BatchGeometry
from unirl.config.run import RunConfig


def batch_geometry(cfg: RunConfig, objs: Mapping[str, Any]) -> dict[str, object]:
    """What ``dry_run`` prints: the ``BatchGeometry`` the validators checked, plus the
    sampling resolution and the steps trained in the first rollout."""
    sampling = objs["sampling"]
    g = BatchGeometry.of(cfg, objs)
    geometry: dict[str, object] = {
        "prompts_per_rollout": g.prompts_per_rollout,
        "samples_per_prompt": g.samples_per_prompt,
        "samples_per_rollout": g.samples_per_rollout,
        "train_ranks": g.train_ranks,
    }
    if cfg.parallel.sequence_parallel_size > 1:  # train_ranks counts SP groups then
        geometry["sequence_parallel_size"] = cfg.parallel.sequence_parallel_size
    geometry |= {
        "samples_per_train_rank": g.samples_per_train_rank,
        "optimizer_steps_per_rollout": g.num_updates_per_batch,
        "mini_batch_per_rank": g.mini_batch_per_rank,
        "micro_batch_size": g.micro_batch_size,
        "micro_batches_per_step": g.micro_batches_per_step,
    }
    budget = getattr(objs.get("stack"), "max_tokens_per_micro_batch", None)
    if budget is not None:  # micro-batches packed by tokens: their count is set per rollout
        geometry["micro_batch_size"] = "packed by tokens"
        geometry["micro_batches_per_step"] = "as the token budget needs"
        geometry["max_tokens_per_micro_batch"] = budget
    describe = getattr(sampling, "dry_run_fields", None)
    if callable(describe):  # a domain's own sampling knobs (autoregressive: lengths, temperature)
        geometry.update(describe())
        return geometry
    sde = getattr(sampling, "sde_steps", None)
    chosen = (
        sde.select(sampling.num_inference_steps, seed=cfg.seed, rollout_index=0)
        if sde is not None
        else ()
    )
    geometry.update(
        {
            "resolution": f"{sampling.height}x{sampling.width}",
            "num_inference_steps": sampling.num_inference_steps,
            "cfg": sampling.guidance_scale > 1.0,
            "trained_steps_first_rollout": list(chosen),
        }
    )
    return geometry


def print_plan(roles: list[tuple[str, str, str]]) -> None:
    """``[unirl] placement plan:`` and one line per ``(role, target, where)`` row (a pool's
    ``plan_rows()``): printed by ``dry_run`` and by the real run once its roles are up."""
    print("[unirl] placement plan:", flush=True)
    wide = max((len(name) for name, _, _ in roles), default=0)
    tall = max((len(target) for _, target, _ in roles), default=0)
    for name, target, slab in roles:
        print(f"  {name:<{wide}}  {target:<{tall}}  {slab}", flush=True)


def print_dry_run(
    cfg: RunConfig, objs: Mapping[str, object], roles: list[tuple[str, str, str]]
) -> None:
    print("[unirl] dry run: recipe composed and validated; no weights loaded, no Ray started")
    print(f"[unirl] devices: {cfg.num_devices} x {cfg.device}, layout={cfg.layout}")
    print_plan(roles)
    print("[unirl] batch geometry:")
    for k, v in batch_geometry(cfg, objs).items():
        print(f"  {k:<28} {v}")


def print_section(title: str, rows: Mapping[str, object]) -> None:
    """One more block after :func:`print_dry_run`: ``[unirl] <title>:`` and a line per row
    (a composed recipe's second stage: the PE drawer, the unified model's image stage)."""
    print(f"[unirl] {title}:")
    for key, value in rows.items():
        print(f"  {key:<34} {value}")
