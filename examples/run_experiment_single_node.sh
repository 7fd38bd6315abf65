#!/usr/bin/env bash
# Run one recipe on this machine.
#
#   bash examples/run_experiment_single_node.sh diffusion/sd3_trainside [hydra overrides ...]
#
# Environment:
#   ENTRY=train_diffusion|train_vlm|train_pe|train_unified_model   entrypoint (default train_diffusion)
#   DRY_RUN=1            print the command (and the environment it sets) instead of running it
#   START_RAY=1          start a local Ray head first and wait until it has NUM_GPUS GPUs
#   NUM_GPUS             devices the wait expects (default: what nvidia-smi lists, else 0)
#   PRETRAINED_MODEL, DATA_PATH, OUTPUT_DIR, REPORT_TO_WANDB   read by the recipes
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
recipe="${1:?usage: $0 <domain>/<recipe> [overrides...]}"
shift
entry="${ENTRY:-train_diffusion}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
export PYTHONUNBUFFERED=1
cmd=(python -m "unirl.${entry}" "--config-name=${recipe}" "$@")

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "ENTRY=${entry} RAY_ADDRESS=${RAY_ADDRESS:-<local>}"
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi

if [[ "${START_RAY:-0}" == "1" ]]; then
  gpus="${NUM_GPUS:-$(command -v nvidia-smi >/dev/null && nvidia-smi -L | wc -l || echo 0)}"
  ray start --head --node-ip-address=127.0.0.1 --num-gpus="${gpus}" --disable-usage-stats
  export RAY_ADDRESS=127.0.0.1:6379
  python "${here}/wait_for_cluster.py" --nodes 1 --gpus "${gpus}" --timeout 300
fi
exec "${cmd[@]}"
