#!/usr/bin/env bash
# One device call (issue 15, ninth session): the fused LM-head cross-entropy (nsa_jax/loss.py) and
# the histogram inverted index. Optional GPU checks ("tests"), then 125M training tok/s of NSA and
# dense before (.old/pre9, carried) and after (this tree) in the same call; JSON under $OUT.
# Usage: bash bench/calls/gpu_loss.sh "65536:1" [tests]
set -u
OUT=${OUT:-/tmp/nsa_loss9}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
POINTS=${1:-"65536:1"}; TESTS=${2:-}
HERE=$(pwd); LOG="$OUT/loss9.log"; rc=0; tag=$(echo "$POINTS" | tr ' :' '_x')
if [ -n "$TESTS" ]; then
  timeout 240 python3 -m pytest -q -x tests/test_loss.py "tests/test_pallas.py::test_count_below_is_searchsorted" \
    >> "$LOG" 2>&1 || rc=1
  timeout 240 python3 -m pytest -q -x -m gpu tests/test_pallas_gpu.py \
    -k "sel_fwd_block or sel_block_passes or (bf16_matches and 125m and 8192)" >> "$LOG" 2>&1 || rc=1
  grep -E "passed|failed|error" "$LOG"
fi
for tree in before after; do
  dir=$HERE; [ $tree = before ] && dir=$HERE/.old/pre9
  (cd "$dir" && PYTHONPATH=. timeout 270 python3 bench/train_throughput.py --no-loader \
    --points $POINTS --steps 8 --out "$OUT/train_${tag}_$tree.json") >> "$LOG" 2>&1 || rc=1
  echo "== $tree" >> "$LOG"
done
grep -E "^(== |model|nsa_125m|dense_125m) " "$LOG"
exit $rc
