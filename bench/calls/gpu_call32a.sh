#!/usr/bin/env bash
# One device call (thirty-second session, issue 15): the sliding-window branch on the Mosaic GPU tiled kernels
# (win_attn=mosaic). Its GPU tests (o, dQ, dK, dV against the float32 oracle and cuDNN; the whole op); then the NSA
# op under jax.profiler, the default choices (window on cuDNN) against win_attn=mosaic, at the 125M heads 2k / B=16,
# 8k / B=4, 64k / B=1 and the bench heads 2k / B=8.
#   bash bench/calls/gpu_call32a.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
python3 -c "import jax; print('jax', jax.__version__)" 2>/dev/null | tee -a "$log"
timeout 230 python3 -m pytest -q -m gpu tests/test_mosaic_window.py -s -p no:cacheprovider 2>&1 \
  | grep -E "^[.F]*[0-9]+ |^[.F]*\{|passed|failed|Error|error" | tail -25 | tee -a "$log" || rc=1
for pt in 125m:2048:16 125m:8192:4 125m:65536:1 bench:2048:8; do
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
