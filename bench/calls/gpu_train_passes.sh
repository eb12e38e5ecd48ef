#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 fourth session): 125M training tok/s, NSA vs dense in
# the same call at 64k (B=1) and 8k (B=4) with this session's defaults (top-n buckets, scoring
# mask skip, slot passes at 512 MiB), and NSA at 64k with 2 slot passes (1024 MiB).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
LOG="$OUT/call.log"; rc=0
timeout 330 python3 bench/train_throughput.py --no-loader --points 65536:1 8192:4 --steps 8 \
  --out "$OUT/train_throughput_h200x1.json" >> "$LOG" 2>&1 || rc=1
timeout 150 python3 bench/train_throughput.py --no-loader --models nsa_125m --points 65536:1 \
  --steps 8 --override exec.kernel.sel_partial_mib=1024 \
  --out "$OUT/train_throughput_h200x1_mib1024.json" >> "$LOG" 2>&1 || rc=1
grep -E "^(model|nsa_125m|dense_125m) " "$LOG"
exit $rc
