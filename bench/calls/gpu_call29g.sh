#!/usr/bin/env bash
# One device call (twenty-ninth session, issue 14): the selected + window kernel's units per program (slc_per) and the
# top-n merge tile swept again under bench/decode_kernels.py's one-cache-set-per-layer harness (both were chosen on
# the old single-set harness, whose caches the L2 served at B <= 8).
#   bash bench/calls/gpu_call29g.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
PYTHONPATH=. timeout 280 python3 bench/decode_kernels.py --points 131072:64 8192:64 131072:8 65536:8 65536:1 \
  --variants default slc_per=1 slc_per=2 merge_tile=32 merge_tile=128 \
  --out "$OUT/kern_slc.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
