#!/usr/bin/env bash
# One device call (twenty-sixth session, issue 15): the 125M train step at 64k / B=1, 8k / B=4 and 2k / B=16, NSA and
# dense in one process (bench/train_throughput.py --steps 8), a second same-process measurement of the 64k ratio
# after call 3's, and the 8k / 2k points at this tree.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 585 python3 bench/train_throughput.py --no-loader --models nsa_125m dense_125m \
  --points 65536:1 8192:4 2048:16 --steps 8 --out "$OUT/train.json" > "$OUT/train.log" 2>&1 || rc=1
grep -E "^(model|nsa|dense)" "$OUT/train.log"
exit $rc
