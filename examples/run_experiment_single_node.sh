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
#   PRETRAINED_MODEL, DATA_PATH, OUTPUT_DIR   read by the recipes
#
# Weights & Biases is a tracker the recipe's overrides choose, e.g.
#   logging.trackers=[local,tensorboard,wandb] logging.wandb_project=<project>
# (the recipe's own trackers listed too; pip install 'unirl-mm[wandb]'). REPORT_TO_WANDB is refused
# rather than ignored: no launcher can add W&B without replacing the recipe's tracker list.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
recipe="${1:?usage: $0 <domain>/<recipe> [overrides...]}"
shift
entry="${ENTRY:-train_diffusion}"
if [[ ! -f "${here}/../unirl/${entry}.py" ]]; then
  known="$(cd "${here}/../unirl" && ls train_*.py | sed 's/\.py$//' | paste -sd' ' -)"
  echo "ENTRY=${entry}: there is no entrypoint unirl/${entry}.py; choose one of: ${known}" >&2
  exit 2
fi
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
export PYTHONUNBUFFERED=1
cmd=(python -m "unirl.${entry}" "--config-name=${recipe}" "$@")

if [[ -n "${REPORT_TO_WANDB:-}" && "${REPORT_TO_WANDB}" != "0" ]]; then
  echo "REPORT_TO_WANDB is not read: add logging.trackers=[local,wandb] (with the recipe's other trackers) and logging.wandb_project=<project> to the overrides; pip install 'unirl-mm[wandb]'" >&2
  exit 2
fi

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
