#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): GPU parity after the 64-row block-major forward became the
# default for bf16 64-wide heads (h <= 8): bf16 vs the float32 reference through the whole op (125M and bench
# shapes; the 125M 8k case runs the block-major kernels), and the tiled kernels.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 400 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "bf16_matches_f32_reference" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
exit $rc
