#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): the decode grid's B = 1 and 8 rows at 8k, 32k and 128k again, now
# that dense's Pallas step has NSA's projection and RoPE treatment (call 5: dense -5% at 64k / B=8, -12.5% at B=1).
# NSA and dense in one process per batch.
#   bash bench/calls/gpu_call44f.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for b in 8 1; do
  PYTHONPATH=. timeout 130 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 8192 32768 131072 \
    --batches $b --reps 30 --out "$OUT/grid_b$b.json" > "$OUT/grid_b$b.log" 2>&1 || rc=1
  grep -E "^(nsa|dense)_125m" "$OUT/grid_b$b.log" | tee -a "$log"
  echo "  (B=$b done at $((SECONDS - t0)) s)" | tee -a "$log"
done
exit $rc
