#!/usr/bin/env bash
# One device call (thirteenth session, issue 14): GPU decode tests (both chunk top-n forms), then the
# decode kernels alone (bench/decode_kernels.py) at 128k/B=64 and 64k/B=8 under variants of the scoring
# kernel (sel_rank count / rounds, score_warps, sel_chunk). JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
VARS=${1:-"default score_warps=2 sel_rank=rounds sel_rank=rounds,score_warps=1 sel_rank=rounds,score_warps=2 sel_rank=rounds,score_warps=1,sel_chunk=256 sel_rank=rounds,score_warps=1,sel_chunk=64"}
timeout 300 python3 bench/decode_kernels.py --points 131072:64 65536:8 --variants $VARS \
  --out "$OUT/kern.json" > "$OUT/kern.log" 2>&1 || rc=1
grep -E "N=" "$OUT/kern.log"
exit $rc
