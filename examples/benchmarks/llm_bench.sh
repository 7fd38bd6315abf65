#!/usr/bin/env bash
# Autoregressive GRPO side by side on one GPU: our trainer (examples/llm/qwen3_4b_grpo_bench.yaml
# through unirl.tools.bench), then TRL's GRPOTrainer (trl_grpo_compare.py) on the same shapes,
# prompts and lengths: Qwen3-4B shapes (random init), LoRA r64, bf16, 8 prompts x 8 samples,
# prompts of exactly 128 tokens, completions of exactly 256.
#
#   bash examples/benchmarks/llm_bench.sh OUT_DIR
#
# Needs the project's wheels and TRL's (trl_wheels.sh) installed into /tmp/site first:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl
# Writes 7 files to OUT_DIR (scratch: $WORK, default a new /tmp/llm_bench_work.*):
#   unirl.json trl.json summary.json unirl.log trl.log unirl_metrics.jsonl env.txt
# A CPU smoke run (tiny preset, tiny shapes; TRL's wheels on PYTHONPATH):
#   DEVICE=cpu PRESET=tiny PROMPT_TOKENS=16 NEW_TOKENS=8 PROMPTS=2 SPP=4 MICRO=4 ITERS=1 \
#     bash examples/benchmarks/llm_bench.sh /tmp/llm_bench_cpu
# The Qwen-VL shape (FAMILY=qwen-vl: examples/vlm/qwen_vl_3b_grpo_bench.yaml, Qwen2.5-VL-3B
# shapes, LoRA r64 on the language model's attention, one seeded 448x448 diagram per prompt from
# make_vl_prompts.py, 128 text tokens + 256 image tokens + the chat turn, 256 generated), and
# its CPU smoke run (both sides, about 2 minutes on 2 cores):
#   FAMILY=qwen-vl DEVICE=cpu PRESET=tiny IMAGE_SIZE=56 PROMPT_TOKENS=16 NEW_TOKENS=8 PROMPTS=2 \
#     SPP=4 MICRO=4 ITERS=1 bash examples/benchmarks/llm_bench.sh /tmp/vl_bench_cpu
# Knobs (environment): FAMILY (qwen3 | qwen-vl), PRESET (qwen3-4b-arch; qwen-vl:
#   qwen2.5-vl-3b-arch), IMAGE_SIZE (qwen-vl: 448), DEVICE (cuda), PROMPT_TOKENS (128; qwen-vl:
#   the text's tokens, the chat turn and image tokens come on top), NEW_TOKENS (256),
#   PROMPTS (8), SPP (8), MICRO (8 samples per micro-batch), WARMUP (1), ITERS (2),
#   FLOPS=1 (count FLOPs / MFU on our side), OURS_TIMEOUT (280 s), TRL_TIMEOUT (220 s),
#   SKIP_OURS=1 / SKIP_TRL=1, OURS_ARGS (more overrides for our recipe, e.g. pipeline.sampler=loop),
#   STOP_FRACTION=p (variable lengths: ids 1..p*V stop a completion on both sides, our
#   StopSetQwen3Bundle and TRL's generation eos ids; each side reports its own mean length;
#   qwen3 only),
#   LIMIT=1 (first run ar_engine_bench.py at the same shape: the card's bandwidth limit for this
#   decode and the fraction of it each side reaches). Exit status: non-zero when either side failed.
set -uo pipefail
out="$(mkdir -p "${1:-outputs/llm_bench}" && cd "${1:-outputs/llm_bench}" && pwd)"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="${WORK:-$(mktemp -d /tmp/llm_bench_work.XXXX)}"
py="${PYTHON:-python3}"
family="${FAMILY:-qwen3}"
image_size="${IMAGE_SIZE:-448}"
case "${family}" in
  qwen3) preset="${PRESET:-qwen3-4b-arch}" recipe=llm/qwen3_4b_grpo_bench vl=() ;;
  qwen-vl) preset="${PRESET:-qwen2.5-vl-3b-arch}" recipe=vlm/qwen_vl_3b_grpo_bench
    vl=(--family qwen-vl --image-size "${image_size}") ;;
  *) echo "[llm_bench] FAMILY=${family}: use qwen3 or qwen-vl" >&2; exit 2 ;;
esac
if [[ "${family}" == qwen-vl && -n "${STOP_FRACTION:-}" ]]; then
  echo "[llm_bench] STOP_FRACTION is for FAMILY=qwen3 (no stop-set Qwen-VL bundle)" >&2; exit 2
