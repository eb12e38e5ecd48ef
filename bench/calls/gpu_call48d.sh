#!/usr/bin/env bash
# One device call (forty-eighth session, call 4): bench/chunk_tiles.py, the continuation chunk's kernels under several
# tile settings (one layer, 64k cache, C = 16,384 at start 49,152).
#   bash bench/calls/gpu_call48d.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${BENCH_S:-300}" env PYTHONPATH=. python3 bench/chunk_tiles.py --out "$OUT/chunk_tiles.json" >> "$log" 2>&1 \
  || rc=1
tail -16 "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
