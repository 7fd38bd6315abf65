"""``python -m unirl.tools.export``: a run's LoRA as an adapter folder, or fused into the base
and saved as a pipeline that diffusers loads in a process that never imports unirl."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from unirl.tools.export import main

PROMPT = "a red circle"


def _run_folder(tmp_path: Path, ema: bool) -> Path:
    """A run's output folder as the trainer leaves it: config.yaml and lora/ (+ lora_ema/)."""
    from diffusers import StableDiffusion3Pipeline
    from peft import LoraConfig, get_peft_model_state_dict

    from unirl.models.sd3 import tiny_preset_path

    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(
        {"bundle": {"_target_": "unirl.models.sd3.SD3Bundle", "path": "tiny"}}, run / "config.yaml"
    )
    pipe = StableDiffusion3Pipeline.from_pretrained(tiny_preset_path(), local_files_only=True)
    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["to_q", "to_v"], init_lora_weights=False
    )  # random A and B: the adapter moves outputs
    pipe.transformer.add_adapter(config)
    state = get_peft_model_state_dict(pipe.transformer)
    for name in ("lora", "lora_ema") if ema else ("lora",):
        StableDiffusion3Pipeline.save_lora_weights(run / name, transformer_lora_layers=state)
    return run


SAMPLE = f"""
import sys, torch
from diffusers import StableDiffusion3Pipeline
pipe = StableDiffusion3Pipeline.from_pretrained(sys.argv[1], local_files_only=True)
if len(sys.argv) > 3:
    pipe.load_lora_weights(sys.argv[3])
out = pipe({PROMPT!r}, num_inference_steps=2, guidance_scale=1.0, height=32, width=32,
           generator=torch.Generator().manual_seed(0), output_type="pt").images
assert not any(m == "unirl" or m.startswith("unirl.") for m in sys.modules), "imported unirl"
torch.save(out, sys.argv[2])
"""


def _sample(tmp_path: Path, folder: Path, name: str, lora: Path | None = None) -> torch.Tensor:
    target = tmp_path / f"{name}.pt"
    cmd = [sys.executable, "-c", SAMPLE, str(folder), str(target)]
    if lora is not None:
        cmd.append(str(lora))
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return torch.load(target)


def test_merged_export_loads_in_plain_diffusers_and_equals_the_adapter(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from unirl.models.sd3 import tiny_preset_path

    run = _run_folder(tmp_path, ema=True)
    out = tmp_path / "merged"
    capfd.readouterr()
    assert main([str(run), "--out", str(out), "--merge"]) == 0
    printed = capfd.readouterr()  # one line: no progress bars, no 'No LoRA keys' warnings
    assert printed.err == "" and printed.out.count("\n") == 1, printed
    assert (out / "model_index.json").is_file()
    merged = _sample(tmp_path, out, "merged")
    adapter = _sample(tmp_path, tiny_preset_path(), "adapter", lora=run / "lora_ema")
    base = _sample(tmp_path, tiny_preset_path(), "base")
    torch.testing.assert_close(merged, adapter, atol=1e-4, rtol=0)  # fused = unfused LoRA
    assert (merged - base).abs().max() > 1e-3  # and the LoRA did move the output


def test_adapter_export_picks_ema_by_default_and_raw_on_request(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, ema=True)
    (run / "lora_ema" / "marker").write_text("ema")
    assert main([str(run), "--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "marker").read_text() == "ema"
    assert main([str(run), "--out", str(tmp_path / "b"), "--weights", "raw"]) == 0
    assert (tmp_path / "b" / "pytorch_lora_weights.safetensors").is_file()
    assert not (tmp_path / "b" / "marker").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "step_000007"], "--checkpoint step_000007: no such folder"),
        (["--checkpoint", "latest"], "holds no complete checkpoint"),
        (["--weights", "ema", "--stage", "pe"], "lora_ema/pe does not exist"),
    ],
)
def test_refusals_name_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    run = tmp_path / "run"
    (run / "lora").mkdir(parents=True)
    (run / "lora_ema").mkdir()
    assert main([str(run), "--out", str(tmp_path / "x"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("[unirl] error: ") and message in err and err.count("\n") == 1


def test_latest_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    """``--checkpoint latest`` skips an incomplete checkpoint (no ``driver_state.json``) and the
    ``step_<k>.tmp-<pid>`` leftover of an interrupted write, and orders by step number."""
    run = tmp_path / "run"
    for name, complete in [
        ("step_000020", True),
        ("step_000100", True),
        ("step_000100.tmp-77", False),
        ("step_000120", False),
        ("step_000090", True),
    ]:
        folder = run / "checkpoints" / name
        (folder / "export" / "lora").mkdir(parents=True)
        (folder / "export" / "lora" / "pytorch_lora_weights.safetensors").write_text(name)
        if complete:
            (folder / "driver_state.json").write_text("{}")
    assert main([str(run), "--out", str(tmp_path / "x"), "--checkpoint", "latest"]) == 0
    assert (tmp_path / "x" / "pytorch_lora_weights.safetensors").read_text() == "step_000100"


def test_adapter_export_names_its_base_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny preset's base lives in unirl's cache: the adapter export says where, so plain
    diffusers can load base + adapter."""
    from unirl.models.sd3 import tiny_preset_path

    run = _run_folder(tmp_path, ema=False)
    assert main([str(run), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert f"DiffusionPipeline.from_pretrained({str(tiny_preset_path())!r})" in out
    OmegaConf.save({"bundle": {"path": "org/model"}}, run / "config.yaml")
    assert main([str(run), "--out", str(tmp_path / "b")]) == 0
    assert "from_pretrained('org/model'), then pipe.load_lora_weights(" in capsys.readouterr().out


def test_an_arch_preset_base_is_refused_for_merging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / "lora").mkdir(parents=True)
    (run / "lora" / "pytorch_lora_weights.safetensors").write_bytes(b"")
    OmegaConf.save({"bundle": {"path": "sd3.5-medium-arch"}}, run / "config.yaml")
    assert main([str(run), "--out", str(tmp_path / "x"), "--merge"]) == 2
    assert "random-weight preset" in capsys.readouterr().err
