"""Export what a run trained, for diffusers with no project code.

    python -m unirl.tools.export RUN_DIR --out FOLDER [--checkpoint latest|step_000120]
                                 [--weights auto|ema|raw] [--merge] [--base PATH] [--stage TRACK]

Without ``--merge`` the LoRA adapter is copied (``pytorch_lora_weights.safetensors`` for
``pipe.load_lora_weights(FOLDER)``, plus the peft files). With ``--merge`` the adapter is fused
into the base model and the whole pipeline written with ``save_pretrained``: a folder
``DiffusionPipeline.from_pretrained(FOLDER)`` loads like any checkpoint. ``--weights ema``
(the default when the run kept an EMA) exports the weights eval sampled with; ``raw`` the
optimizer's. The base model is the run's ``bundle.path`` (a local diffusers folder, a cached hub
id, or the ``tiny`` preset) unless ``--base`` names another.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from unirl.config.require import ConfigError
from unirl.trainer.output import CHECKPOINT_NAME, CHECKPOINT_PREFIX, DRIVER_STATE

LORA_FILE = "pytorch_lora_weights.safetensors"


def _checkpoint(run: Path, name: str | None) -> Path:
    """The folder holding ``lora/`` and ``lora_ema/``: the run's own (``name`` None) or a
    checkpoint's ``export/``. ``latest`` is the newest complete checkpoint (its
    ``driver_state.json`` written), never the leftover of an interrupted write."""
    if name is None:
        return run
    folders = sorted(
        (p for p in (run / "checkpoints").glob("step_*") if CHECKPOINT_NAME.fullmatch(p.name)),
        key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]),
    )
    if name == "latest":
        complete = [p for p in folders if (p / DRIVER_STATE).is_file()]
        if not complete:
            raise ConfigError(
                f"--checkpoint latest: {run / 'checkpoints'} holds no complete checkpoint"
            )
        return complete[-1] / "export"
    folder = run / "checkpoints" / name
    if not folder.is_dir():
        found = ", ".join(f.name for f in folders) or "none"
        raise ConfigError(f"--checkpoint {name}: no such folder in {run / 'checkpoints'} ({found})")
    return folder / "export"


def adapter_folder(run: Path, checkpoint: str | None, weights: str, stage: str | None) -> Path:
    """The exported LoRA folder of ``run`` (its end, or a checkpoint's ``export/``)."""
    root = _checkpoint(run, checkpoint)
    if weights == "auto":
        weights = "ema" if (root / "lora_ema").exists() else "raw"
    folder = root / ("lora_ema" if weights == "ema" else "lora")
    if stage:
        folder = folder / stage
    if not folder.is_dir():
        raise ConfigError(
            f"{folder} does not exist: the run exported no {weights} LoRA there (full fine-tunes "
            "keep their weights in the checkpoint; EMA exists only with backend.ema)"
        )
    if not (folder / LORA_FILE).is_file():
        subs = sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise ConfigError(
            f"{folder} has no {LORA_FILE}"
            + (
                f"; it holds one folder per trained part ({', '.join(subs)}): pass --stage"
                if subs
                else ""
            )
        )
    return folder


def _bundle_block(run: Path) -> dict[str, Any]:
    """The ``bundle`` block of the run's ``config.yaml`` ({} when it has none)."""
    config = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    bundle = config.get("bundle") if isinstance(config, dict) else None
    return bundle if isinstance(bundle, dict) else {}


def base_folder(run: Path, base: str | None) -> Path:
    """The diffusers folder of the base model: ``--base``, else the run's ``bundle.path``."""
    bundle = _bundle_block(run)
    path = str(base or bundle.get("path") or "")
    if not path:
        raise ConfigError(f"{run / 'config.yaml'} names no bundle.path; pass --base FOLDER")
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if path.endswith("-arch"):
        raise ConfigError(
            f"bundle.path={path!r} is a random-weight preset: a merged model of it is noise; "
            "export the adapter (no --merge) or pass --base with the real weights' folder"
        )
    if path.startswith("tiny"):
        package = str(bundle.get("_target_", "")).rsplit(".", 1)[0]
        module = importlib.import_module(package)
        tiny = module.tiny_preset_path
        return Path(tiny() if path == "tiny" else tiny(path))
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(path, local_files_only=True))
    except Exception as exc:
        raise ConfigError(
            f"bundle.path={path!r} is not in the local Hugging Face cache ({type(exc).__name__}); "
            "pass --base with a local diffusers folder"
        ) from exc


def base_hint(run: Path) -> str | None:
    """What to pass to ``DiffusionPipeline.from_pretrained`` before loading the adapter: the
    run's ``bundle.path``, or the folder a ``tiny`` preset was built in (under
    ``~/.cache/unirl``, which a user cannot guess); ``None`` without a ``config.yaml``."""
    if not (run / "config.yaml").is_file():
        return None
    path = str(_bundle_block(run).get("path") or "")
    if path.startswith("tiny"):
        return str(base_folder(run, None))
    return path or None


def merge(base: Path, adapter: Path, out: Path) -> None:
    """Fuse ``adapter`` into ``base`` and write the pipeline to ``out`` (diffusers only).
    Quiet: no progress bars, and no warnings below error (the pipeline's import warns about
    torchvision; a transformer-only LoRA, that the text encoders got no LoRA keys)."""
    from unirl.models.common.progress import hf_progress_bars_disabled, hf_warnings_off

    with hf_progress_bars_disabled(), hf_warnings_off():
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(base, local_files_only=True)
        pipe.load_lora_weights(adapter)
        pipe.fuse_lora()
        pipe.unload_lora_weights()
        pipe.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m unirl.tools.export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run", type=Path, help="the run's output_dir")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (new)")
    parser.add_argument("--checkpoint", help="latest or a step_XXXXXX folder (default: run end)")
    parser.add_argument(
        "--weights",
        choices=("auto", "ema", "raw"),
        default="auto",
        help="ema: the EMA weights eval sampled with; raw: the optimizer's (default auto: ema "
        "when the run kept an EMA, else raw)",
    )
    parser.add_argument("--merge", action="store_true", help="fuse into the base model")
    parser.add_argument("--base", help="base model folder (default: the run's bundle.path)")
    parser.add_argument("--stage", help="the trained track, when several stages trained")
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and any(args.out.iterdir()):
            raise ConfigError(f"--out {args.out} is not empty; give a new folder")
        adapter = adapter_folder(args.run, args.checkpoint, args.weights, args.stage)
        if args.merge:
            merge(base_folder(args.run, args.base), adapter, args.out)
            print(f"[unirl] merged {adapter} into the base model: {args.out}")
        else:
            shutil.copytree(adapter, args.out, dirs_exist_ok=True)
            print(f"[unirl] adapter {adapter} -> {args.out} (pipe.load_lora_weights)")
            base = None if args.stage else base_hint(args.run)
            if base:
                print(
                    f"[unirl] its base model: DiffusionPipeline.from_pretrained({base!r}), "
                    f"then pipe.load_lora_weights({str(args.out)!r})"
                )
    except ConfigError as exc:
        print(f"[unirl] error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
