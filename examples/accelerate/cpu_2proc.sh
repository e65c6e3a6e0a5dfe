#!/usr/bin/env bash
# Two gloo processes on CPU (what the test suite runs). `use_cpu` makes both ranks join one process group;
# without it each rank would silently train alone on the full data.
set -euo pipefail
torchrun --nproc_per_node 2 -m hf_cocodr finetune --use_cpu "$@"
# or: accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no \
#       -m hf_cocodr finetune --use_cpu "$@"
