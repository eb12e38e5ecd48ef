#!/usr/bin/env bash
# One device call (issue 14, eleventh session): GPU decode tests, then the decode kernels alone per
# tile / pipeline variant of the compressed kernel (bench/decode_kernels.py) at 128k/B=64 and
# 64k/B=8. Usage: bash bench/calls/gpu_decode11.sh "variant ..."; JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
VARS=${1:-"default cmp_stages=3 cmp_stages=4 cmp_keys=128 cmp_keys=128,cmp_stages=3 cmp_keys=32,cmp_stages=4"}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
timeout 300 python3 bench/decode_kernels.py --points 131072:64 65536:8 --variants $VARS \
  --out "$OUT/decode_kernels.json" > "$OUT/kernels.log" 2>&1 || rc=1
grep -v "^{" "$OUT/kernels.log" | tail -n 30
exit $rc
