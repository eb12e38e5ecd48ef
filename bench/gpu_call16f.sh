#!/usr/bin/env bash
# One device call (sixteenth session, final tree): GPU parity of the gather path (the flat index sort), then
# the peers table at the bench shape, 64k (bench/peers.py; carry .whl with fla-core and .peers/xunhao).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout ${TEST_S:-200} python3 -P -m pytest -q -p no:xdist -m gpu -rfE \
  tests/test_pallas_gpu.py -k "bench-8192 or f32_matches or sel_dq_block_with_query" \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 330 python3 -P bench/peers.py --shapes bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 22
exit $rc
