#!/usr/bin/env bash
# Benchmarks of docs/performance.md on one GPU, random weights at SD3.5-Medium shapes
# (preset sd3.5-medium-arch: nothing is downloaded).
#
#   bash examples/benchmarks/sd35m_bench.sh [eager|compile] [OUT_DIR]
#   ONLY=flowgrpo|fast runs one shape; TAG=_x suffixes the output names; NO_FLOPS=1 skips
#     the FLOP-counting pass (no TFLOP/s figures, about 20 s less per shape)
#   NUM_DEVICES=2 ONLY=flowgrpo bash examples/benchmarks/sd35m_bench.sh compile
#     (data parallel over 2 GPUs, whole-module replicas and one gradient all-reduce per step;
#      DP=shard uses FSDP2 instead, with SHARD_FROZEN=false keeping the frozen base whole on
#      each GPU, RESHARD=false keeping gathered parameters between forwards, and GATHER=true
#      keeping every block gathered while the trainer samples a rollout,
#      backend.fsdp.gather_for_sampling)
#   SDPA=cudnn VAE_DTYPE=bf16 bash examples/benchmarks/sd35m_bench.sh compile
#     (attention kernel and VAE precision; defaults: SDPA=auto, VAE_DTYPE=bf16)
#   FUSE=false ... runs diffusers' attention processor instead of the fused q / k / v (and
#     LoRA A) projections (bundle.fuse_projections, default true)
#   SIZE=1024 samples at 1024x1024 (default 512); MICRO=N sets the training micro-batch
#     (default 8 for Flow-GRPO, 16 for Fast); ACKPT=true checkpoints each block's activations
#   SLOTS=N ... replays N trained steps as the rows of one training forward + backward
#     (algorithm.slots_per_forward, for both shapes unless ONLY picks one; default: the
#     recipe's, 3 for Flow-GRPO, 1 for Fast;
#     activation memory grows with it: one slot at SIZE=1024 already peaked at 61 GiB, so
#     use SLOTS=1 there on an 80 GB card)
#   RECORD_UNCOND=false ... recomputes the unconditional velocity in training (no grad)
#     instead of reusing the rollout's (pipeline.record_uncond, default true)
#   GRAPH_TEXT=false ... runs the text encoders eagerly instead of from CUDA graphs
#     (bundle.graph_text_encoders, default true here)
#   PROFILE=1 ... also profiles one more rollout per shape (bench --profile): traces and the
#     device-idle summary in OUT_DIR/profile_<shape>_<mode>
#   INDUCTOR_OPTIONS='{combo_kernels: true}' ... torch._inductor.config settings for the compiled
#     blocks (backend.fsdp.inductor_options, default null)
#   COMPILE_VAE=false ... decodes with the eager VAE (default true, as the GPU recipes; the
#     second-session figures in docs/performance.md had COMPILE_VAE=false FUSE=false)
#   FP8=true ... samples the rollout with the frozen base's linears in float8 e4m3, rowwise
#     scales (bundle.fp8_sampling; training and the π_old replay stay bf16; compute
#     capability >= 8.9). π_old must then be replayed, so FP8=true also defaults
#     OLD_LOGP=replay and RECORD_UNCOND=false (both refused with FP8); compare it against
#     FP8=false OLD_LOGP=replay RECORD_UNCOND=false
#   OLD_LOGP=replay|rollout|current ... algorithm.old_logp_source (default rollout; replay
#     with FP8=true)
#   HPSV3=FOLDER ... scores with HPSv3 from FOLDER (bf16, batch 8, on the GPU) instead of the
#     JPEG size (examples/benchmarks/make_vlm_reward.py writes one with random weights);
#     OVERLAP=true scores each forward_batch_size chunk while the next one samples
#     (rollout.reward_overlap); PROMPTS=N samples N prompts x 8 per GPU in Flow-GRPO's shape
#     (default 1: one chunk, nothing to overlap); reward_overlap_bench.sh runs both
#
# 1. Flow-GRPO shape: 512x512, 10 steps, CFG 4.5, group 8, LoRA r32, 9 trained steps,
#    KL reference forward (beta 0.04), T5 length 128, cheap reward (JPEG size).
# 2. Flow-GRPO-Fast shape: CPS, no CFG, 3-step window, 2 prompts x 8 samples.
set -euo pipefail
mode="${1:-eager}"
out="${2:-outputs/bench}"
compile=false
fp8="${FP8:-false}"
if [[ "${fp8}" == "true" ]]; then
  old_logp="${OLD_LOGP:-replay}" record_uncond="${RECORD_UNCOND:-false}"
