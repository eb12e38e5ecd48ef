#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): causal flash attention on cuDNN, on Pallas Triton (ours and jax's)
# and on Pallas Mosaic GPU (jax's), forward and forward + backward, at the 125M and bench head shapes
# (bench/mgpu_probe.py): what the backend jax 0.11 points to instead of the deprecated Triton one reaches here.
#   bash bench/calls/gpu_call30b.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
PYTHONPATH=. timeout 420 python3 -W ignore::DeprecationWarning bench/mgpu_probe.py \
  --shapes ${SHAPES:-125m:16:2048 125m:4:8192 125m:1:65536 bench:1:16384} --out "$OUT/mgpu_probe.json" 2>"$OUT/stderr.log" \
  | tee -a "$log" || rc=1
tail -n 30 "$OUT/stderr.log" > "$OUT/stderr_tail.log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
