#!/usr/bin/env bash
# One device call (issue 15, seventh session): 125M training tok/s NSA vs dense in the same call at
# 2k (B=16), 8k (B=4) and 64k (B=1), after the gate-gradient change. JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_train7}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
LOG="$OUT/train7.log"; rc=0
timeout 560 python3 bench/train_throughput.py --no-loader --points 2048:16 8192:4 65536:1 \
  --steps 8 --out "$OUT/train_throughput_h200x1_2026-11-23g.json" >> "$LOG" 2>&1 || rc=1
grep -E "^(model|nsa_125m|dense_125m) " "$LOG"
exit $rc
