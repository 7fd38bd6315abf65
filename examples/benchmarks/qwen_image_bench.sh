#!/usr/bin/env bash
# One Flow-GRPO rollout + train step at Qwen-Image's real shapes, random weights (preset
# qwen-image-arch: 20 B MMDiT, 7 B Qwen2.5-VL text encoder, nothing downloaded), on one GPU.
#
#   bash examples/benchmarks/qwen_image_bench.sh [OUT_DIR]
#   SIZE=512 SPP=8 MICRO=4 WARMUP=1 ITERS=2 override the shape below.
#
# The recipe's shape, scaled to one GPU: one prompt x SPP samples at SIZE x SIZE, 10 steps,
# true CFG 4.0 (a separate negative forward, norm rescale), a random 2-step SDE window, LoRA
# r64 on attention and MLPs, activation checkpointing, old log-probs replayed at training
# geometry, one optimizer step; JPEG compressibility as a cheap reward. The tokenizer is the
# tiny preset's, so prompts are shorter than with the real one.
set -euo pipefail
out="${1:-outputs/bench_qwen_image}"
export PRETRAINED_MODEL=qwen-image-arch RAY_USAGE_STATS_ENABLED=0
size="${SIZE:-512}"
python -m unirl.tools.bench --config-name=diffusion/qwen_image_trainside \
  --warmup "${WARMUP:-1}" --iters "${ITERS:-2}" --no-flops \
  --json "${out}/qwen_image_flowgrpo.json" output_dir="${out}/qwen_image_flowgrpo" \
  num_devices=1 device=cuda batch_size=1 sampling.samples_per_prompt="${SPP:-8}" \
  sampling.height="${size}" sampling.width="${size}" \
  stack.micro_batch_size="${MICRO:-4}" stack.num_updates_per_batch=1 \
  pipeline.forward_batch_size="${SPP:-8}" \
  reward.backend._target_=unirl.reward.local.JpegCompressibility "~reward.backend.engine" "reward.guards=[]" \
  logging.progress=off
