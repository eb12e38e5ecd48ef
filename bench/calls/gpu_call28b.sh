#!/usr/bin/env bash
# One device call (twenty-eighth session, issue 14) on an H200 (needs_h200: the 128k / B=64 NSA decode point does
# not fit an H100): the compressed decode kernel summing the block scores' partials (no logits written) against the
# tree before (.old/pre28, carried). GPU decode tests; the decode kernels alone (bench/decode_kernels.py) for both
# trees; then NSA's decode loop (bench/decode.py) for both trees at 8k / 64k / 128k x B = 8, 64.
#   bash bench/calls/gpu_call28b.sh .old/pre28
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
OLD=${1:-.old/pre28}; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
timeout 150 python3 -m pytest -q -m gpu tests/test_decode.py tests/test_pallas_decode_select.py \
  tests/test_decode_dense.py > "$OUT/tests.log" 2>&1 || rc=1
tail -1 "$OUT/tests.log" | tee -a "$log"; echo "tests: $((SECONDS - t0)) s" | tee -a "$log"
for tag in before after; do
  tree=$([ $tag = before ] && echo "$OLD" || echo .)
  PYTHONPATH=. timeout 110 python3 bench/decode_kernels.py --points 131072:64 131072:8 65536:8 65536:1 \
    --tree "$tree" --out "$OUT/kern_$tag.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
  echo "kernels $tag: $((SECONDS - t0)) s" | tee -a "$log"
done
for tag in before after; do
  tree=$([ $tag = before ] && echo "$OLD" || echo .)
  left=$((575 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  lim=$left; [ $tag = before ] && lim=$((left / 2))
  (cd "$tree" && PYTHONPATH=. timeout "$lim" python3 bench/decode.py \
    --models nsa_125m --contexts 8192 65536 131072 --batches 8 64 --reps 20 --out "$OUT/loop_$tag.json") \
    2>&1 | grep -E "^nsa_125m|rror" | tee -a "$log" || rc=1
  echo "loop $tag: $((SECONDS - t0)) s" | tee -a "$log"
done
exit $rc
