#!/usr/bin/env bash
# One device call (thirty-first session, issue 15): the Mosaic GPU tiled selection dK/dV. Its GPU tests and the
# whole op with all three tiled kernels on Mosaic GPU; the NSA op under jax.profiler, all three on triton against
# all three on mosaic (bench heads 2k / B=8 and 4k / B=4, 125M heads 2k / B=16); a train step of the 125M model
# with 128-wide heads at 2k / B=16 and 4k / B=8, triton against the default (auto), dense too.
#   bash bench/calls/gpu_call31c.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 200 python3 -m pytest -q -m gpu tests/test_mosaic_tiled.py -k "dkv or full" -s -p no:cacheprovider 2>&1 \
  | grep -E "^[.]*[0-9]+ |^[.]*\{|passed|failed|Error|error" | tail -25 | tee -a "$log" || rc=1
TRI="sel_tiled_fwd=triton sel_tiled_dq=triton sel_tiled_dkv=triton"
MOS="sel_tiled_fwd=mosaic sel_tiled_dq=mosaic sel_tiled_dkv=mosaic"
for pt in bench:2048:8 bench:4096:4 125m:2048:16; do
  IFS=: read -r shape T B <<< "$pt"
  for v in triton mosaic; do
    ch=$([ $v = triton ] && echo "$TRI" || echo "$MOS")
    PYTHONPATH=. timeout 100 python3 -W ignore::DeprecationWarning bench/profile_op.py --shape "$shape" --T "$T" \
      --B "$B" --reps 5 --choices $ch --top 5 --out "$OUT/op_${shape}_${T}_$v.json" 2>&1 \
      | grep -v "^WARNING" | sed "s/^/$shape $T $v /" | tee -a "$log" || rc=1
  done
done
OV="model.head_dim=128 model.n_heads=8"
for v in triton auto; do
  left=$((580 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  models=$([ $v = triton ] && echo nsa_125m || echo "nsa_125m dense_125m")
  extra=$([ $v = triton ] && echo "exec.kernel.sel_tiled_fwd=triton exec.kernel.sel_tiled_dq=triton exec.kernel.sel_tiled_dkv=triton" || echo "")
  PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/train_throughput.py --points 2048:16 4096:8 \
    --models $models --steps 8 --no-loader --override $OV $extra 2>&1 \
    | grep -E "^nsa|^dense|rror" | grep -v "^WARNING" | sed "s/^/train $v /" | tee -a "$log" || rc=1
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
