#!/usr/bin/env bash
# One device call (twenty-ninth session, issue 14): the scoring kernel's narrowed warps rule against the tree before
# (.old/pre29, carried): the decode kernels alone at 11 grid points, then NSA's decode loop (profiled: busy time per
# token) at 64k / B=8, 128k / B=8, 128k / B=64 for both trees.
#   bash bench/calls/gpu_call29c.sh .old/pre29
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
OLD=${1:-.old/pre29}; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
PTS="131072:64 65536:64 32768:64 8192:64 131072:8 65536:8 32768:8 8192:8 131072:1 65536:1 8192:1"
for tag in before after; do
  tree=$([ $tag = before ] && echo "$OLD" || echo .)
  PYTHONPATH=. timeout 100 python3 bench/decode_kernels.py --points $PTS --tree "$tree" \
    --out "$OUT/kern_$tag.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
done
echo "kernels: $((SECONDS - t0)) s" | tee -a "$log"
for tag in before after; do
  tree=$([ $tag = before ] && echo "$OLD" || echo .)
  left=$((570 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  lim=$left; [ $tag = before ] && lim=$((left / 2))
  (cd "$tree" && PYTHONPATH=. timeout "$lim" python3 bench/decode.py --models nsa_125m \
    --contexts 65536 131072 --batches 8 64 --reps 20 --profile 65536:8 131072:8 131072:64 \
    --out "$OUT/loop_$tag.json") 2>&1 | grep -E "^nsa_125m|loop profile|rror" | tee -a "$log" || rc=1
  echo "loop $tag: $((SECONDS - t0)) s" | tee -a "$log"
done
exit $rc
