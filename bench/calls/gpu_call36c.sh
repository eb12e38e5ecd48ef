#!/usr/bin/env bash
# One device call (thirty-sixth session, issue 15): the 125M 8k / B=4 train step of NSA and dense in one process
# (bench/train_throughput.py --steps 8), with the time call 2 (gpu_call36b.sh) did not give dense.
#   bash bench/calls/gpu_call36c.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
PYTHONPATH=. timeout 400 python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
  --models nsa_125m dense_125m --points 8192:4 --steps 8 --out "$OUT/train.json" > "$OUT/train.log" 2>&1 || rc=1
echo "train done at ${SECONDS}s (rc=$rc)"
grep -E "^(model|nsa|dense)" "$OUT/train.log" | cut -c1-200
exit $rc