else
  old_logp="${OLD_LOGP:-rollout}" record_uncond="${RECORD_UNCOND:-true}"
fi
[[ "${mode}" == "compile" ]] && compile=true
if [[ -n "${HPSV3:-}" ]]; then
  reward=(reward.backend._target_=unirl.reward.local.HPSv3 "+reward.backend.path=${HPSV3}"
    +reward.backend.device=cuda +reward.backend.dtype=bf16 +reward.backend.batch_size=8)
else
  reward=(reward.backend._target_=unirl.reward.local.JpegCompressibility)
fi
export PRETRAINED_MODEL=sd3.5-medium-arch RAY_USAGE_STATS_ENABLED=0
common=(
  --warmup "${WARMUP:-1}" --iters "${ITERS:-3}" ${NO_FLOPS:+--no-flops}
  num_devices="${NUM_DEVICES:-1}" device=cuda
  "~reward.backend.engine" "reward.guards=[]"
  stack.num_updates_per_batch=1 algorithm.old_logp_source="${old_logp}"
  "++backend.fsdp={compile: ${compile}, reshard_after_forward: ${RESHARD:-true}, shard_frozen: ${SHARD_FROZEN:-true}, data_parallel: ${DP:-replicate}, activation_checkpointing: ${ACKPT:-false}, inductor_options: ${INDUCTOR_OPTIONS:-null}, gather_for_sampling: ${GATHER:-false}}"
  sampling.height="${SIZE:-512}" sampling.width="${SIZE:-512}"
  ++bundle.sdpa_backend="${SDPA:-auto}" bundle.vae_dtype="${VAE_DTYPE:-bf16}" ++bundle.compile_vae="${COMPILE_VAE:-true}" ++bundle.fuse_projections="${FUSE:-true}"
  ++bundle.graph_text_encoders="${GRAPH_TEXT:-true}" ++bundle.fp8_sampling="${fp8}"
  ++pipeline.record_uncond="${record_uncond}" ${SLOTS:+++algorithm.slots_per_forward=${SLOTS}}
  logging.progress=off "${reward[@]}" ++rollout.reward_overlap="${OVERLAP:-false}"
)
if [[ "${ONLY:-}" != "fast" ]]; then
python -m unirl.tools.bench --config-name=diffusion/sd3_trainside "${common[@]}" \
  --json "${out}/flowgrpo_${mode}${TAG:-}.json" output_dir="${out}/flowgrpo_${mode}${TAG:-}" \
  ${PROFILE:+--profile "${out}/profile_flowgrpo_${mode}${TAG:-}"} \
  batch_size="$((${PROMPTS:-1} * ${NUM_DEVICES:-1}))" sampling.samples_per_prompt=8 stack.micro_batch_size="${MICRO:-8}" \
  pipeline.forward_batch_size=8
fi
[[ "${ONLY:-}" == "flowgrpo" ]] && exit 0
python -m unirl.tools.bench --config-name=diffusion/sd3_fast "${common[@]}" \
  --json "${out}/fast_${mode}${TAG:-}.json" output_dir="${out}/fast_${mode}${TAG:-}" \
  ${PROFILE:+--profile "${out}/profile_fast_${mode}${TAG:-}"} \
  batch_size="$((2 * ${NUM_DEVICES:-1}))" sampling.samples_per_prompt=8 stack.micro_batch_size="${MICRO:-16}" \
  pipeline.forward_batch_size=16 algorithm.kl.beta=0.0
