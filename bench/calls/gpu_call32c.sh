#!/usr/bin/env bash
# One device call (thirty-second session, issue 15): the Mosaic GPU kernels' GPU tests after the session's changes
# (the launchers shared with the window, dQ split into mosaic_tiled_dq.py; the window's whole-op test on the output's
# relative RMSE), then the NSA op under jax.profiler with the window on cuDNN (default) against win_attn=mosaic (its
# delta now a row reduction of its own) at the 125M heads 2k / B=16 and the bench heads 2k / B=8.
#   bash bench/calls/gpu_call32c.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 330 python3 -m pytest -q -m gpu tests/test_mosaic_tiled.py tests/test_mosaic_window.py -s -p no:cacheprovider \
  2>&1 | grep -E "^[.F]*[0-9]+ |^[.F]*\{|passed|failed|Error|error" | tail -30 | tee -a "$log" || rc=1
for pt in 125m:2048:16 bench:2048:8; do
  IFS=: read -r shape T B <<< "$pt"
  for v in cudnn mosaic; do
    left=$((585 - (SECONDS - t0))); [ "$left" -lt 30 ] && break 2
    PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/profile_op.py --shape "$shape" --T "$T" \
      --B "$B" --reps 5 --choices win_attn=$v --top 8 --out "$OUT/op_${shape}_${T}_$v.json" 2>&1 \
      | grep -v "^WARNING" | sed "s/^/$shape $T $v /" | tee -a "$log" || rc=1
  done
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
