#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): GPU parity of the kernels whose launch changed for 128-wide heads
# (the block-major selection at sel_block_warps = 4; bench shape, forced block-major), bf16 against the float32
# reference. (The tiled and local kernels at 4 warps passed in calls 6 and 8.)
#   bash bench/calls/gpu_call30i.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
timeout 420 python3 -m pytest -q -m gpu tests/test_pallas_gpu.py \
  -k "(sel_fwd_block and bench) or (sel_dq_with and block and bench)" > "$OUT/tests.log" 2>&1 || rc=1
tail -3 "$OUT/tests.log" | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
