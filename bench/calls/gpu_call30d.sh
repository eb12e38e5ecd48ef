#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): the local kernels at win_warps = 4 for 128-wide heads. GPU parity of
# the Pallas window and the packed paths (bf16 against the float32 reference), the packed window at the bench shape
# with the new default against the old warps (win_warps=8), and the dense causal probe at the bench heads again.
#   bash bench/calls/gpu_call30d.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
timeout 240 python3 -m pytest -q -m gpu -W ignore::DeprecationWarning tests/test_pallas_gpu.py \
  -k "window or dense_packed_pallas or packed_bf16" > "$OUT/tests.log" 2>&1 || rc=1
tail -1 "$OUT/tests.log" | tee -a "$log"; echo "tests: $((SECONDS - t0)) s" | tee -a "$log"
PYTHONPATH=. timeout 150 python3 -W ignore::DeprecationWarning bench/window_tiles.py --shape bench --T 65536 \
  --variants default win_warps=8 > "$OUT/tiles.log" 2>&1 || rc=1
grep '^{"variant' "$OUT/tiles.log" | tee -a "$log"
PYTHONPATH=. timeout 150 python3 -W ignore::DeprecationWarning bench/mgpu_probe.py --shapes bench:1:16384 \
  --out "$OUT/mgpu_probe.json" 2>/dev/null | tee -a "$log" || rc=1
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
