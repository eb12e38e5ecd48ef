#!/usr/bin/env bash
# One device call (thirty-second session, issue 15): two listed blocks per step (128 keys) in the Mosaic GPU forward
# and dQ at 64-wide heads. First the NSA op under jax.profiler at the 125M heads 2k / B=16: the defaults (Triton
# forward and dQ, Mosaic GPU dK/dV, cuDNN window), the forward and dQ on Mosaic GPU, and those with the window on
# Mosaic GPU as well; then both Mosaic GPU test files with the time left.
#   bash bench/calls/gpu_call32d.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
MOS="sel_tiled_fwd=mosaic sel_tiled_dq=mosaic"
for v in default mosaic mosaic_win; do
  case $v in default) ch="";; mosaic) ch="$MOS";; mosaic_win) ch="$MOS win_attn=mosaic";; esac
  PYTHONPATH=. timeout 80 python3 -W ignore::DeprecationWarning bench/profile_op.py --shape 125m --T 2048 --B 16 \
    --reps 5 ${ch:+--choices $ch} --top 9 --out "$OUT/op_125m_2048_$v.json" 2>&1 \
    | grep -v "^WARNING" | sed "s/^/$v /" | tee -a "$log" || rc=1
done
left=$((500 - (SECONDS - t0)))
timeout "$left" python3 -m pytest -q -m gpu tests/test_mosaic_tiled.py tests/test_mosaic_window.py -s \
  -p no:cacheprovider 2>&1 | grep -E "^[.F]*[0-9]+ |^[.F]*\{|passed|failed|Error|error" | tail -30 | tee -a "$log" || rc=1
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
