#!/usr/bin/env bash
# One device call (forty-seventh session, call 1): chunked prefill on the GPU -- its GPU test and the decode GPU
# tests (the LayerCache gained a field), then bench/chunked_prefill.py at 64k for both 125M models.
#   bash bench/calls/gpu_call47a.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__)" | tee -a "$log"
timeout "${TEST_S:-240}" python3 -m pytest -m gpu -p no:cacheprovider -v -W ignore::DeprecationWarning -rfE \
  --durations=0 tests/test_chunked_prefill.py tests/test_decode.py >> "$log" 2>&1 || rc=1
echo "  (GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${BENCH_S:-300}" env PYTHONPATH=. python3 bench/chunked_prefill.py --lengths 65536 --chunks 4096 16384 \
  --reps 3 --out "$OUT/chunked_prefill.json" >> "$log" 2>&1 || rc=1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$log" | tail -14
sed -n '/^$/,$p' "$log" | tail -10
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
