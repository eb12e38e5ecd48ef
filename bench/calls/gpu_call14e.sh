#!/usr/bin/env bash
# One device call (fourteenth session, last): GPU tests of the final tree (decode; the bf16 selection path
# against the float32 reference, bench 8192 = the per-query kernels, 125M 1027); the decode step at
# 128k/B=64 with a profiled loop call inside the caches (bench/decode.py's room check), NSA and dense.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  tests/test_pallas_gpu.py -k "test_decode or bench-8192 or 125m-1027" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts 131072 --batches 64 --reps 20 \
  --profile 131072:64 --out "$OUT/dec_final.json" > "$OUT/dec_final.log" 2>&1 || rc=1
grep -E "^(nsa|dense)_125m|loop profile|Error" "$OUT/dec_final.log"
exit $rc
