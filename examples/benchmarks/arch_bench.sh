#!/usr/bin/env bash
# One recipe's Flow-GRPO rollout + train step at a family's real shapes, random weights
# (an `*-arch` preset: nothing downloaded), on one GPU (or NUM_DEVICES); writes the benchmark JSON
# (samples/s, seconds per phase, peak memory).
#
#   bash examples/benchmarks/arch_bench.sh RECIPE PRESET [OUT_DIR] [extra overrides...]
#   bash examples/benchmarks/arch_bench.sh diffusion/flux2_klein_trainside flux2-klein-arch
#   bash examples/benchmarks/arch_bench.sh diffusion/z_image_trainside z-image-arch
#   SIZE=512 SPP=8 MICRO=4 WARMUP=1 ITERS=2 override the shape below; HEIGHT / WIDTH for a
#   non-square shape; FRAMES=81 for a video recipe (the reward then scores every frame).
#   The speed knobs (default: the recipe's own): COMPILE=true compiles each transformer block
#   (backend.fsdp.compile), ACKPT=false drops activation checkpointing, COMPILE_VAE=true
#   compiles the VAE decoder, SLOTS=N replays N trained steps per forward + backward,
#   OLD_LOGP=current takes π_old from the loss forward (the bench runs one optimizer step per
#   rollout, where that is exact) instead of a replay pass; FLOPS=1 adds the FLOP-counting
#   pass (MFU in the JSON; one more rollout + train, uncompiled).
#   bash examples/benchmarks/arch_bench.sh diffusion/wan21_t2v_dancegrpo wan2.1-1.3b-arch \
#     OUT HEIGHT=480 WIDTH=832 FRAMES=81 SPP=2 MICRO=1 (as environment variables)
#   NUM_DEVICES=N runs on N GPUs (one prompt per data-parallel group); SP=P splits each video
#   over P of them (parallel.sequence_parallel_size: Ulysses, N / P groups of P GPUs), e.g.
#   NUM_DEVICES=2 SP=2 runs the same one prompt as the one-GPU bench on two GPUs.
#
# The recipe's own sampling (steps, CFG, SDE window, LoRA, activation checkpointing), scaled
# to one GPU: one prompt x SPP samples at SIZE x SIZE, one forward of SPP samples, micro-batches
# of MICRO, one optimizer step per rollout, old log-probs replayed at training geometry; JPEG
# compressibility as a cheap reward. The presets' tokenizers are the tiny ones, so prompts
# are shorter than with the real tokenizers (text encoders still run at their real shapes).
set -euo pipefail
recipe="$1"
preset="$2"
name="$(basename "${recipe}")"
out="${3:-outputs/bench_${name}}"
shift 2
[[ $# -gt 0 ]] && shift
export PRETRAINED_MODEL="${preset}" RAY_USAGE_STATS_ENABLED=0
size="${SIZE:-512}"
reward='{_target_: unirl.reward.local.JpegCompressibility}'
frames=()
if [[ -n "${FRAMES:-}" ]]; then
  reward="{_target_: unirl.reward.local.PerFrame, scorer: ${reward}}"
  frames=(sampling.num_frames="${FRAMES}")
fi
knobs=()
[[ -n "${COMPILE:-}" ]] && knobs+=("++backend.fsdp.compile=${COMPILE}")
[[ -n "${ACKPT:-}" ]] && knobs+=("backend.fsdp.activation_checkpointing=${ACKPT}")
[[ -n "${COMPILE_VAE:-}" ]] && knobs+=("++bundle.compile_vae=${COMPILE_VAE}")
[[ -n "${SLOTS:-}" ]] && knobs+=("++algorithm.slots_per_forward=${SLOTS}")
[[ -n "${OLD_LOGP:-}" ]] && knobs+=("algorithm.old_logp_source=${OLD_LOGP}")
devices="${NUM_DEVICES:-1}"
sp="${SP:-1}"
[[ "${sp}" != 1 ]] && knobs+=("parallel.sequence_parallel_size=${sp}")
flops=(--no-flops)
[[ -n "${FLOPS:-}" ]] && flops=()
python -m unirl.tools.bench --config-name="${recipe}" \
  --warmup "${WARMUP:-1}" --iters "${ITERS:-2}" "${flops[@]}" \
  --json "${out}/${name}.json" output_dir="${out}/${name}" \
  num_devices="${devices}" device=cuda batch_size="$((devices / sp))" sampling.samples_per_prompt="${SPP:-8}" \
  sampling.height="${HEIGHT:-${size}}" sampling.width="${WIDTH:-${size}}" "${frames[@]}" \
  stack.micro_batch_size="${MICRO:-4}" stack.num_updates_per_batch=1 \
  pipeline.forward_batch_size="${SPP:-8}" \
  "~reward.backend" "+reward.backend=${reward}" "reward.guards=[]" \
  logging.progress=off "${knobs[@]}" "$@"