fi
prompt_tokens="${PROMPT_TOKENS:-128}"
new_tokens="${NEW_TOKENS:-256}"
prompts="${PROMPTS:-8}"
spp="${SPP:-8}"
micro="${MICRO:-8}"
warmup="${WARMUP:-1}"
iters="${ITERS:-2}"
device="${DEVICE:-cuda}"
precision=()
stops=()
trl_stops=()
if [[ -n "${STOP_FRACTION:-}" ]]; then
  # eager layers: the compiled ones recompile on every new micro-batch width (measured in
  # docs/performance.md: 1,521 against 7,140 trained tokens/s)
  stops=(bundle._target_=unirl.tools.fixed_length.StopSetQwen3Bundle
    "+bundle.stop_fraction=${STOP_FRACTION}" backend.fsdp.compile=false)
  trl_stops=(--stop-fraction "${STOP_FRACTION}")
fi
[[ "${device}" == cpu ]] && precision=(bundle.dtype=fp32 backend.param_dtype=fp32)
export PYTHONPATH="${repo}:/tmp/site${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
cd "${repo}"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "${py}" -c 'import sys, importlib.metadata as m
print("python", sys.version.split()[0])
for n in ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "pyarrow", "pandas",
          "dill", "multiprocess", "huggingface_hub", "tokenizers", "ray"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        print(n, "MISSING")'
} >"${out}/env.txt" 2>&1
cat "${out}/env.txt"

# 1. the prompts: exactly PROMPT_TOKENS tokens with the preset's tokenizer (both sides use it);
# qwen-vl: the text's tokens, plus one seeded diagram per prompt (the whole prompt's length,
# chat turn and image tokens included, sizes our micro-batches)
sample_prompt_tokens="${prompt_tokens}"
ours_vl=()
if [[ "${family}" == qwen-vl ]]; then
  made="$("${py}" examples/benchmarks/make_vl_prompts.py --preset "${preset}" \
    --tokens "${prompt_tokens}" --count "${prompts}" --image-size "${image_size}" \
    --out "${work}/prompts.jsonl")" || exit 1
  echo "${made}"
  sample_prompt_tokens="$(echo "${made}" | "${py}" -c \
    'import json, sys; print(json.loads(sys.stdin.read())["prompt_tokens_per_sample"])')"
  ours_vl=(bundle.image_size="${image_size}")
else
  "${py}" examples/benchmarks/make_fixed_prompts.py --preset "${preset}" \
    --tokens "${prompt_tokens}" --count "${prompts}" --out "${work}/prompts.jsonl" || exit 1
fi

rm -f "${out}/unirl.json" "${out}/trl.json" "${out}/summary.json" "${out}/engine.json"
status=0
# 0. the bandwidth limit of this decode on this card (and the engine alone, for reference)
if [[ -n "${LIMIT:-}" ]]; then
  timeout -k 20 240 "${py}" examples/benchmarks/ar_engine_bench.py --preset "${preset}" "${vl[@]}" \
    --device "${device}" --prompts "${prompts}" --spp "${spp}" --prompt-tokens "${prompt_tokens}" \
    --new-tokens "${new_tokens}" --modes merged,fused --iters 2 --json "${out}/engine.json" \
    ${STOP_FRACTION:+--stop-fraction "${STOP_FRACTION}"} \
    2>&1 | tail -4
fi
# 2. ours: the recipe through the benchmark CLI
if [[ -z "${SKIP_OURS:-}" ]]; then
  flops=(--no-flops)
  [[ -n "${FLOPS:-}" ]] && flops=()
  PRETRAINED_MODEL="${preset}" timeout -k 20 "${OURS_TIMEOUT:-280}" "${py}" -m unirl.tools.bench \
    --config-name="${recipe}" --warmup "${warmup}" --iters "${iters}" "${flops[@]}" \
    --json "${out}/unirl.json" output_dir="${work}/unirl" device="${device}" "${precision[@]}" \
    data_source.path="${work}/prompts.jsonl" batch_size="${prompts}" \
    sampling.samples_per_prompt="${spp}" sampling.max_new_tokens="${new_tokens}" \
    stack.max_tokens_per_micro_batch="$((micro * (sample_prompt_tokens + new_tokens)))" \
    "${ours_vl[@]}" "${stops[@]}" ${OURS_ARGS:-} 2>&1 | tee "${out}/unirl.log"
  rc=${PIPESTATUS[0]}
  cp "${work}/unirl/metrics.jsonl" "${out}/unirl_metrics.jsonl" 2>/dev/null || true
  if [[ ${rc} -ne 0 ]]; then
    echo "[llm_bench] ours failed (exit ${rc})"
    status=1
    # a run cut by the timeout leaves its Ray processes (and their GPU memory) behind; on the
    # GPU machine this script's run is the only Ray user (never do this on a shared host)
    if [[ ${rc} -ge 124 && "${device}" == cuda* ]]; then
      "${py}" -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
    fi
  fi
