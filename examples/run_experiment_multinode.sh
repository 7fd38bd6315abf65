#!/usr/bin/env bash
# Multi-node launcher: the head starts Ray, waits until every node and device has joined,
# then runs the recipe; workers join the head and stay attached.
#
#   ROLE=head   NNODES=2 GPUS_PER_NODE=8 bash examples/run_experiment_multinode.sh diffusion/sd3_trainside num_devices=16
#   ROLE=worker HEAD_ADDR=10.0.0.1        bash examples/run_experiment_multinode.sh
#
# Environment:
#   ROLE=head|worker     this node's role (required)
#   HEAD_ADDR            head node address (workers; the head uses NODE_IP or its first address)
#   RAY_PORT             Ray GCS port (default 6379)
#   NNODES, GPUS_PER_NODE  what the head waits for before starting (CPUS_PER_NODE for CPU runs)
#   WAIT_TIMEOUT         seconds to wait for the cluster (default 600)
#   ENTRY, DRY_RUN=1     as in run_experiment_single_node.sh (W&B too: an override, not REPORT_TO_WANDB)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
role="${ROLE:?set ROLE=head or ROLE=worker}"
port="${RAY_PORT:-6379}"
entry="${ENTRY:-train_diffusion}"
gpus="${GPUS_PER_NODE:-$(command -v nvidia-smi >/dev/null && nvidia-smi -L | wc -l || echo 0)}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
export PYTHONUNBUFFERED=1

run() {  # print under DRY_RUN=1, execute otherwise
  if [[ "${DRY_RUN:-0}" == "1" ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}
run_exec() {  # the same, the run replacing this shell: a SIGTERM to it reaches the trainer
  if [[ "${DRY_RUN:-0}" == "1" ]]; then printf '%q ' "$@"; echo; else exec "$@"; fi
}

case "${role}" in
  head)
    recipe="${1:?usage: ROLE=head $0 <domain>/<recipe> [overrides...]}"
    shift
    if [[ ! -f "${here}/../unirl/${entry}.py" ]]; then
      known="$(cd "${here}/../unirl" && ls train_*.py | sed 's/\.py$//' | paste -sd' ' -)"
      echo "ENTRY=${entry}: there is no entrypoint unirl/${entry}.py; choose one of: ${known}" >&2
      exit 2
    fi
    if [[ -n "${REPORT_TO_WANDB:-}" && "${REPORT_TO_WANDB}" != "0" ]]; then
      echo "REPORT_TO_WANDB is not read: add logging.trackers=[local,wandb] (with the recipe's other trackers) and logging.wandb_project=<project> to the overrides; pip install 'unirl-mm[wandb]'" >&2
      exit 2
    fi
    node_ip="${NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
    node_ip="${node_ip:-127.0.0.1}"
    run ray start --head --node-ip-address="${node_ip}" --port="${port}" --num-gpus="${gpus}" --disable-usage-stats
    export RAY_ADDRESS="${node_ip}:${port}"
    nnodes="${NNODES:-1}"
    run python "${here}/wait_for_cluster.py" --nodes "${nnodes}" --gpus "$((gpus * nnodes))" \
      --cpus "${CPUS_PER_NODE:-0}" --timeout "${WAIT_TIMEOUT:-600}"
    run_exec python -m "unirl.${entry}" "--config-name=${recipe}" "$@"
    ;;
  worker)
    head="${HEAD_ADDR:?workers need HEAD_ADDR}"
    run ray start --address="${head}:${port}" --num-gpus="${gpus}" --block
    ;;
  *)
    echo "ROLE must be head or worker, got '${role}'" >&2
    exit 2
    ;;
esac
