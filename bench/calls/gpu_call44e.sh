#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): the dense decode step with NSA's projection and RoPE treatment
# (one w_step matmul, q and the key rotated in the cache-write kernel). The GPU decode tests, then dense alone at 64k /
# B=1 and 8 in the tree before (BEFORE) and this tree, alternated (one process each), then both models at this tree.
#   bash bench/calls/gpu_call44e.sh BEFORE_TREE      (run from this tree)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
before=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -q -W ignore::DeprecationWarning \
  tests/test_decode.py tests/test_decode_dense.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -6 | tee -a "$log"
echo "  (tests done at $((SECONDS - t0)) s)" | tee -a "$log"
for run in before1 after1 before2 after2; do
  tree=.; [ "${run%?}" = before ] && tree=$before
  (cd "$tree" && PYTHONPATH=. timeout 80 python3 -W ignore::DeprecationWarning bench/decode.py --models dense_125m \
    --contexts 65536 --batches 1 8 --reps 30 --out "$OUT/dense_$run.json") > "$OUT/dense_$run.log" 2>&1 || rc=1
  grep -E "^dense_125m" "$OUT/dense_$run.log" | sed "s/^/$run  /" | tee -a "$log"
done
echo "  (A/B done at $((SECONDS - t0)) s)" | tee -a "$log"
PYTHONPATH=. timeout 120 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 --batches 1 8 \
  --reps 30 --out "$OUT/decode64k.json" > "$OUT/decode64k.log" 2>&1 || rc=1
grep -E "^(nsa|dense)_125m" "$OUT/decode64k.log" | sed "s/^/both  /" | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
