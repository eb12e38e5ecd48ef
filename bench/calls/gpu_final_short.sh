#!/usr/bin/env bash
# One device call (issues 15/16, 2026-11-23 fourth session): 125M training tok/s at 8k (B=4)
# and 2k (B=16), NSA vs dense in the same call, with the final defaults (sel_partial_mib 1024:
# one slot pass at 8k), and the packed vs unpacked NSA op at 8k and 64k (bench/packed.py).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
LOG="$OUT/call.log"; rc=0
timeout 290 python3 bench/train_throughput.py --no-loader --points 8192:4 2048:16 --steps 8 \
  --out "$OUT/train_throughput_h200x1_8k2k.json" >> "$LOG" 2>&1 || rc=1
timeout 150 python3 bench/packed.py --T 8192 65536 --reps 20 --attention nsa \
  > "$OUT/packed.jsonl" 2>> "$LOG" || rc=1
grep speed "$OUT/packed.jsonl"
grep -E "^(model|nsa_125m|dense_125m) " "$LOG"
exit $rc
