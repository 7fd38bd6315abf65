#!/usr/bin/env bash
# The Python 3.12 wheels that TRL's GRPOTrainer (examples/benchmarks/trl_grpo_compare.py)
# needs on the GPU machine beyond its image and the project's own wheels
# (../shared/tools/device-wheels.sh): the image already has torch, transformers, peft,
# accelerate, huggingface_hub, pandas, pyarrow, xxhash, psutil, pyyaml, jinja2, requests, tqdm
# and fsspec, which are the rest of what trl 1.16.0 and datasets 5.2.0 import. The Qwen-VL side
# (--family qwen-vl) adds only pillow (in the image: datasets' Image column, the PIL image
# processor transformers falls back to without torchvision) and no video processor.
#
#   bash examples/benchmarks/trl_wheels.sh [DEST]        # DEST defaults to ./.whl
#
#   trl 1.16.0          py3-none-any   (needs accelerate>=1.10.1, datasets>=4.7.0, transformers>=4.56.2)
#   datasets 5.2.0      py3-none-any   (needs dill<0.4.2, multiprocess<0.70.20, pyarrow, huggingface-hub>=1.31)
#   dill 0.4.1          py3-none-any
#   multiprocess 0.70.19 py312-none-any
#
# About 1.9 MB together. Install on the GPU machine with the others:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$dest" \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ls -l "$dest"/trl-*.whl "$dest"/datasets-*.whl "$dest"/dill-*.whl "$dest"/multiprocess-*.whl
