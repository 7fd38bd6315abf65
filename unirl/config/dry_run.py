"""``dry_run=true``: compose, validate, print the placement plan and batch geometry, exit 0."""

from __future__ import annotations

from typing import Any

from unirl.config.run import RunConfig


def batch_geometry(cfg: RunConfig, objs: dict[str, Any]) -> dict[str, Any]:
    sampling = objs.get("sampling")
    spp = getattr(sampling, "samples_per_prompt", 1)
    n = cfg.batch_size * spp
    stack = cfg.stack or {}
    updates = int(stack.get("num_updates_per_batch", 1))
    micro = int(stack.get("micro_batch_size", 1))
    train_ranks = (
        cfg.num_devices if cfg.layout == "colocate" else round(cfg.num_devices * cfg.train_fraction)
    )
    per_rank = n // max(train_ranks, 1)
    geometry = {
        "prompts_per_rollout": cfg.batch_size,
        "samples_per_prompt": spp,
        "samples_per_rollout": n,
        "train_ranks": train_ranks,
        "samples_per_train_rank": per_rank,
        "optimizer_steps_per_rollout": updates,
        "mini_batch_per_rank": per_rank // updates,
        "micro_batch_size": micro,
        "micro_batches_per_step": per_rank // updates // micro,
    }
    if sampling is not None:
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


def print_dry_run(cfg: RunConfig, objs: dict[str, Any], roles: list[tuple[str, str, str]]) -> None:
    print("[unirl] dry run: recipe composed and validated; no weights loaded, no Ray started")
    print(f"[unirl] devices: {cfg.num_devices} x {cfg.device}, layout={cfg.layout}")
    print("[unirl] placement plan:")
    for name, target, slab in roles:
        print(f"  {name:<10} {target:<55} {slab}")
    print("[unirl] batch geometry:")
    for k, v in batch_geometry(cfg, objs).items():
        print(f"  {k:<28} {v}")
