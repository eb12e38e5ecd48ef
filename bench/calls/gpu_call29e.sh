#!/usr/bin/env bash
# One device call (twenty-ninth session, issue 14): the GPU decode tests at the final scoring-warps rule, then NSA's
# decode loop at 64k / B=8, 32k / B=64 and 128k / B=64 for the tree before (.old/pre29, carried) and this tree,
# each point profiled (busy time per token).
#   bash bench/calls/gpu_call29e.sh .old/pre29
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
OLD=${1:-.old/pre29}; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
timeout 150 python3 -m pytest -q -m gpu tests/test_decode.py tests/test_pallas_decode_select.py \
  > "$OUT/tests.log" 2>&1 || rc=1
tail -1 "$OUT/tests.log" | tee -a "$log"; echo "tests: $((SECONDS - t0)) s" | tee -a "$log"
for pt in 65536:8 32768:64 131072:64; do
  N=${pt%:*}; B=${pt#*:}
  for tag in before after; do
    tree=$([ $tag = before ] && echo "$OLD" || echo .)
    left=$((570 - (SECONDS - t0))); [ "$left" -lt 40 ] && break 2
    (cd "$tree" && PYTHONPATH=. timeout "$left" python3 bench/decode.py --models nsa_125m --contexts "$N" \
      --batches "$B" --reps 5 --warmup 2 --profile "$pt" --out "$OUT/loop_${tag}_${N}_${B}.json") 2>&1 \
      | grep -E "^nsa_125m|loop profile|rror" | sed "s/^/$tag /" | tee -a "$log" || rc=1
  done
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
