"""Export what a run trained, for diffusers with no project code.

    python -m unirl.tools.export RUN_DIR --out FOLDER [--checkpoint latest|step_000120]
                                 [--weights ema|raw] [--merge] [--base PATH] [--stage TRACK]

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

from omegaconf import OmegaConf

from unirl.config.require import ConfigError

LORA_FILE = "pytorch_lora_weights.safetensors"


def _checkpoint(run: Path, name: str | None) -> Path:
    if name is None:
        return run
    folders = sorted((run / "checkpoints").glob("step_*"))
    if name == "latest":
        if not folders:
            raise ConfigError(f"--checkpoint latest: {run / 'checkpoints'} holds no checkpoint")
        return folders[-1] / "export"
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


def base_folder(run: Path, base: str | None) -> Path:
    """The diffusers folder of the base model: ``--base``, else the run's ``bundle.path``."""
    config = OmegaConf.load(run / "config.yaml")
    bundle = config.get("bundle") or {}
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


def merge(base: Path, adapter: Path, out: Path) -> None:
    """Fuse ``adapter`` into ``base`` and write the pipeline to ``out`` (diffusers only)."""
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
    parser.add_argument("--weights", choices=("auto", "ema", "raw"), default="auto")
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
    except ConfigError as exc:
        print(f"[unirl] error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
