#!/usr/bin/env bash
# One device call (forty-seventh session, call 2): the chunked-prefill GPU test with its bf16 check against the
# float32 forward, then one chunked prefill per 125M model at 64k (C = 16,384) traced, to name where call 1's
# 0.76 s (NSA) and 2.8 s (dense) go.
#   bash bench/calls/gpu_call47b.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TEST_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -v -s -W ignore::DeprecationWarning -rfE \
  tests/test_chunked_prefill.py >> "$log" 2>&1 || rc=1
echo "  (GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${BENCH_S:-300}" env PYTHONPATH=. python3 bench/chunked_prefill.py --lengths 65536 --chunks 16384 \
  --reps 1 --profile --out "$OUT/chunked_prefill_profile.json" >> "$log" 2>&1 || rc=1
grep -E "PASSED|FAILED|ERROR|passed|failed|bf16 relative" "$log" | tail -8
grep -A27 "== profile" "$log" | cut -c1-150
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
