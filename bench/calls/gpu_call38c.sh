#!/usr/bin/env bash
# One device call (thirty-eighth session, issue 15): the 125M 8k / B=4 train step of NSA and dense in one process
# (bench/train_throughput.py --steps 8) at this tree (512-query block-major items, the faster scoring kernel).
#   bash bench/calls/gpu_call38c.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
PYTHONPATH=. timeout ${TRAIN_S:-300} python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
  --models nsa_125m dense_125m --points 8192:4 --steps 8 --out "$OUT/train_8192.json" > "$OUT/train_8192.log" 2>&1 || rc=1
grep -E "^(model|nsa|dense)" "$OUT/train_8192.log" | cut -c1-200
exit $rc
