#!/usr/bin/env bash
# One device call (forty-third session, issue 14): the decode cache-write kernel with every load issued before any
# store, against the tree before it. The NSA decode loop at 64k / B=8 profiled in each tree (bench/decode.py
# --profile, one process each; before first), then the GPU decode tests of the after tree.
#   bash bench/calls/gpu_call43f.sh BEFORE_TREE      (run from the after tree)
# (Its summary line moved into bench/decode_summary.py after the session's calls; the same output.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
before=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for tag in before after; do
  tree=.; [ "$tag" = before ] && tree=$before
  (cd "$tree" && PYTHONPATH=. timeout 150 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 \
    --batches 8 --reps 30 --models nsa_125m --profile 65536:8 --out "$OUT/decode_$tag.json") > "$OUT/decode_$tag.log" 2>&1 || rc=1
  python3 bench/decode_summary.py "$OUT/decode_$tag.json" "$tag" | tee -a "$log"
  echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
done
timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -q -W ignore::DeprecationWarning \
  tests/test_decode.py tests/test_decode_dense.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -6 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
