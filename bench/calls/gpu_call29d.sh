#!/usr/bin/env bash
# One device call (twenty-ninth session, issue 14): GPU decode tests at this tree; then the decode kernels with one
# cache set per layer (bench/decode_kernels.py's new default: the caches a step reads, not one L2-resident set),
# against the old single-set harness (--distinct 1) at the defaults, and the compressed kernel's splits and the
# scoring kernel's warps swept again under the new harness.
#   bash bench/calls/gpu_call29d.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92   # 12 cache sets at 128k / B=64: ~55 GB
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
timeout 150 python3 -m pytest -q -m gpu tests/test_decode.py tests/test_pallas_decode_select.py \
  tests/test_decode_dense.py > "$OUT/tests.log" 2>&1 || rc=1
tail -1 "$OUT/tests.log" | tee -a "$log"; echo "tests: $((SECONDS - t0)) s" | tee -a "$log"
PTS="131072:64 65536:64 32768:64 8192:64 131072:8 65536:8 65536:1"
PYTHONPATH=. timeout 60 python3 bench/decode_kernels.py --points $PTS --distinct 1 \
  --out "$OUT/kern_one_set.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
echo "one set: $((SECONDS - t0)) s" | tee -a "$log"
left=$((575 - (SECONDS - t0)))
PYTHONPATH=. timeout "$left" python3 bench/decode_kernels.py --points $PTS \
  --variants default splits=32 splits=64 score_warps=2 score_warps=4 score_warps=8 \
  --out "$OUT/kern_sets.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
echo "sets: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
