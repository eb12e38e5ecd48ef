#!/usr/bin/env bash
# One device call (thirtieth session, issue 14): the scoring kernel's chunk top-n as a radix select
# (decode_select._chunk_winners) against the rank count it replaced. GPU decode tests (incl. the compiled select on
# chunks built to tie), then bench/decode_kernels.py (one cache set per layer) for the tree before (.old/pre30,
# carried) and this tree with the select's bits per round and the scoring warps varied.
#   bash bench/calls/gpu_call30a.sh .old/pre30
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
OLD=${1:-.old/pre30}; t0=$SECONDS; rc=0; log="$OUT/run.log"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
timeout 170 python3 -m pytest -q -m gpu tests/test_decode.py tests/test_pallas_decode_select.py \
  > "$OUT/tests.log" 2>&1 || rc=1
tail -1 "$OUT/tests.log" | tee -a "$log"; echo "tests: $((SECONDS - t0)) s" | tee -a "$log"
PTS="131072:64 32768:64 131072:8 65536:8 65536:1 8192:64"
PYTHONPATH=. timeout 120 python3 bench/decode_kernels.py --tree "$OLD" --points $PTS --variants default \
  --out "$OUT/kern_before.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
PYTHONPATH=. timeout 260 python3 bench/decode_kernels.py --points $PTS \
  --variants default topn_bits=1 topn_bits=4 score_warps=2 score_warps=4 \
  --out "$OUT/kern_after.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
