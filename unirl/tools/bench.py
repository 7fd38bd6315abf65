"""Benchmark CLI: ``python -m unirl.tools.bench --config-name=<domain>/<recipe> [overrides]``.

Runs ``--warmup`` untimed and ``--iters`` timed rollouts of a recipe (fixed seed and prompt
set, no checkpoints, eval or galleries), then one extra rollout + training pass under
``FlopCounterMode`` to count FLOPs, and writes JSON. The trainer is the recipe's: a text
recipe (``sampling._target_`` is ``ARSamplingParams``, what ``unirl.train_vlm`` runs) goes
through ``ARTrainer``, every other recipe through ``DiffusionTrainer``.

- ``samples_per_s`` end to end (and per device), seconds per phase (text encode, rollout,
  decode, reward, old-logp, train, sync), ``compile_and_warmup_s`` (the warm-up rollouts,
  where ``torch.compile`` happens) and, for compiled runs, ``graphs_compiled_in_timed_rollouts``
  (non-zero: the timings include compile time, and the run says so in one warning line);
- peak device memory per worker;
- counted FLOPs per rollout / train pass and the achieved TFLOP/s and model FLOP utilisation
  (MFU) of the rollout transformer forwards and the training pass, against ``--peak-tflops``
  (default: the card's dense bf16 peak when known);
- text recipes also: ``tokens`` per rollout (prompt, generated, trained = every token of the
  packed micro-batches), ``generated_tokens_per_s`` (over the rollout call),
  ``trained_tokens_per_s`` (over the train phase, π_old replay included, and without it) and
  the fraction of completions cut at ``max_new_tokens``.

Options (our own; every other argument goes to Hydra): ``--warmup N`` (1), ``--iters N`` (3),
``--json PATH`` (``<output_dir>/bench.json``), ``--peak-tflops X``, ``--no-flops``,
``--profile DIR``: after the timed rollouts, one more under ``torch.profiler`` on every
worker, whose Chrome traces (``DIR/trace_rank<r>.json.gz``) and summaries (the device's busy
fraction, time per ``unirl/...`` range, the longest device-idle gaps and what launched the
work that ended each; ``unirl.logging.trace``) land in ``DIR`` and in the JSON under
``profile`` (not timed: the profiler slows the CPU side).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unirl.config.entry import hydra_entry
from unirl.logging.trackers import as_float

if TYPE_CHECKING:
    from unirl.types import RolloutTrack

# dense bf16 peak of known cards (TFLOP/s, vendor spec)
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}

PHASES = {
    "text_encode": "time/text_encode",
    "rollout": "time/rollout",
    "decode": "time/decode",
    "reward": "time/reward",
    "old_logp": "train/time/old_logp",
    "train": "time/train",
    "sync": "time/sync",
    "total": "time/total",
}

# a text stage's phases: the pipeline's tokenization and sampling loop, the driver's whole
# rollout call (what generated tokens/s is measured over), reward, π_old replay, train, sync
TEXT_PHASES = {
    "encode": "time/encode",
    "generate": "time/generate",
    "rollout": "time/rollout_call",
    "reward": "time/reward",
    "old_logp": "train/time/old_logp",
    "train": "time/train",
    "sync": "time/sync",
    "total": "time/total",
}

# per-rollout token counts the text benchmark adds to each metrics row (token_counts)
PROMPT_TOKENS = "bench/prompt_tokens"
GENERATED_TOKENS = "bench/generated_tokens"
TRAINED_TOKENS = "bench/trained_tokens"


def _own_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m unirl.tools.bench",
        add_help=False,
        usage="%(prog)s --config-name=<domain>/<recipe> [options] [key=value ...]",
        description="Run a recipe's loop for warmup + iters rollouts and report samples/s, "
        "seconds per phase, peak memory and FLOPs / MFU as JSON. Hydra's options and the "
        "recipe's keys follow.",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed rollouts first (1)")
    parser.add_argument("--iters", type=int, default=3, help="timed rollouts (3)")
    parser.add_argument("--json", type=str, default=None, help="where to write the JSON")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the card's peak for MFU (known cards: auto)",
    )
    parser.add_argument("--no-flops", action="store_true", help="skip the FLOP-counting pass")
    parser.add_argument(
        "--profile", type=str, default=None, help="one more rollout under torch.profiler, to DIR"
    )
    return parser


def _parse_own_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    return _own_parser().parse_known_args(argv)


OPTS = _parse_own_args([])[0]
_REST: list[str] = []  # the command line left after the benchmark's own options


def _mean(rows: list[dict[str, object]], key: str) -> float:
    vals = [as_float(r[key]) for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else 0.0


def summarize(
    rows: list[dict[str, object]],
    *,
    warmup: int,
    num_devices: int,
    flops: list[dict[str, float]] | None,
    memory: list[dict[str, float]] | None,
    peak_tflops: float | None,
    device_name: str,
    text: bool = False,
) -> dict[str, Any]:
    """The benchmark JSON from per-rollout metrics rows (the first ``warmup`` are excluded).
    ``text``: a text recipe's rows (``TEXT_PHASES`` and the token figures of
    :func:`text_throughput`)."""
    timed = rows[warmup:]
    if not timed:
        raise ValueError("no timed rollouts: raise --iters")
    samples = _mean(timed, "samples")
    phases = {name: _mean(timed, key) for name, key in (TEXT_PHASES if text else PHASES).items()}
    samples_per_s = samples / phases["total"] if phases["total"] else 0.0
    out: dict[str, Any] = {
        "device": device_name,
        "num_devices": num_devices,
        "timed_rollouts": len(timed),
        "samples_per_rollout": samples,
        "samples_per_s": samples_per_s,
        "samples_per_s_per_device": samples_per_s / num_devices,
        "seconds_per_phase": phases,
        "compile_and_warmup_s": sum(as_float(r["time/total"]) for r in rows[:warmup]),
        "reward_mean_last": as_float(timed[-1]["reward/mean"]),
    }
    # how the timed rollouts' trained steps got the unconditional velocity (docs/math.md)
    uncond = {
        k.split("/")[-1]: _mean(timed, k)
        for k in timed[-1]
        if k.endswith(("uncond_reused", "uncond_recomputed"))
    }
    if uncond:
        out["uncond_per_rollout"] = uncond
    # rewards scored under sampling (rollout.reward_overlap): latency, wait, hidden fraction
    overlap = {
        k.split("reward_overlap/")[-1]: _mean(timed, k) for k in timed[-1] if "reward_overlap/" in k
    }
    if overlap:
        out["reward_overlap"] = overlap
    # graphs torch.compile built inside the timed rollouts (the stacks' compile/new_graphs,
    # mean over ranks): their compile time is in the phases above
    compiled = [
        as_float(v) for r in timed for k, v in r.items() if k.endswith("compile/new_graphs")
    ]
    if compiled:
        out["graphs_compiled_in_timed_rollouts"] = sum(compiled)
    if text:
        out.update(text_throughput(timed, phases))
    if memory:
        out["peak_memory_gib"] = [m["peak_allocated_gib"] for m in memory]
    if flops:
        total = {k: sum(f[k] for f in flops) for k in flops[0]}
        out["flops"] = total
        # FLOPs are counted over all ranks; phase times are per rank (ranks run in parallel)
        rollout_s, train_s = max(phases["rollout"], 1e-9), max(phases["train"], 1e-9)
        out["achieved_tflops_per_device"] = {
            "rollout_transformer": total["rollout_transformer"] / num_devices / rollout_s / 1e12,
            "rollout_all": total["rollout_total"] / num_devices / rollout_s / 1e12,
            "train_all": total["train_total"] / num_devices / train_s / 1e12,
        }
        out["flops_per_sample"] = (total["rollout_total"] + total["train_total"]) / max(
            total["samples"], 1
        )
        if peak_tflops:
            out["peak_tflops"] = peak_tflops
            out["mfu"] = {k: v / peak_tflops for k, v in out["achieved_tflops_per_device"].items()}
    return out


def text_throughput(timed: list[dict[str, object]], phases: dict[str, float]) -> dict[str, object]:
    """Token figures of a text recipe from its timed rows: mean tokens per rollout, generated
    tokens/s over the rollout call, trained tokens/s over the train phase (π_old replay
    included) and over its updates alone (the phase less ``old_logp``). Trained tokens are
    every token of the packed micro-batches (prompt + completion of each sample); ``None``
    when the rows carry no count (the engine kept the segments on its workers)."""
    generated = _mean(timed, GENERATED_TOKENS)
    have_trained = all(r.get(TRAINED_TOKENS) is not None for r in timed)
    trained = _mean(timed, TRAINED_TOKENS) if have_trained else None
    prompt = _mean(timed, PROMPT_TOKENS) if have_trained else None
    samples = _mean(timed, "samples")
    updates_s = phases["train"] - phases["old_logp"]

    def per_s(count: float | None, seconds: float) -> float | None:
        return count / seconds if count is not None and seconds > 0 else None

    return {
        "tokens_per_rollout": {"prompt": prompt, "generated": generated, "trained": trained},
        "prompt_tokens_per_sample": prompt / samples if prompt is not None and samples else None,
        "generated_tokens_per_sample": generated / samples if samples else 0.0,
        "response_clip_ratio": _mean(timed, "response/clip_ratio"),
        "generated_tokens_per_s": per_s(generated, phases["rollout"]),
        "generated_tokens_per_s_in_generate": per_s(generated, phases["generate"]),
        "trained_tokens_per_s": per_s(trained, phases["train"]),
        "trained_tokens_per_s_without_old_logp": per_s(trained, updates_s),
    }


def token_counts(track: RolloutTrack) -> dict[str, float]:
    """One text rollout's token counts (a metrics row's ``bench/*`` keys): generated tokens
    from the engine's per-sample ``response_tokens``; prompt and trained tokens (every row of
    the packed segment) when the segment reached the driver."""
    generated = sum(int(m["response_tokens"]) for m in track.metadata)
    out = {GENERATED_TOKENS: float(generated)}
    segment = getattr(track, "segment", None)
    if segment is not None:
        trained = int(segment.tokens.lengths.sum())
        out[TRAINED_TOKENS] = float(trained)
        out[PROMPT_TOKENS] = float(trained - generated)
    return out


def _text_trainer_class() -> type:
    """``ARTrainer`` whose every training step adds the rollout's :func:`token_counts` to
    its metrics row."""
    from unirl.trainer.ar import ARTrainer

    class TokenCountingARTrainer(ARTrainer):
        def track_metrics(self, stage: Any, track: Any) -> dict[str, float]:
            return {**super().track_metrics(stage, track), **token_counts(track)}

    return TokenCountingARTrainer


def is_text_recipe(data: dict[str, Any]) -> bool:
    """Whether a composed recipe samples text (``unirl.train_vlm``'s test: its ``sampling``
    block is ``ARSamplingParams``)."""
    target = str((data.get("sampling") or {}).get("_target_", ""))
    return target.rsplit(".", 1)[-1] == "ARSamplingParams"


def _peak_for(device_name: str, given: float | None) -> float | None:
    if given:
        return given
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return value
    return None


def _card_name(device: str) -> str:
    """The card's name for a CUDA ``device`` (the ARTrainer's roles report none), else
    ``device`` itself; asked after the timed loop."""
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return str(device)


def count_flops_or_error(
    trainer: Any, ops: Any, rollout_index: int
) -> tuple[list[dict[str, float]] | None, str | None]:
    """One more rollout + train under the FLOP counter: ``(flops, None)``, or ``(None, the
    failure in one line)`` when the pass fails, so the timed rollouts before it still reach
    the JSON (call 15: a failed pass on a 20B model lost a whole run's figures)."""
    try:
        prompts = trainer.data_source.next_batch()
        req = trainer.build_request(prompts, rollout_index)
        return ops.count_flops(req, rollout_index), None
    except Exception as exc:  # any failure of the extra pass is reported, not raised
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def run(data: dict[str, Any]) -> int:
    """Compose -> validate -> timed loop -> FLOP count -> JSON."""
    from unirl.config.geometry import BatchGeometry
    from unirl.config.validate import locate, validate
    from unirl.trainer.diffusion import DiffusionTrainer

    opts = OPTS
    data = dict(data)
    text = is_text_recipe(data)
    data.update(
        num_rollouts=opts.warmup + opts.iters,
        save_interval=0,
        eval_interval=0,
        resume=None,
        overwrite=True,  # a benchmark's folder holds only the last measurement
        dry_run=False,
    )
    data["logging"] = {
        **(data.get("logging") or {}),
        "gallery_interval": 0,
        "trackers": ["local"],
        "progress": "off",
    }
    data["data_source"] = {**data["data_source"], "shuffle": False}
    rollout = dict(data.get("rollout") or {})
    target = rollout.get("_target_")
    if (
        text
        and target
        and getattr(locate(str(target), "rollout"), "engine_kind", "") == "trainside"
    ):
        # the driver needs each rollout's packed segment to count trained tokens: ship it
        # through the driver (a text segment is a few hundred KB) instead of parking it
        data["rollout"] = {**rollout, "resident": False}
    cfg, objs = validate(data)
    if text:
        from unirl.trainer.ar import check_ar_recipe

        check_ar_recipe(cfg)
    samples = BatchGeometry.of(cfg, objs).samples_per_rollout
    out_path = Path(opts.json) if opts.json else Path(cfg.output_dir) / "bench.json"
    results: dict[str, Any] = {}

    def after_loop(trainer: Any, ops: Any) -> None:
        memory = ops.device_stats()
        if opts.profile:
            ops.start_profile()
            t0 = time.perf_counter()
            try:
                trainer.one_rollout(cfg.num_rollouts + 1)
            finally:  # a failed rollout still stops the profilers (and keeps what they saw)
                profiled_s = time.perf_counter() - t0
                summaries = ops.stop_profile(opts.profile)
            results["profile"] = {"rollout_s": profiled_s, "workers": summaries}
            Path(opts.profile, "summary.json").write_text(json.dumps(results["profile"], indent=2))
        results["memory"] = memory
        results["flops"] = None
        if not opts.no_flops:
            t0 = time.perf_counter()
            results["flops"], results["flops_error"] = count_flops_or_error(
                trainer, ops, cfg.num_rollouts
            )
            results["flop_count_s"] = time.perf_counter() - t0
        results["device_name"] = getattr(trainer, "device_name", None) or _card_name(cfg.device)

    trainer = _text_trainer_class()(cfg, data) if text else DiffusionTrainer(cfg, data)
    local = Path(cfg.output_dir) / "metrics.jsonl"
    if local.exists():
        local.unlink()
    trainer.run(after_loop=after_loop)
    rows = [json.loads(line) for line in local.read_text().splitlines() if line.strip()]
    for r in rows:
        r["samples"] = samples
    device_name = results.get("device_name", cfg.device)
    summary = summarize(
        rows,
        warmup=opts.warmup,
        num_devices=cfg.num_devices,
        flops=results.get("flops"),
        memory=results.get("memory"),
        peak_tflops=_peak_for(device_name, opts.peak_tflops),
        device_name=device_name,
        text=text,
    )
    summary["recipe_overrides"] = _REST
    summary["flop_count_s"] = results.get("flop_count_s")
    if results.get("flops_error"):
        summary["flops_error"] = results["flops_error"]
    if "profile" in results:
        summary["profile"] = results["profile"]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"[unirl.bench] wrote {out_path}", flush=True)
    if summary.get("graphs_compiled_in_timed_rollouts"):
        print(
            f"[unirl.bench] warning: {summary['graphs_compiled_in_timed_rollouts']:g} graphs were "
            "compiled inside the timed rollouts, so the timings include compile time; the run "
            "log's recompile warning names what compiled (raise --warmup if it settles)",
            flush=True,
        )
    if results.get("flops_error"):
        print(
            f"[unirl.bench] error: the FLOP-counting pass failed after the timed rollouts "
            f"({results['flops_error']}); the timings above are kept in {out_path} without MFU "
            "(rerun with --no-flops to skip the pass)",
            flush=True,
        )
        return 1
    return 0


main_hydra = hydra_entry("diffusion/sd3_tiny_trainside", run)


def main(argv: list[str] | None = None) -> None:
    """The benchmark's command line: its own options (above), then Hydra's and the recipe's.
    ``--help`` prints the benchmark's options before Hydra's help."""
    global OPTS, _REST
    given = sys.argv[1:] if argv is None else argv
    OPTS, rest = _parse_own_args(given)
    _REST = rest
    if "--help" in rest or "-h" in rest:
        print(_own_parser().format_help(), flush=True)
    sys.argv = [sys.argv[0], *rest]
    main_hydra()


if __name__ == "__main__":
    main()
