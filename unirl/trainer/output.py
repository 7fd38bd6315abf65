"""The run's output folder on the driver: its layout (``OutputDir``), which checkpoint a run
resumes from (``resolve_resume``, ``checkpoint_problem``) and atomic JSON writes."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from unirl.config.run import RunConfig
from unirl.config.secrets import redact_secrets
from unirl.train.checkpoint import CheckpointError, verify_checkpoint

CHECKPOINT_PREFIX = "step_"
CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}\d{{6,}}")
# what an interrupted write leaves next to a checkpoint (``checkpoint.atomic_directory``)
WRITE_LEFTOVER = re.compile(rf"{CHECKPOINT_PREFIX}\d{{6,}}\.(tmp|old)-\d+")
DRIVER_STATE = "driver_state.json"  # written last into a checkpoint folder: marks it complete


# top-level keys a resumed run may change without a word: how it resumes and for how long
RESUME_KEYS = frozenset({"resume", "overwrite", "num_rollouts", "dry_run"})
_ABSENT = object()


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` of nested mappings; lists stay whole (a leaf)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class OutputDir:
    """``output_dir`` layout: ``config.yaml``, ``train.log`` (``console.ConsoleLog``),
    ``metrics.{jsonl,csv}``, ``eval_metrics.*``, ``samples/``, ``eval/``, ``curves/`` and
    ``report.html`` (``unirl.logging.report``), ``checkpoints/step_<k>/``, ``lora/``."""

    def __init__(self, root: str | Path, *, create: bool = True) -> None:
        """``create``: make the folder now (false for a plan that must write nothing)."""
        self.root = Path(root).resolve()
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, rollout_index: int) -> Path:
        return self.checkpoints / f"{CHECKPOINT_PREFIX}{rollout_index:06d}"

    def checkpoint_folders(self) -> list[Path]:
        """``checkpoints/step_<k>`` folders, complete or not, oldest first; the leftovers of an
        interrupted write (``.tmp-<pid>``, ``.old-<pid>``) are not among them."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(
            (
                p
                for p in self.checkpoints.iterdir()
                if p.is_dir() and CHECKPOINT_NAME.fullmatch(p.name)
            ),
            key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]),
        )

    def write_config(self, data: dict[str, Any]) -> None:
        """``config.yaml``: the resolved recipe with credentials redacted, readable by the
        owner only (it names hosts and paths of the deployment)."""
        from omegaconf import OmegaConf

        path = self.root / "config.yaml"
        text = OmegaConf.to_yaml(OmegaConf.create(redact_secrets(data)))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)  # an existing file keeps its mode through O_TRUNC

    def keep_config_before_resume(
        self, data: dict[str, Any], resume_from: Path, recorded: dict[str, Any] | None
    ) -> str | None:
        """A resumed run's recipe against the one that wrote ``resume_from`` (``recorded``,
        from its ``driver_state.json``; else the run's ``config.yaml``). When they differ, the line
        naming what changed is returned (``backend.optimizer.lr: 0.003 -> 0.0005``) and the
        earlier ``config.yaml`` is kept as ``config.before_<checkpoint>.yaml`` before the new
        one replaces it (an existing copy is not overwritten: a failed attempt does not push
        out the recipe that wrote the checkpoint). ``None`` when they agree or nothing records
        the earlier recipe. ``RESUME_KEYS`` (``resume``, ``num_rollouts`` ...) may change."""
        from omegaconf import OmegaConf

        path = self.root / "config.yaml"
        if recorded is not None:
            before: Any = recorded
        elif path.is_file():
            before = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        else:
            return None
        now = OmegaConf.to_container(OmegaConf.create(redact_secrets(data)), resolve=False)
        old, new = _flatten(before), _flatten(now)
        changed = [
            f"{key}: {_short(old.get(key, '(absent)'))} -> {_short(new.get(key, '(absent)'))}"
            for key in sorted(old.keys() | new.keys())
            if key.split(".")[0] not in RESUME_KEYS
            and old.get(key, _ABSENT) != new.get(key, _ABSENT)
        ]
        if not changed:
            return None
        kept = self.root / f"config.before_{resume_from.name}.yaml"
        if path.is_file() and not kept.exists():
            shutil.copy2(path, kept)
        more = f"; and {len(changed) - 8} more" if len(changed) > 8 else ""
        where = f"; the earlier config.yaml is kept as {kept.name}" if kept.exists() else ""
        return (
            f"[unirl] resume: this run's recipe differs from the one that wrote "
            f"{resume_from.name} ({'; '.join(changed[:8])}{more}){where}"
        )

    def clear_run(self) -> list[str]:
        """Remove what an earlier run left (``overwrite=true``): checkpoints, galleries, the
        exported adapters and models (``lora/``, ``lora_ema/``, ``model/``, ``model_ema/``: a
        new run without EMA must not leave the old EMA for ``tools.export`` to pick), the
        metrics files, the curves, the report, ``run.json`` and the W&B run id (a new run is a
        new W&B run). Returns the names removed."""
        removed = []
        folders = ("checkpoints", "samples", "eval", "curves", "lora", "lora_ema", "model")
        for name in (*folders, "model_ema", "tensorboard"):
            if (self.root / name).is_dir():
                shutil.rmtree(self.root / name)
                removed.append(name + "/")
        for prefix in ("metrics", "eval_metrics"):
            for suffix in (".jsonl", ".csv"):
                path = self.root / f"{prefix}{suffix}"
                if path.exists():
                    path.unlink()
                    removed.append(path.name)
        for name in ("report.html", "run.json", "wandb_run_id"):
            if (self.root / name).exists():
                (self.root / name).unlink()
                removed.append(name)
        return removed

    def prune_checkpoints(self, keep: int, *, current: Path) -> list[Path]:
        """Checkpoint retention (``keep_last``): keep the newest ``keep`` complete checkpoints
        (``driver_state.json`` present) and ``current``, the one just written; remove every
        other ``step_<k>`` folder, and the ``step_<k>.tmp-<pid>`` / ``.old-<pid>`` folders that
        interrupted writes left. Call it only between saves: no writer of this run is in
        flight then, so every such leftover is a dead writer's. ``keep=0`` removes nothing.
        Returns the folders removed; one that cannot be removed is named on stdout."""
        if keep <= 0:
            return []
        folders = self.checkpoint_folders()
        complete = [p for p in folders if (p / DRIVER_STATE).is_file()]
        kept = {p.name for p in complete[-keep:]} | {current.name}
        doomed = [p for p in folders if p.name not in kept]
        doomed += sorted(
            p for p in self.checkpoints.iterdir() if p.is_dir() and WRITE_LEFTOVER.fullmatch(p.name)
        )
        removed = []
        for path in doomed:
            try:
                shutil.rmtree(path)
            except OSError as exc:
                print(f"[unirl] keep_last: could not remove {path}: {exc}", flush=True)
            else:
                removed.append(path)
        return removed


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete, loadable checkpoint (naming the file), or ``None``.

    Complete: ``driver_state.json`` (written last) parses and the backend's files match the
    manifest in ``trainer_state.json`` (sizes and sha256), all checked here on the driver.
    With several trained stages each backend's files are in the stage's sub-folder."""
    state = path / DRIVER_STATE
    if not state.is_file():
        return f"incomplete: {state} missing (the run stopped while writing this checkpoint)"
    try:
        data = json.loads(state.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{state} is not valid JSON (truncated or corrupt: {exc})"
    stages = (data.get("stages") if isinstance(data, dict) else None) or {}
    folders = [path / str(name) for name in stages] if len(stages) > 1 else [path]
    try:
        for folder in folders:
            verify_checkpoint(folder)
    except CheckpointError as exc:
        return str(exc)
    return None


# what a checkpoint cannot be loaded into when it changes: the model family, the LoRA's shape
# (a full fine-tune vs an adapter, rank, targets, adapters) and the algorithm (its state is in
# driver_state.json); for every stage (``pe.diffusion.``, ``unified.image.`` prefixes too)
INCOMPATIBLE_ON_RESUME = re.compile(
    r"(^|\.)(bundle\._target_|algorithm\._target_|entrypoint"
    r"|backend\.lora\.(rank|targets|extra_adapters|adapter_name))$"
)


def incompatible_resume(
    data: dict[str, Any], resume_from: Path, recorded: dict[str, Any] | None
) -> str | None:
    """The one-line refusal of a resume whose recipe changes what the checkpoint's weights and
    state were made for (:data:`INCOMPATIBLE_ON_RESUME`, read from ``driver_state.json``'s
    recorded recipe), or ``None``. Runs on the driver before any Ray work, so a changed model
    family is refused before a model is built."""
    if recorded is None:
        return None
    old, new = _flatten(recorded), _flatten(redact_secrets(data))

    def lora(flat: dict[str, Any]) -> Any:  # a LoRA block, or none: a full fine-tune
        return "adapter" if any(k.startswith("backend.lora.") for k in flat) else "full"

    changed = [
        f"{key}: {_short(old.get(key, '(absent)'))} -> {_short(new.get(key, '(absent)'))}"
        for key in sorted(old.keys() | new.keys())
        if INCOMPATIBLE_ON_RESUME.search(key) and old.get(key, _ABSENT) != new.get(key, _ABSENT)
    ]
    if lora(old) != lora(new):
        changed.insert(0, f"backend.lora: {lora(old)} -> {lora(new)} fine-tune")
    if not changed:
        return None
    return (
        f"resume: checkpoint {resume_from.name} cannot be loaded by this recipe "
        f"({'; '.join(changed[:4])}): a checkpoint resumes the same model family, LoRA shape "
        "and algorithm; set them back, or start a fresh run (another output_dir, or "
        "overwrite=true)"
    )


def resolve_resume(cfg: RunConfig, out: OutputDir) -> Path | None:
    """``resume``: null (fresh run), ``auto`` (the newest complete, loadable checkpoint in
    output_dir, if any; each newer one skipped is named with why, in one line) or a checkpoint
    folder (refused, naming the file, unless complete and loadable). Runs on the driver before
    any Ray work."""
    if cfg.resume in (None, "", "none", "null"):
        return None
    if cfg.resume == "auto":
        for path in reversed(out.checkpoint_folders()):
            problem = checkpoint_problem(path)
            if problem is None:
                return path
            print(f"[unirl] resume=auto: skipping {path.name}: {problem}", flush=True)
        return None
    path = Path(cfg.resume)
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(
            f"resume={cfg.resume!r} is not a complete, loadable checkpoint: {problem}. "
            "Use resume=auto (the newest checkpoint that verifies) or another "
            "checkpoints/step_XXXXXX folder"
        )
    return path


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``path`` whole or not at all (tmp file, fsync, rename); a failed write (a full
    disk) removes the tmp file and raises."""
    tmp = path.with_suffix(path.suffix + f".tmp-{os.getpid()}")
    try:
        with tmp.open("w") as f:
            f.write(json.dumps(data, indent=2, default=str))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