fi

# 3. TRL's GRPOTrainer on the same prompts, tokenizer and lengths
if [[ -z "${SKIP_TRL:-}" ]]; then
  timeout -k 20 "${TRL_TIMEOUT:-220}" "${py}" examples/benchmarks/trl_grpo_compare.py \
    --preset "${preset}" "${vl[@]}" --prompts "${work}/prompts.jsonl" \
    --max-new-tokens "${new_tokens}" --samples-per-prompt "${spp}" --micro-batch "${micro}" \
    --lora-rank 64 --lora-alpha 128 --warmup "${warmup}" --iters "${iters}" --device "${device}" \
    "${trl_stops[@]}" --json "${out}/trl.json" 2>&1 | tee "${out}/trl.log"
  rc=${PIPESTATUS[0]}
  [[ ${rc} -ne 0 ]] && echo "[llm_bench] TRL failed (exit ${rc})" && status=1
fi

# 4. side by side
"${py}" - "${out}" <<'PY'
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.exists() else None

ours, trl, engine = load("unirl.json"), load("trl.json"), load("engine.json")
limit = None
if engine:
    limit = next((r.get("limit_tokens_per_s") for r in engine["rows"].values()), None)
log = out / "unirl.log"
found = re.search(r"trainable parameters: ([\d,]+)", log.read_text()) if log.exists() else None
rows = {}
if ours:
    ph = ours["seconds_per_phase"]
    rows["unirl"] = {
        "device": ours["device"],
        "prompt_tokens_per_sample": ours["prompt_tokens_per_sample"],
        "generated_tokens_per_sample": ours["generated_tokens_per_sample"],
        "generated_tokens_per_s": ours["generated_tokens_per_s"],
        "trained_tokens_per_s": ours["trained_tokens_per_s"],
        "trained_tokens_per_s_without_old_logp": ours["trained_tokens_per_s_without_old_logp"],
        "samples_per_s": ours["samples_per_s"],
        "rollout_s": ph["rollout"], "reward_s": ph["reward"], "old_logp_s": ph["old_logp"],
        "train_s": ph["train"], "step_s": ph["total"],
        "peak_memory_gib": max(ours.get("peak_memory_gib") or [0.0]),
        "trainable_params": int(found.group(1).replace(",", "")) if found else None,
    }
if trl:
    ph = trl["seconds_per_phase"]
    rows["trl"] = {
        "device": trl["device"],
        "prompt_tokens_per_sample": trl["prompt_tokens_per_sample"],
        "generated_tokens_per_sample": trl["generated_tokens_per_sample"],
        "generated_tokens_per_s": trl["generated_tokens_per_s"],
        "trained_tokens_per_s": trl["trained_tokens_per_s"],
        "trained_tokens_per_s_without_old_logp": trl["trained_tokens_per_s"],
        "samples_per_s": trl["samples_per_s"],
        "rollout_s": ph["generate"], "reward_s": ph["score"], "old_logp_s": 0.0,
        "train_s": ph["train"], "step_s": ph["total"],
        "peak_memory_gib": trl["peak_memory_gib"],
        "trainable_params": trl["trainable_params"],
    }
if limit:
    for r in rows.values():
        r["fraction_of_bandwidth_limit"] = r["generated_tokens_per_s"] / limit
summary = {"rows": rows, "limit_tokens_per_s": limit}
if len(rows) == 2:
    a, b = rows["unirl"], rows["trl"]
    summary["same_shapes"] = all(
        a[k] == b[k]
        for k in ("prompt_tokens_per_sample", "generated_tokens_per_sample", "trainable_params")
    )
    summary["unirl_over_trl"] = {
        k: (a[k] / b[k] if b[k] else None)
        for k in ("generated_tokens_per_s", "trained_tokens_per_s", "samples_per_s")
    }
(out / "summary.json").write_text(json.dumps(summary, indent=2))
keys = list(next(iter(rows.values()))) if rows else []
print("\n| metric | " + " | ".join(rows) + " |\n|---|" + "---|" * len(rows))
for k in keys:
    cells = [f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for r in rows.values()]
    print(f"| {k} | " + " | ".join(cells) + " |")
print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
PY
exit ${status}
