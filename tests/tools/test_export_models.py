"""Every domain's quick-start leaves a model that plain transformers (and diffusers, for what
draws) loads and generates from, in a process that never imports unirl: the tiny LLM (full
fine-tune, and a LoRA run fused by ``unirl.tools.export --merge``), the tiny VLM, the prompt
enhancer's policy (its rewrite drawn by the frozen tiny SD3 in plain diffusers) and the unified
model's text half and VAE. The exported weights are the trained ones, and each export carries
a model card with the run's recipe and metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from unirl.config.entry import compose_recipe
from unirl.tools.export import main as export_main

ROLLOUTS = ["num_rollouts=2", "eval_interval=0", "logging.gallery_interval=0"]

# run in a fresh interpreter: transformers / diffusers only
LOAD_AND_GENERATE = r"""
import json, sys, torch
import transformers
from transformers import AutoTokenizer

def generate(folder):
    config = json.load(open(f"{folder}/config.json"))
    cls = getattr(transformers, config["architectures"][0])
    model = cls.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt").input_ids
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                         min_new_tokens=4, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:]), out.shape[1] - ids.shape[1]

result = {}
for kind, folder, extra in json.loads(sys.argv[1]):
    completion, new = generate(folder if kind != "unified" else f"{folder}/text")
    entry = {"completion": completion, "new_tokens": new}
    if kind == "pe":  # the frozen drawer draws the policy's rewrite
        from diffusers import StableDiffusion3Pipeline
        pipe = StableDiffusion3Pipeline.from_pretrained(extra, local_files_only=True)
        image = pipe(completion or "a red circle", num_inference_steps=2, guidance_scale=1.0,
                     height=32, width=32, output_type="pt",
                     generator=torch.Generator().manual_seed(0)).images
        entry["image"] = list(image.shape)
    if kind == "unified":  # the VAE decodes latents in plain diffusers
        from diffusers import AutoencoderKL
        vae = AutoencoderKL.from_pretrained(f"{folder}/vae")
        channels = vae.config.latent_channels
        entry["image"] = list(vae.decode(torch.zeros(1, channels, 4, 4)).sample.shape)
    result[folder] = entry
assert not any(m == "unirl" or m.startswith("unirl.") for m in sys.modules), "imported unirl"
print(json.dumps(result))
"""


def _run(entry: str, recipe: str, out: Path, overrides: list[str]) -> None:
    import importlib

    run = importlib.import_module(f"unirl.{entry}").run
    assert run(compose_recipe(recipe, [f"output_dir={out}", *ROLLOUTS, *overrides])) == 0


def _generate(jobs: list[tuple[str, Path, str]]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_GENERATE, json.dumps([[k, str(f), e] for k, f, e in jobs])],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_every_domain_exports_a_model_plain_libraries_load_and_generate_from(
    tmp_path: Path, ray_session: None
) -> None:
    from unirl.models.qwen3 import tiny_preset_path as qwen3_tiny
    from unirl.models.sd3 import tiny_preset_path as sd3_tiny

    llm, lora, vlm, pe, unified = (tmp_path / n for n in ("llm", "lora", "vlm", "pe", "unified"))
    _run("train_vlm", "llm/qwen3_tiny_grpo", llm, ["save_interval=2"])
    _run(
        "train_vlm",
        "llm/qwen3_tiny_grpo",
        lora,
        ["backend.lora={_target_: unirl.train.LoraConfig, rank: 4, alpha: 8}"],
    )
    _run("train_vlm", "vlm/qwen_vl_tiny_grpo", vlm, [])
    _run("train_pe", "pe/pe_tiny_trainside", pe, [])
    _run("train_unified_model", "unified_model/unified_tiny", unified, [])

    # the full fine-tune's export holds exactly the weights its checkpoint holds after the
    # last update, and they moved away from the tiny preset
    exported = load_file(llm / "model" / "model.safetensors")
    checkpoint = load_file(llm / "checkpoints" / "step_000002" / "model.safetensors")
    base = load_file(qwen3_tiny() / "model.safetensors")
    shared = sorted(exported.keys() & checkpoint.keys())
    assert len(shared) == len(checkpoint) >= 20
    for key in shared:
        torch.testing.assert_close(exported[key], checkpoint[key], rtol=0, atol=0)
    moved = [k for k in base.keys() & exported.keys() if not torch.equal(base[k], exported[k])]
    assert moved, "the export equals the untrained preset"

    # the LoRA run's adapter names its base; the merge equals base + unmerged adapter
    adapter_config = json.loads((lora / "lora" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(qwen3_tiny())
    assert adapter_config["task_type"] == "CAUSAL_LM"
    merged = tmp_path / "lora_merged"
    assert export_main([str(lora), "--out", str(merged), "--merge"]) == 0
    _check_merge_equals_adapter(qwen3_tiny(), lora / "lora", merged)
    copied = tmp_path / "llm_export"
    assert export_main([str(llm), "--out", str(copied)]) == 0
    assert (copied / "model.safetensors").read_bytes() == (
        llm / "model" / "model.safetensors"
    ).read_bytes()

    results = _generate(
        [
            ("llm", copied, ""),
            ("llm", merged, ""),
            ("vlm", vlm / "model", ""),
            ("pe", pe / "model", str(sd3_tiny())),
            ("unified", unified / "model", ""),
        ]
    )
    assert len(results) == 5
    for folder, entry in results.items():
        assert entry["new_tokens"] == 4, (folder, entry)
        assert isinstance(entry["completion"], str), (folder, entry)
    assert results[str(pe / "model")]["image"] == [1, 3, 32, 32]
    assert results[str(unified / "model")]["image"][:2] == [1, 3]

    # model cards: recipe and metrics, for the model and the adapter alike
    for folder, library in ((llm / "model", "transformers"), (lora / "lora", "peft")):
        card = (folder / "README.md").read_text()
        assert card.startswith(f"---\nlibrary_name: {library}\n"), card[:80]
        assert "| `reward/answer/mean` |" in card and "| `reward/format/mean` |" in card
        assert "num_rollouts: 2" in card  # the resolved recipe
    assert f'base_model: "{qwen3_tiny()}"' in (lora / "lora" / "README.md").read_text()
    assert "| `reward/brightness/mean` |" in (unified / "model" / "README.md").read_text()


def _check_merge_equals_adapter(base: Path, adapter: Path, merged: Path) -> None:
    from peft import PeftModel
    from transformers import Qwen3ForCausalLM

    ids = torch.tensor([[1, 5, 9, 17, 33, 65]])
    plain = Qwen3ForCausalLM.from_pretrained(str(base)).eval()
    with torch.no_grad():
        base_logits = plain(input_ids=ids).logits
        unmerged = PeftModel.from_pretrained(plain, str(adapter)).eval()(input_ids=ids).logits
        fused = Qwen3ForCausalLM.from_pretrained(str(merged)).eval()(input_ids=ids).logits
    torch.testing.assert_close(fused, unmerged, atol=1e-5, rtol=1e-5)
    assert (fused - base_logits).abs().max() > 1e-6, "the adapter did not move the logits"


@pytest.mark.parametrize(
    ("state", "expected"),
    [({"w": 1}, "already whole: drop --merge")],
)
def test_merging_a_full_fine_tune_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: dict[str, int], expected: str
) -> None:
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text(json.dumps(state))
    assert export_main([str(run), "--out", str(tmp_path / "x"), "--merge"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("[unirl] error: ") and expected in err and err.count("\n") == 1
