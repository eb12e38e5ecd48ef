#!/usr/bin/env bash
# One device call (seventeenth session, last): the final tree's GPU top-n tests (the compiled kernel against
# lax.top_k's rule at 64k) and the 125M training pair at 2k / B=16 (NSA and dense in one process), the point
# call 2 could not fit.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 150 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py -k "topn_compiled" \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
timeout 300 python3 bench/train_throughput.py --no-loader --points 2048:16 --steps 8 \
  --out "$OUT/train_2k.json" > "$OUT/train.log" 2>&1 || rc=1
grep -A4 "^model" "$OUT/train.log"
exit $rc
