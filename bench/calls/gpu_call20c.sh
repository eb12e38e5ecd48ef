#!/usr/bin/env bash
# One device call (twentieth session, issue 14) on an H200 (needs_h200: the 128k / B=64 NSA point does not fit
# an H100's 78 GiB): bench/decode.py at this tree over contexts 8k, 64k, 128k x batches 1, 8, 64, NSA and dense
# in one process (the targets: 4x at 64k / B=8, 8x at 128k / B=64, growth from 8k to 128k).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 570 python3 bench/decode.py --contexts 8192 65536 131072 --batches 1 8 64 --reps 20 \
  --out "$OUT/grid20.json" > "$OUT/grid20.log" 2>&1; rc=$?
grep -E "N= *[0-9]+ B=|Error|failed|^ +[0-9]+ +[0-9]+ " "$OUT/grid20.log" | tail -n 40
exit $rc
