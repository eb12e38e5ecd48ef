#!/usr/bin/env bash
# One device call (eighteenth session, final tree after the review): GPU parity of sel_dq "ds" and "block" with
# the per-query forward; then bench/calls/gpu_call18e.sh (the peers table with our default and "ds" backward;
# on an H200 also the 64k / B=8 decode step). Carry .whl and .peers/xunhao.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "sel_dq_with_query" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
bash bench/calls/gpu_call18e.sh || rc=1
exit $rc
