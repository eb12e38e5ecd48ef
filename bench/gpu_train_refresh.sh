#!/usr/bin/env bash
# One device call: 125M training tok/s of NSA and dense at the given points, one process per point
# (a 64k pair took ~2 min in a fresh process on an H200, an 8k or 2k pair ~1.5 min; on a fresh H100 in the
# seventeenth session an NSA point alone took ~2.5 min, ~100 s of it outside the step's compile), so a call
# of 10 minutes holds 2-4 points. Refreshes the README's training table point by point; JSON per point under $OUT.
# Usage: bash bench/gpu_train_refresh.sh "65536:1 8192:4" [per-point timeout s, default 170]
set -u
OUT=${OUT:-/tmp/nsa_train_refresh}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
POINTS=${1:-"65536:1"}; LIMIT=${2:-170}; LOG="$OUT/train_refresh.log"; rc=0
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -d ' ')
for p in $POINTS; do
  timeout "$LIMIT" python3 bench/train_throughput.py --no-loader --points "$p" --steps 8 \
    --out "$OUT/train_${dev}_$(echo "$p" | tr : x).json" >> "$LOG" 2>&1 || rc=1
done
echo "device $dev"
grep -E "^\{" "$LOG" | python3 -c '
import json, sys
for r in map(json.loads, sys.stdin):
    print("%10s T=%6d B=%2d %8.1f ms %10.0f tok/s peak %.3f GB" % (r["model"], r["seq_len"],
          r["batch"], r["step_ms"], r["tokens_per_s"], r.get("compiled_peak_gb") or 0))'
exit $rc
