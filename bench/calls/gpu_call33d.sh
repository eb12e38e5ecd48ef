#!/usr/bin/env bash
# One device call (thirty-third session, issue 15): the 125M train step at 2k / B=16, NSA (default: the Mosaic GPU
# dK/dV) and dense, one process each (bench/train_throughput.py, 8 timed steps), only on an H200 (the rows are
# H200 rows; this point was last measured on one in the twenty-seventh session, before the Mosaic GPU kernels).
#   bash bench/calls/gpu_call33d.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$card" | tee "$log"
case "$card" in *H200*) ;; *) echo "not an H200: nothing run" | tee -a "$log"; exit 0;; esac
for model in nsa_125m dense_125m; do
  left=$((590 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/train_throughput.py --points 2048:16 \
    --models $model --steps 8 --no-loader --out "$OUT/train_$model.json" 2>&1 \
    | grep -E "^nsa|^dense|rror" | grep -v "^WARNING" | tee -a "$log" || rc=1
  echo "  ($model done at $((SECONDS - t0)) s)" | tee -a "$log"
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
