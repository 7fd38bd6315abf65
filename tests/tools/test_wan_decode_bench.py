"""``examples/benchmarks/wan_decode_bench.py`` on the tiny Wan: decoding two videos in one VAE
call gives the per-video decode's pixels (fp32, up to rounding), and a bf16 decoder stays
within a stated distance of fp32's."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "benchmarks" / "wan_decode_bench.py"


def test_batched_decode_equals_per_video_decode(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("wan_decode_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wan_decode_bench"] = module
    spec.loader.exec_module(module)
    out = tmp_path / "decode.json"
    args = "--preset tiny --device cpu --videos 2 --frames 9 --height 64 --width 64 --iters 1"
    module.main(
        [*args.split(), "--chunks", "1", "2", "--dtypes", "fp32", "bf16", "--json", str(out)]
    )
    configs = json.loads(out.read_text())["configs"]
    assert [(c["vae_dtype"], c["chunk"]) for c in configs] == [
        ("fp32", 1),
        ("fp32", 2),
        ("bf16", 1),
        ("bf16", 2),
    ]
    assert configs[0]["max_pixel_diff_from_first"] == 0.0
    # measured 4.8e-7: the same convolutions over a batch of two
    assert configs[1]["max_pixel_diff_from_first"] < 1e-5
    # measured 0.0196 on the tiny decoder (pixels in [0, 1]): about five 8-bit steps (1 / 255),
    # which is why the bench reports the difference beside the time
    assert 1e-4 < configs[2]["max_pixel_diff_from_first"] < 0.05
    assert all(c["seconds"] > 0 for c in configs)
