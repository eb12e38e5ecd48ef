#!/usr/bin/env bash
# One device call (thirty-first session, issue 15): the Mosaic GPU dK/dV with its gs fix (GPU tests, whole op on
# Mosaic GPU), then the 125M train step (64-wide heads) at 2k / B=16: sel_tiled_dkv=triton, the default (auto:
# Mosaic dK/dV), dense; one process each.
#   bash bench/calls/gpu_call31d.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 170 python3 -m pytest -q -m gpu tests/test_mosaic_tiled.py -k "dkv or full" -s -p no:cacheprovider 2>&1 \
  | grep -E "^[.]*[0-9]+ |^[.]*\{|passed|failed|Error|error" | tail -12 | tee -a "$log" || rc=1
for v in triton auto dense; do
  left=$((320 - (SECONDS - t0))); [ "$left" -lt 40 ] && break
  model=$([ $v = dense ] && echo dense_125m || echo nsa_125m)
  extra=$([ $v = triton ] && echo "--override exec.kernel.sel_tiled_dkv=triton" || echo "")
  PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/train_throughput.py --points 2048:16 \
    --models $model --steps 8 --no-loader $extra --out "$OUT/train_$v.json" 2>&1 \
    | grep -E "^nsa|^dense|rror" | grep -v "^WARNING" | sed "s/^/train $v /" | tee -a "$log" || rc=1
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
