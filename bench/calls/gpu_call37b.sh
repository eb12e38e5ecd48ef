#!/usr/bin/env bash
# One device call (thirty-seventh session, issue 15): the 125M train steps after the block-major kernels' shorter loops,
# NSA and dense in one process per point (bench/train_throughput.py --steps 8): 8k / B=4, then 64k / B=1.
#   bash bench/calls/gpu_call37b.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
for pt in 8192:4:200 65536:1:330; do
  IFS=: read -r T B secs <<< "$pt"
  PYTHONPATH=. timeout "$secs" python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
    --models nsa_125m dense_125m --points "$T:$B" --steps 8 --out "$OUT/train_$T.json" > "$OUT/train_$T.log" 2>&1 || rc=1
  echo "train $T done at ${SECONDS}s (rc=$rc)"
  grep -E "^(model|nsa|dense)" "$OUT/train_$T.log" | cut -c1-200
done
exit $rc
