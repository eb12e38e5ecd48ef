#!/usr/bin/env bash
# One device call (forty-eighth session, call 2): one chunked prefill per 125M model at 64k (C = 16,384) traced with
# jax.profiler, to name where the Pallas continuation chunks' time goes.
#   bash bench/calls/gpu_call48b.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${BENCH_S:-300}" env PYTHONPATH=. python3 bench/chunked_prefill.py --lengths 65536 --chunks 16384 \
  --reps 1 --profile --out "$OUT/chunked_prefill_profile.json" >> "$log" 2>&1 || rc=1
grep -A27 "== profile" "$log" | cut -c1-150
tail -6 "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
