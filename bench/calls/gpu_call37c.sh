#!/usr/bin/env bash
# One device call (thirty-seventh session, issue 15): the 125M 64k / B=1 train step of NSA and dense in one process
# (bench/train_throughput.py --steps 8) after the block-major kernels' shorter loops: the met 64k target (>= 2.5x,
# peak <= 26.8 GB) checked after the change.
#   bash bench/calls/gpu_call37c.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
PYTHONPATH=. timeout "${TRAIN_S:-560}" python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
  --models nsa_125m dense_125m --points 65536:1 --steps 8 --out "$OUT/train.json" > "$OUT/train.log" 2>&1 || rc=1
echo "train done at ${SECONDS}s (rc=$rc)"
grep -E "^(model|nsa|dense)" "$OUT/train.log" | cut -c1-200
exit $rc
