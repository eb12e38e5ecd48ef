#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): the 125M train step with 128-wide heads (model.head_dim=128,
# model.n_heads=8: h = 4, D = 128) at 8k / B=4, NSA at the tree before (.old/pre30, carried) and NSA +
# dense at this tree: what sel_block_warps = 4 gives a model with 128-wide heads above 4k tokens.
#   bash bench/calls/gpu_call30j.sh .old/pre30
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; OLD=${1:-.old/pre30}; t0=$SECONDS; rc=0
log="$OUT/run.log"; nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
OV="model.head_dim=128 model.n_heads=8"
for tag in before after; do
  tree=$([ $tag = before ] && echo "$OLD" || echo .); models=$([ $tag = before ] && echo nsa_125m || echo "nsa_125m dense_125m")
  left=$((580 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  (cd "$tree" && PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/train_throughput.py \
    --points 8192:4 --models $models --steps 8 --no-loader --override $OV --out "$OUT/train_$tag.json") \
    2>&1 | grep -E "tok/s|ms|rror" | grep -v "^WARNING" | sed "s/^/$tag /" | tee -a "$log" || rc=1
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
