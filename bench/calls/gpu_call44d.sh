#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): after the Pallas decode layers lost to XLA (calls 1-3), whether
# XLA's own GEMMs for the decode step's [B, 768] x [768, N] matmuls do better on cuBLAS than on its Triton GEMM
# emitter (XLA_FLAGS=--xla_gpu_enable_triton_gemm=false): the layer bench's XLA form at B = 8 and 64 under each
# flag setting, then NSA and dense at 64k / B=8 with the layers in XLA, alternating the flag (one process each).
#   bash bench/calls/gpu_call44d.sh
# (Runs from a tree with bench/wip/decode-layers.patch applied (branch wip/decode-layers): the kernels, their tests
# and bench/decode_layers.py were not taken onto main.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
CUBLAS=--xla_gpu_enable_triton_gemm=false
for tag in triton cublas; do
  flags=""; [ "$tag" = cublas ] && flags=$CUBLAS
  XLA_FLAGS="$flags" PYTHONPATH=. timeout 90 python3 -W ignore::DeprecationWarning bench/decode_layers.py \
    --batches 8 64 --variants xla --out "$OUT/layers_$tag.json" > "$OUT/layers_$tag.log" 2>&1 || rc=1
  grep "^B=" "$OUT/layers_$tag.log" | cut -c1-250 | sed "s/^/$tag  /" | tee -a "$log"
done
echo "  (layers done at $((SECONDS - t0)) s)" | tee -a "$log"
for run in cublas1 triton1 cublas2 triton2; do
  tag=${run%?}; flags=""; [ "$tag" = cublas ] && flags=$CUBLAS
  XLA_FLAGS="$flags" PYTHONPATH=. timeout 100 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 \
    --batches 8 --reps 30 --set exec.decode_layers=xla --out "$OUT/decode_$run.json" > "$OUT/decode_$run.log" 2>&1 || rc=1
  grep -E "^(nsa|dense)_125m" "$OUT/decode_$run.log" | sed "s/^/$run  /" | tee -a "$log"
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
