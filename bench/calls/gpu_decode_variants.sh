#!/usr/bin/env bash
# One device call (nvidia-h200): the decode kernels alone per tile variant (bench/decode_kernels.py)
# for the tree before the rank-count top-n (.old/pre_decode) and this tree, then this tree's
# whole decode step at 128k/B=64 with a profile. JSON under $OUT, tables last.
set -u
OUT=${OUT:-/tmp/nsa_decode_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
LOG="$OUT/variants.log"
P="65536:1 65536:8 131072:64"
python3 bench/decode_kernels.py --tree .old/pre_decode --points $P --out "$OUT/k_before.json" >> "$LOG" 2>&1
python3 bench/decode_kernels.py --points $P --variants default sel_chunk=32 sel_chunk=128 \
  merge_tile=32 merge_tile=128 --out "$OUT/k_after.json" >> "$LOG" 2>&1
python3 bench/decode_kernels.py --points 131072:64 --variants splits=8 splits=16 splits=32 \
  --out "$OUT/k_after_splits.json" >> "$LOG" 2>&1
python3 bench/decode.py --models nsa_125m --contexts 131072 --batches 64 --profile 131072:64 \
  --out "$OUT/after_128k_profile.json" >> "$LOG" 2>&1
grep -E "Error|error" "$LOG" | tail -n 5
python3 bench/decode_compare.py "$OUT/after_128k_profile.json" --top 14
grep -E "N= *[0-9]+ B=" "$LOG"
