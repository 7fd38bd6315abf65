"""Export what a run trained, for diffusers / transformers / peft with no project code.

    python -m unirl.tools.export RUN_DIR --out FOLDER [--checkpoint latest|step_000120]
                                 [--weights auto|ema|raw] [--merge] [--base PATH] [--stage TRACK]

What the run left decides the form:

- a full fine-tune (``model/``: text, vision-language, a prompt enhancer's policy, a unified
  model) is copied as it is: a ``save_pretrained`` folder with its tokenizer that
  ``AutoModelForCausalLM.from_pretrained(FOLDER)`` (the class in its ``config.json``) loads;
- a LoRA (``lora/``) is copied as an adapter folder: ``pytorch_lora_weights.safetensors`` for
  ``pipe.load_lora_weights(FOLDER)`` and the peft files (``adapter_config.json`` names the base
  model); with ``--merge`` it is fused into the base model and saved whole — a diffusers
  pipeline (``DiffusionPipeline.from_pretrained(FOLDER)``) for an image model, a transformers
  model with its tokenizer for a text model (``task_type: CAUSAL_LM``).

``--weights ema`` (the default when the run kept an EMA) exports the weights eval sampled with;
``raw`` the optimizer's. The base model is the run's ``bundle.path`` (a local folder, a cached
hub id, or the ``tiny`` preset) unless ``--base`` names another. A model card (``README.md``:
recipe, metrics, how to load it) goes with every export.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
from pathlib import Path

from omegaconf import OmegaConf

from unirl.config.require import ConfigError
from unirl.trainer.model_card import write_model_card
from unirl.trainer.output import CHECKPOINT_NAME, CHECKPOINT_PREFIX, DRIVER_STATE

LORA_FILE = "pytorch_lora_weights.safetensors"
MODEL_MARKER = "config.json"  # a save_pretrained folder (a unified export: text/config.json)


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


def export_folder(
    run: Path, checkpoint: str | None, weights: str, stage: str | None
) -> tuple[Path, str]:
    """``(folder, form)`` of what ``run`` exported (its end, or a checkpoint's ``export/``):
    ``model`` (a full fine-tune's ``save_pretrained`` folder) or ``lora`` (an adapter)."""
    root = _checkpoint(run, checkpoint)
    form = "model" if (root / "model").is_dir() and not (root / "lora").is_dir() else "lora"
    if weights == "auto":
        weights = "ema" if (root / f"{form}_ema").exists() else "raw"
    folder = root / (f"{form}_ema" if weights == "ema" else form)
    if stage:
        folder = folder / stage
    if not folder.is_dir():
        raise ConfigError(
            f"{folder} does not exist: the run exported no {weights} weights there (a run "
            "writes lora/ or model/ when it ends and under each checkpoint's export/; EMA "
            "exists only with backend.ema)"
        )
    marker = MODEL_MARKER if form == "model" else LORA_FILE
    if not ((folder / marker).is_file() or (folder / "text" / marker).is_file()):
        subs = sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise ConfigError(
            f"{folder} has no {marker}"
            + (
                f"; it holds one folder per trained part ({', '.join(subs)}): pass --stage"
                if subs
                else ""
            )
        )
    return folder, form


def is_text_adapter(adapter: Path) -> bool:
    """A causal-LM adapter (``task_type: CAUSAL_LM`` in its ``adapter_config.json``)."""
    config = adapter / "adapter_config.json"
    return config.is_file() and json.loads(config.read_text()).get("task_type") == "CAUSAL_LM"


def _bundle_block(run: Path) -> dict[str, object]:
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


def merge_text(base: Path, adapter: Path, out: Path) -> None:
    """Fuse a causal-LM ``adapter`` (peft) into ``base`` (a transformers folder) and write the
    model with the base's tokenizer to ``out``: what plain transformers loads."""
    from unirl.models.common.progress import hf_progress_bars_disabled, hf_warnings_off

    with hf_progress_bars_disabled(), hf_warnings_off():
        import transformers
        from peft import PeftModel
        from transformers import AutoTokenizer

        config = json.loads((base / "config.json").read_text())
        arch = (config.get("architectures") or ["AutoModelForCausalLM"])[0]
        model_cls = getattr(transformers, arch, transformers.AutoModelForCausalLM)
        model = model_cls.from_pretrained(str(base), local_files_only=True)
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        merged.save_pretrained(str(out))
        AutoTokenizer.from_pretrained(str(base), local_files_only=True).save_pretrained(str(out))


def text_base_folder(run: Path, adapter: Path, base: str | None) -> Path:
    """The transformers folder a causal-LM adapter fuses into: ``--base``, else the
    adapter's ``base_model_name_or_path`` (a folder, or a hub id in the local cache)."""
    named = base or json.loads((adapter / "adapter_config.json").read_text()).get(
        "base_model_name_or_path"
    )
    if not named:
        raise ConfigError(f"{adapter / 'adapter_config.json'} names no base model; pass --base")
    if str(named).endswith("-arch"):
        raise ConfigError(
            f"base model {named!r} is a random-weight preset: a merged model of it is noise; "
            "pass --base with the real weights' folder"
        )
    local = Path(str(named)).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(named), local_files_only=True))
    except Exception as exc:
        raise ConfigError(
            f"base model {named!r} is not in the local Hugging Face cache "
            f"({type(exc).__name__}); pass --base with a local transformers folder"
        ) from exc


def _prefix(stage: str | None) -> str:
    return f"{stage}/" if stage else ""


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
    parser.add_argument(
        "--merge", action="store_true", help="fuse a LoRA into its base model and save it whole"
    )
    parser.add_argument("--base", help="base model folder (default: the run's bundle.path)")
    parser.add_argument("--stage", help="the trained track, when several stages trained")
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and any(args.out.iterdir()):
            raise ConfigError(f"--out {args.out} is not empty; give a new folder")
        folder, form = export_folder(args.run, args.checkpoint, args.weights, args.stage)
        if form == "model":
            if args.merge:
                raise ConfigError(f"{folder} is a full fine-tune, already whole: drop --merge")
            shutil.copytree(folder, args.out, dirs_exist_ok=True)
            print(f"[unirl] model {folder} -> {args.out} (save_pretrained folder)")
        elif args.merge and is_text_adapter(folder):
            merge_text(text_base_folder(args.run, folder, args.base), folder, args.out)
            print(f"[unirl] merged {folder} into its base model: {args.out}")
        elif args.merge:
            merge(base_folder(args.run, args.base), folder, args.out)
            print(f"[unirl] merged {folder} into the base model: {args.out}")
        else:
            shutil.copytree(folder, args.out, dirs_exist_ok=True)
            print(f"[unirl] adapter {folder} -> {args.out} (pipe.load_lora_weights)")
            base = None if args.stage or is_text_adapter(folder) else base_hint(args.run)
            if base:
                print(
                    f"[unirl] its base model: DiffusionPipeline.from_pretrained({base!r}), "
                    f"then pipe.load_lora_weights({str(args.out)!r})"
                )
        if (args.run / "config.yaml").is_file():
            write_model_card(args.out, args.run.resolve(), prefix=_prefix(args.stage))
    except ConfigError as exc:
        print(f"[unirl] error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
