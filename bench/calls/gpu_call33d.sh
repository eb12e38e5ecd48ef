#!/usr/bin/env bash
# One device call (thirty-third session, issue 15): (1) GPU parity of the fused block-major backward with dQ summed by
# float32 atomic adds (sel_dq_sum=atomic); (2) the tiled backends at 2k / B=16 for h = 2, 4, 6 at 64-wide heads, all
# four backend mixes (call 2: the default mix 34% behind at h = 2); (3) the tiled / gather crossover at 128-wide heads
# (8k, 16k); (4) sel_dq_sum=atomic against the default at the 125M heads, 8k / B=4 and 64k / B=1.
#   bash bench/calls/gpu_call33d.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 150 python3 -m pytest -q -m gpu tests/test_pallas_gpu.py -k sel_dq_atomic -p no:cacheprovider \
  -W ignore::DeprecationWarning 2>&1 | grep -E "passed|failed|rror|rrmse|assert" | tail -8 | tee -a "$log" || rc=1
echo "  (tests done at $((SECONDS - t0)) s)" | tee -a "$log"
audit() {  # name, then shape_audit arguments
  local name=$1; shift
  left=$((585 - (SECONDS - t0))); [ "$left" -lt 40 ] && { echo "skipped $name: no time" | tee -a "$log"; return; }
  PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/shape_audit.py --reps 10 \
    --out "$OUT/audit_$name.json" "$@" 2>&1 | grep -v "^WARNING" | tee -a "$log" || rc=1
  echo "  ($name done at $((SECONDS - t0)) s)" | tee -a "$log"
}
audit mix --heads 16/8/64 12/2/64 16/4/64 --points 2048:16 --variants default \
  all_mosaic:sel_tiled_fwd=mosaic,sel_tiled_dq=mosaic all_triton:sel_tiled_dkv=triton \
  mosaic_fwd_dq:sel_tiled_fwd=mosaic,sel_tiled_dq=mosaic,sel_tiled_dkv=triton
audit dq_sum --heads 12/2/64 --points 8192:4 65536:1 --variants default atomic:sel_dq_sum=atomic
audit cross --heads 32/8/128 8/2/128 --points 8192:4 16384:2 --variants default tiled:sel_impl=tiled
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
