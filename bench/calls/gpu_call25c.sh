#!/usr/bin/env bash
# One device call (twenty-fifth session, issues 15 and 14): the 125M 2k / B=16 train step in tokens per second at this
# tree (bench/train_throughput.py, NSA and dense in one process); then the NSA decode step at 8k and 128k, B=8, each
# profiled (bench/decode.py --profile), to name what grows with the context.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 300 python3 bench/train_throughput.py --no-loader --models nsa_125m dense_125m \
  --points 2048:16 --steps 8 --out "$OUT/train_2k.json" > "$OUT/train.log" 2>&1 || rc=1
tail -4 "$OUT/train.log"; echo "train done at ${SECONDS}s"
PYTHONPATH=. timeout $((590 - SECONDS)) python3 bench/decode.py --models nsa_125m --contexts 8192 131072 \
  --batches 8 --reps 30 --profile 8192:8 131072:8 --out "$OUT/decode.json" > "$OUT/decode.log" 2>&1 || rc=1
grep -vE "^\s*$" "$OUT/decode.log" | tail -30
exit $rc
