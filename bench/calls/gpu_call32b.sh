#!/usr/bin/env bash
# One device call (thirty-second session, issue 15): the 125M train step (64-wide heads) at 2k / B=16 with the
# thirty-first session's Mosaic GPU dK/dV ("auto") against sel_tiled_dkv=triton, and dense; one process each
# (bench/train_throughput.py, 8 timed steps). Runs in the tree given as $1 (a `git archive` of the commit, carried as
# .old/s32), so edits in the working tree do not reach it.
#   bash bench/calls/gpu_call32b.sh .old/s32
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
cd "${1:-.}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for v in auto triton dense; do
  left=$((590 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  model=$([ $v = dense ] && echo dense_125m || echo nsa_125m)
  extra=$([ $v = triton ] && echo "--override exec.kernel.sel_tiled_dkv=triton" || echo "")
  PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/train_throughput.py --points 2048:16 \
    --models $model --steps 8 --no-loader $extra --out "$OUT/train_$v.json" 2>&1 \
    | grep -E "^nsa|^dense|rror" | grep -v "^WARNING" | sed "s/^/train $v /" | tee -a "$log" || rc=1
  echo "  ($v done at $((SECONDS - t0)) s)" | tee -a "$log"
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
