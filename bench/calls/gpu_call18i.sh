#!/usr/bin/env bash
# One device call (eighteenth session, after the last read of the change): GPU parity of the query-major
# selection kernels (now sharing _key_mask with the dQ-from-dS kernel): bf16 vs the float32 reference at bench
# 8192 (defaults), float32 under both precisions, "ds" and "block" with the per-query forward.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 400 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "bench-8192 or f32_matches or sel_dq_with_query" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
exit $rc
