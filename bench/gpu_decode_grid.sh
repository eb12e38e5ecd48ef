#!/usr/bin/env bash
# One device call (issue 14): bench/decode.py over the given contexts x batches 1 8 32 64 for both
# 125M models, so the README grid is of the current decode path. The full grid does not fit one
# call's 10 minutes, so it runs as two calls (e.g. `8192 32768`, then `65536 131072`) and
# bench/decode_merge.py joins their JSON.
#   bash bench/gpu_decode_grid.sh 8192 32768
set -u
OUT=${OUT:-/tmp/nsa_decode_grid}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
tag=$(echo "$@" | tr ' ' '_')
timeout 580 python3 bench/decode.py --contexts "$@" --batches 1 8 32 64 \
  --out "$OUT/grid_${tag}.json" > "$OUT/grid_${tag}.log" 2>&1; rc=$?
grep -E "N= *[0-9]+ B=|Error|failed" "$OUT/grid_${tag}.log" | tail -n 40
exit $rc
