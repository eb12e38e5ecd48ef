#!/usr/bin/env bash
# One device call (eighteenth session): the selection kernels on selections that neighbouring queries share
# (bench/sel_locality.py: shared 0 / 0.5 / 0.9 / 1), bench shape, 64k: query-major forward, backward with
# sel_dq "query" and "ds", tiled forward and backward where a tile's union of blocks is <= 128 (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 500 python3 bench/sel_locality.py --shape bench --T 65536 --shared 0 0.5 0.9 1 \
  --max-union 128 --reps 10 --out "$OUT/locality.json" > "$OUT/locality.log" 2>&1 || rc=1
grep -vE "^\s*$" "$OUT/locality.log" | tail -14
exit $rc
