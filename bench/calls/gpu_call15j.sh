#!/usr/bin/env bash
# One device call (fifteenth session, final tree, part 1 of 2; needs an H200: the 128k / B=64 decode step
# does not fit 80 GB): GPU tests (decode; the bf16 selection path against the float32 reference at bench
# 8192 with this session's tiles and at 125M 1027; the query forward + fused dQ pair); the decode step at
# 128k / B=64 and 64k / B=8, NSA and dense, with a profiled loop call (issue 14).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout ${TEST_S:-240} python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  tests/test_pallas_gpu.py -k "test_decode or bench-8192 or 125m-1027 or sel_dq_block_with_query" \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
[[ ${1:-} == tests ]] && exit $rc
PYTHONPATH=. timeout 160 python3 bench/decode.py --contexts 131072 --batches 64 --reps 20 \
  --profile 131072:64 --out "$OUT/dec_128k.json" > "$OUT/dec_128k.log" 2>&1 || rc=1
PYTHONPATH=. timeout 120 python3 bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/dec_64k.json" > "$OUT/dec_64k.log" 2>&1 || rc=1
grep -hE "^(nsa|dense)_125m|loop profile|Error" "$OUT/dec_128k.log" "$OUT/dec_64k.log"
exit $rc
