#!/usr/bin/env bash
# One device call (sixteenth session, final tree): GPU parity of the gather path (the flat index sort), then
# the peers table at the bench shape, 64k (bench/peers.py; carry .whl with fla-core and .peers/xunhao).
# (As run, the peers lines were inline here; they were moved unchanged into bench/peers_run.sh afterwards.)
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout ${TEST_S:-200} python3 -P -m pytest -q -p no:xdist -m gpu -rfE \
  tests/test_pallas_gpu.py -k "bench-8192 or f32_matches or sel_dq_block_with_query" \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
source bench/peers_run.sh
exit $rc
