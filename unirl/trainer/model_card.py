"""``README.md`` beside every exported model or adapter: the model card the Hugging Face hub
shows, with the run's recipe and what it measured.

Front matter: ``library_name`` (transformers for a ``save_pretrained`` model, peft for an
adapter, diffusers for a drawer's LoRA), ``base_model`` when the export names one, ``tags``.
Body: the recipe (entrypoint, family, algorithm, rollouts), a metrics table of the reward and
its components (first and last rollout, the first and last eval) read from ``metrics.jsonl`` /
``eval_metrics.jsonl``, how to load it, and the resolved ``config.yaml``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from unirl.logging.curves import component_names, read_rows

CARD = "README.md"
TOTAL = re.compile(r"(?:[^/]+/)?reward/mean")


def _target(block: Any) -> str:
    return str(block.get("_target_", "")) if isinstance(block, dict) else ""


def _fmt(value: Any) -> str:
    return "–" if value is None else f"{float(value):.4f}"


def metrics_table(run: Path, prefix: str = "") -> list[str]:
    """Markdown rows ``| metric | first rollout | last rollout | first eval | last eval |``:
    the trained stage's reward mean (``prefix``: ``pe/`` or empty), every other stage's, and
    each reward component."""
    train = read_rows(run / "metrics.jsonl")
    evals = read_rows(run / "eval_metrics.jsonl")
    if not train and not evals:
        return ["No metrics were logged."]
    present = {k for r in train for k in r}
    keys = [f"{prefix}reward/mean"]  # the trained stage's reward first, then every stage's
    keys += sorted(k for k in present if TOTAL.fullmatch(k) and k not in keys)
    keys += [k for k in component_names(train) if k not in keys]

    def first(rows: list[dict[str, Any]], key: str) -> Any:
        return next((r[key] for r in rows if key in r), None)

    def last(rows: list[dict[str, Any]], key: str) -> Any:
        return next((r[key] for r in reversed(rows) if key in r), None)

    t0 = train[0]["step"] if train else "–"
    t1 = train[-1]["step"] if train else "–"
    e0 = evals[0]["step"] if evals else "–"
    e1 = evals[-1]["step"] if evals else "–"
    lines = [
        f"| metric | rollout {t0} | rollout {t1} | eval after {e0} | eval after {e1} |",
        "|---|---|---|---|---|",
    ]
    for key in keys:
        lines.append(
            f"| `{key}` | {_fmt(first(train, key))} | {_fmt(last(train, key))} | "
            f"{_fmt(first(evals, 'eval/' + key))} | {_fmt(last(evals, 'eval/' + key))} |"
        )
    return lines


def export_kind(folder: Path) -> tuple[str, str | None]:
    """``(kind, base model)`` of an export folder, read from its files: ``unified`` (``text/``
    beside the VAE and image head), ``transformers`` (a ``save_pretrained`` model), ``peft`` (a
    causal-LM adapter) or ``diffusers`` (a LoRA for ``pipe.load_lora_weights``)."""
    if (folder / "text" / "config.json").is_file():
        return "unified", None
    if (folder / "config.json").is_file():
        return "transformers", None
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        meta = json.loads(adapter.read_text())
        base = meta.get("base_model_name_or_path")
        return ("peft" if meta.get("task_type") == "CAUSAL_LM" else "diffusers"), base
    return "diffusers", None


def write_model_card(folder: Path, run: Path, *, prefix: str = "") -> Path:
    """Write ``folder/README.md`` for an export of the run in ``run`` (its kind and base model
    read from the folder, :func:`export_kind`). ``prefix``: the trained stage's metric
    prefix (``text/``), empty for a single-stage recipe."""
    from omegaconf import OmegaConf

    kind, base_model = export_kind(folder)
    config_path = run / "config.yaml"
    config_text = config_path.read_text() if config_path.is_file() else ""
    config = OmegaConf.to_container(OmegaConf.create(config_text or "{}"), resolve=False)
    assert isinstance(config, dict)
    library = {"transformers": "transformers", "unified": "transformers"}.get(kind, kind)
    front = ["---", f"library_name: {library}"]
    if base_model:
        front.append(f"base_model: {json.dumps(base_model)}")
    front += ["tags:", "- unirl", "- reinforcement-learning", "---", ""]
    algorithm = _target(config.get("algorithm")).rsplit(".", 1)[-1] or "?"
    bundle = _target(config.get("bundle")).rsplit(".", 1)[-1] or "?"
    body = [
        f"# {run.name}",
        "",
        f"Trained with UniRL ({algorithm} on {bundle}, {config.get('num_rollouts', '?')} "
        f"rollouts of {config.get('batch_size', '?')} prompts, seed {config.get('seed', '?')}).",
        "",
        "## Metrics",
        "",
        *metrics_table(run, prefix),
        "",
        "## Loading it",
        "",
        "```python",
        *_loading(kind, folder, base_model),
        "```",
        "",
        "## Recipe",
        "",
        "The resolved `config.yaml` of the run (credentials redacted):",
        "",
        "```yaml",
        config_text.rstrip(),
        "```",
        "",
    ]
    path = folder / CARD
    path.write_text("\n".join(front + body))
    return path


def _loading(kind: str, folder: Path, base_model: str | None) -> list[str]:
    if kind == "peft":
        return [
            "from peft import AutoPeftModelForCausalLM  # loads the base named in adapter_config.json",
            f"model = AutoPeftModelForCausalLM.from_pretrained({str(folder)!r})",
        ]
    if kind == "diffusers":
        return [
            "from diffusers import DiffusionPipeline",
            f"pipe = DiffusionPipeline.from_pretrained({base_model or '<base model>'!r})",
            f"pipe.load_lora_weights({str(folder)!r})",
        ]
    where = folder / "text" if kind == "unified" else folder
    config = json.loads((where / "config.json").read_text())
    arch = (config.get("architectures") or ["AutoModelForCausalLM"])[0]
    lines = [
        f"from transformers import AutoTokenizer, {arch}",
        f"model = {arch}.from_pretrained({str(where)!r})",
        f"tokenizer = AutoTokenizer.from_pretrained({str(where)!r})",
    ]
    if kind == "unified":
        lines.append("# vae/ is a diffusers AutoencoderKL; the image head needs UniRL's model")
    return lines
