#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): 128-wide heads in groups of h <= 8 take the block-major selection
# kernels above 4k tokens, at the 8 warps for_shape gives 128-wide heads, with 64-row tiles. The op at the
# "125m-wide" shape (8 / 2 / 128) at 8k / B=4 and 64k / B=1: default against num_warps=4.
#   bash bench/calls/gpu_call30h.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
for pt in 8192:4 65536:1; do
  T=${pt%:*}; B=${pt#*:}
  for v in default num_warps=4; do
    tiles=$([ $v = default ] && echo "" || echo "--tiles $v")
    PYTHONPATH=. timeout 140 python3 -W ignore::DeprecationWarning bench/profile_op.py --shape 125m-wide --T "$T" \
      --B "$B" --reps 5 $tiles --top 10 --out "$OUT/op_${T}_${v%%=*}.json" 2>&1 | grep -v "^WARNING" \
      | sed "s/^/$v /" | tee -a "$log" || rc=1
  done
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
