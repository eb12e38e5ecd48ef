#!/usr/bin/env bash
# One device call (thirty-first session, issue 15): the Mosaic GPU tiled selection forward
# (nsa_jax/pallas/mosaic_tiled.py). Its GPU parity tests, then the NSA op under jax.profiler with
# kernel.sel_tiled_fwd triton against mosaic: 125M 2k / B=16 and 4k / B=8, bench heads 2k / B=8.
#   bash bench/calls/gpu_call31a.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
python3 -c "import jax; print('jax', jax.__version__)" | tee -a "$log"
timeout 240 python3 -m pytest -q -x -m gpu tests/test_mosaic_tiled.py -s -p no:cacheprovider 2>&1 \
  | grep -v "^WARNING" | tail -25 | tee -a "$log" || rc=1
for pt in 125m:2048:16 125m:4096:8 bench:2048:8; do
  IFS=: read -r shape T B <<< "$pt"
  for v in triton mosaic; do
    PYTHONPATH=. timeout 120 python3 -W ignore::DeprecationWarning bench/profile_op.py --shape "$shape" --T "$T" \
      --B "$B" --reps 5 --choices sel_tiled_fwd=$v --top 10 --out "$OUT/op_${shape}_${T}_$v.json" 2>&1 \
      | grep -v "^WARNING" | sed "s/^/$shape $T $v /" | tee -a "$log" || rc=1
  done
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
