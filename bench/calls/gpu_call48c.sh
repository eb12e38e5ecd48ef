#!/usr/bin/env bash
# One device call (forty-eighth session, call 3): the GPU tests of the chunked prefill and the compiled top-n, then
# bench/chunked_prefill.py for nsa_125m at 64k (C = 4,096 and 16,384) with one traced chunked prefill.
#   bash bench/calls/gpu_call48c.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TEST_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -v -s -W ignore::DeprecationWarning -rfE \
  tests/test_chunked_prefill.py tests/test_pallas_gpu.py -k "chunked or topn" >> "$log" 2>&1 || rc=1
echo "  (GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${BENCH_S:-240}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
  --chunks 4096 16384 --reps 3 --profile --out "$OUT/chunked_nsa.json" > "$OUT/bench.log" 2>&1 || rc=1
grep -E "PASSED|FAILED|ERROR|passed|failed|bf16 relative" "$log" | tail -10
grep -A12 "== profile" "$OUT/bench.log" | cut -c1-150
tail -5 "$OUT/bench.log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
