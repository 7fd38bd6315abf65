"""examples/benchmarks/make_vlm_reward.py: the judge it writes for the GPU benchmark has the
released backbones' size, and the folder it writes loads and scores through ``HPSv3``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "benchmarks" / "make_vlm_reward.py"
# parameter counts of the released checkpoints (their safetensors index: Qwen2-VL-7B-Instruct
# 8,291,375,616; Qwen2-VL-2B-Instruct 2,208,985,600, tied embeddings counted once)
RELEASED = {"qwen2-vl-7b": 8_291_375_616, "qwen2-vl-2b": 2_208_985_600}


def _script():
    spec = importlib.util.spec_from_file_location("make_vlm_reward", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("arch", sorted(RELEASED))
def test_the_benchmark_judge_has_the_released_backbone_size(arch: str) -> None:
    script = _script()
    tok = script.qwen_tokenizer(special=(script.HPSV3_REWARD_TOKEN,))
    with torch.device("meta"):
        model = transformers.Qwen2VLForConditionalGeneration(script.backbone_config(arch, tok))
    assert sum(p.numel() for p in model.parameters()) == RELEASED[arch]


def test_the_written_folder_scores_through_hpsv3(tmp_path: Path) -> None:
    from unirl.reward.local import HPSv3

    folder = _script().write(tmp_path / "judge", "tiny", "cpu")
    scorer = HPSv3(path=str(folder), device="cpu", dtype="fp32", batch_size=2)
    images = torch.rand(3, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    prompts = ["a red cube", "two cats on a mat", "a lighthouse"]
    batch = scorer.score(images, prompts, [{}] * 3).scores["hpsv3"]
    alone = torch.cat(
        [
            scorer.score(images[i : i + 1], prompts[i : i + 1], [{}]).scores["hpsv3"]
            for i in range(3)
        ]
    )
    assert batch.shape == (3,) and torch.isfinite(batch).all()
    torch.testing.assert_close(batch, alone, rtol=0, atol=1e-5)  # right padding: batch-invariant
