#!/usr/bin/env bash
# The Flow-GRPO step with a VLM judge, rewards scored after the rollout against scored under
# sampling (rollout.reward_overlap), on one GPU (docs/performance.md, "A VLM judge under
# sampling"). The judge is HPSv3 with random weights at Qwen2-VL-7B's shapes
# (make_vlm_reward.py; nothing is downloaded); the step is SD3.5-Medium's Flow-GRPO shape
# (sd35m_bench.sh) with PROMPTS prompts x 8 samples, sampled in chunks of 8.
#
#   bash examples/benchmarks/reward_overlap_bench.sh [OUT_DIR]
#   ARCH=qwen2-vl-2b ... a smaller judge; PROMPTS=4 (default) prompts per step; ITERS=2 timed
#   steps; MODE=compile|eager as sd35m_bench.sh; JUDGE=FOLDER keeps the 15 GiB judge out of
#   OUT_DIR
set -euo pipefail
out="${1:-outputs/reward_overlap}"
arch="${ARCH:-qwen2-vl-7b}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
judge="${JUDGE:-${out}/hpsv3_${arch}}"  # JUDGE=FOLDER: where the judge is (written if missing)
[[ -f "${judge}/reward_head.safetensors" ]] ||
  python "${here}/make_vlm_reward.py" --out "${judge}" --arch "${arch}" --device cuda
for overlap in false true; do
  HPSV3="${judge}" OVERLAP="${overlap}" PROMPTS="${PROMPTS:-4}" ITERS="${ITERS:-2}" ONLY=flowgrpo \
    NO_FLOPS=1 TAG="_hpsv3_overlap_${overlap}" bash "${here}/sd35m_bench.sh" "${MODE:-compile}" "${out}"
done
