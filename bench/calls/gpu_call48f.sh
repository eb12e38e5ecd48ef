#!/usr/bin/env bash
# One device call (forty-eighth session, call 6): bench/chunked_prefill.py for dense_125m at 64k with the local forward's
# unmasked full tiles (call 5's step for it ran out of time).
#   bash bench/calls/gpu_call48f.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0
timeout "${BENCH_S:-200}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models dense_125m --lengths 65536 \
  --chunks 4096 16384 --reps 3 --out "$OUT/chunked_dense.json" > "$OUT/chunked.log" 2>&1 || rc=1
tail -6 "$OUT/chunked.log"
echo "done: $((SECONDS - t0)) s"
exit $rc
