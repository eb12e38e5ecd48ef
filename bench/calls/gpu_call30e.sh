#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): the bench head shape (64 / 4 / 128) at short T, where the tiled
# selection kernels (64-row tiles of one head) and the Pallas compressed forward run at the 8 warps BlockSizes.for_shape
# gives 128-wide heads: the NSA op under jax.profiler at 2k / B=8 and 4k / B=4, default against num_warps=4.
#   bash bench/calls/gpu_call30e.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
for pt in 2048:8 4096:4; do
  T=${pt%:*}; B=${pt#*:}
  for v in default num_warps=4; do
    tiles=$([ $v = default ] && echo "" || echo "--tiles $v")
    PYTHONPATH=. timeout 150 python3 -W ignore::DeprecationWarning bench/profile_op.py --shape bench --T "$T" \
      --B "$B" --reps 5 $tiles --top 12 --out "$OUT/op_${T}_${v%%=*}.json" 2>&1 | grep -v "^WARNING" \
      | sed "s/^/$v /" | tee -a "$log" || rc=1
  done
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
