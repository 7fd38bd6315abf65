"""SD3 presets: the tiny folder is built offline, cached, deterministic and race-safe; arch
specs have the released shapes; model paths resolve or fail fast with a useful message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from unirl.models.sd3 import (
    PRESET_NAMES,
    ModelSourceError,
    SD3ArchSpec,
    count_transformer_params,
    resolve_model_source,
    sd35_medium_arch_spec,
    tiny_preset_path,
)
from unirl.models.sd3.presets import MANIFEST

COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")
TOKENIZERS = ("tokenizer", "tokenizer_2", "tokenizer_3")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for comp in COMPONENTS:
        (file,) = (folder / comp).glob("*.safetensors")
        out.update({f"{comp}.{k}": v for k, v in load_file(file).items()})
    return out


def test_tiny_preset_builds_offline_is_cached_and_deterministic(
    tmp_path, monkeypatch, tiny_sd3_path
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = tiny_preset_path(cache_dir=tmp_path)
    assert first.parent == tmp_path / "presets" and first.name.startswith("tiny-")
    assert (first / MANIFEST).is_file() and (first / "model_index.json").is_file()
    assert json.loads((first / MANIFEST).read_text())["preset"] == "tiny"
    assert first.stat().st_mode & 0o777 == 0o755, "a shared cache folder must be readable by all"
    assert not [p for p in first.parent.iterdir() if ".tmp-" in p.name], (
        "temporary build dir left behind"
    )

    start = time.perf_counter()
    again = tiny_preset_path(cache_dir=tmp_path)
    assert again == first
    assert time.perf_counter() - start < 0.5, "a cached preset must not be rebuilt"

    # Same key as the machine-wide cache (built by another process, maybe another session):
    # every weight and tokenizer must be identical.
    assert first.name == tiny_sd3_path.name
    ours, theirs = _weights(first), _weights(tiny_sd3_path)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    for tok in TOKENIZERS:
        assert (first / tok / "tokenizer.json").read_bytes() == (
            tiny_sd3_path / tok / "tokenizer.json"
        ).read_bytes()


def test_tiny_preset_concurrent_builders_share_one_folder(tmp_path):
    code = "from unirl.models.sd3 import tiny_preset_path; import sys; print(tiny_preset_path(cache_dir=sys.argv[1]))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    paths = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(paths) == 1
    entries = sorted(
        p.name for p in (tmp_path / "presets").iterdir() if not p.name.endswith(".lock")
    )
    assert len(entries) == 1 and entries[0].startswith("tiny-"), entries
    assert (Path(paths.pop()) / MANIFEST).is_file()


def test_resolve_model_source_presets_and_folders(tiny_sd3_path, tmp_path):
    assert resolve_model_source("tiny") == tiny_sd3_path
    assert resolve_model_source(str(tiny_sd3_path)) == tiny_sd3_path
    spec = resolve_model_source("sd3.5-medium-arch")
    assert isinstance(spec, SD3ArchSpec) and spec.name == "sd3.5-medium-arch"
    assert set(PRESET_NAMES) == {"tiny", "sd3.5-medium-arch"}

    (tmp_path / "not_a_model").mkdir()
    with pytest.raises(ModelSourceError, match="not a diffusers SD3 layout"):
        resolve_model_source(str(tmp_path / "not_a_model"))
    with pytest.raises(ModelSourceError, match="no such local folder"):
        resolve_model_source(str(tmp_path / "missing" / "model"))


def test_hub_id_offline_fails_fast_naming_the_presets(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelSourceError) as info:
        resolve_model_source("unirl-tests/definitely-not-cached-sd3")
    assert time.perf_counter() - start < 5.0
    message = str(info.value)
    for needle in (
        "unirl-tests/definitely-not-cached-sd3",
        "path=tiny",
        "sd3.5-medium-arch",
        "PRETRAINED_MODEL",
        "HF_HUB_OFFLINE=1",
    ):
        assert needle in message, needle


def test_sd35_medium_arch_shapes_and_param_count_on_meta():
    spec = sd35_medium_arch_spec()
    tr = spec.transformer
    assert (
        tr["num_layers"] == 24
        and tr["num_attention_heads"] == 24
        and tr["attention_head_dim"] == 64
    )
    assert (
        tr["caption_projection_dim"] == tr["num_attention_heads"] * tr["attention_head_dim"] == 1536
    )
    assert tr["joint_attention_dim"] == spec.t5["d_model"] == 4096
    assert (
        tr["pooled_projection_dim"]
        == spec.clip_l["projection_dim"] + spec.clip_g["projection_dim"]
        == 2048
    )
    assert spec.clip_l["hidden_size"] + spec.clip_g["hidden_size"] <= spec.t5["d_model"]
    assert tuple(tr["dual_attention_layers"]) == tuple(range(13)) and tr["qk_norm"] == "rms_norm"
    assert spec.vae["latent_channels"] == tr["in_channels"] == 16
    assert spec.scheduler["shift"] == 3.0

    before = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    n = count_transformer_params(spec)
    assert 2.2e9 <= n <= 2.5e9, n
    if torch.cuda.is_available():
        assert torch.cuda.memory_allocated() == before


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="builds SD3.5-Medium shapes on a CUDA device"
)
def test_sd35_medium_arch_bundle_runs_on_gpu():
    from unirl.models.sd3 import SD3Bundle

    bundle = SD3Bundle(
        path="sd3.5-medium-arch", device="cuda", skip_t5=True, t5_placeholder="random"
    )
    assert bundle.text_encoder_3 is None
    assert sum(p.numel() for p in bundle.transformer.parameters()) == count_transformer_params(
        bundle.source
    )
    cond = bundle.encode_prompts(["a cat", "a dog"], negative=True)
    assert cond.prompt_embeds.shape == (2, 77 + 256, 4096) and cond.pooled_prompt_embeds.shape == (
        2,
        2048,
    )
    latents = torch.randn(2, *bundle.latent_shape(512, 512), device="cuda")
    with torch.no_grad():
        v = bundle.predict_velocity(latents, 0.5, cond)
        pixels = bundle.decode(latents[:1])
    assert v.shape == latents.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    assert pixels.shape == (1, 3, 512, 512)
