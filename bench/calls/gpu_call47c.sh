#!/usr/bin/env bash
# One device call (forty-seventh session, call 3): the dense chunk loop stopping at the last needed key block --
# the chunked-prefill and dense decode GPU tests, then bench/chunked_prefill.py for dense_125m at 64k.
#   bash bench/calls/gpu_call47c.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TEST_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -v -s -W ignore::DeprecationWarning -rfE \
  tests/test_chunked_prefill.py tests/test_decode_dense.py >> "$log" 2>&1 || rc=1
echo "  (GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${BENCH_S:-240}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models dense_125m --lengths 65536 \
  --chunks 4096 16384 --reps 3 --out "$OUT/chunked_prefill_dense.json" >> "$log" 2>&1 || rc=1
grep -E "PASSED|FAILED|ERROR|passed|failed|bf16 relative" "$log" | tail -8
sed -n '/^NVIDIA H200, jax/,$p' "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
