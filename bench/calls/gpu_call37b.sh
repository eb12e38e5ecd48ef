#!/usr/bin/env bash
# One device call (thirty-seventh session, issue 15), after the block-major kernels' shorter loops: the 125M 8k / B=4
# train step of NSA and dense in one process (bench/train_throughput.py --steps 8), then the bench-shape op at 64k,
# this tree against $1 (.old/s37, the session's start) one process each (bench/ab_op.sh): the inverted dK/dV kernel's
# one-compare mask reaches that shape.
#   bash bench/calls/gpu_call37b.sh .old/s37
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
base=${1:-.old/s37}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
PYTHONPATH=. timeout 210 python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
  --models nsa_125m dense_125m --points 8192:4 --steps 8 --out "$OUT/train_8192.json" > "$OUT/train_8192.log" 2>&1 || rc=1
echo "train 8192 done at ${SECONDS}s (rc=$rc)"
grep -E "^(model|nsa|dense)" "$OUT/train_8192.log" | cut -c1-200
left=$((570 - SECONDS))
mkdir -p "$OUT/bench_ab"; OUT="$OUT/bench_ab" bash bench/ab_op.sh "$base" bench:65536:1 "$left" 1 || rc=1
exit $rc
