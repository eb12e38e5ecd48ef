#!/usr/bin/env bash
# One device call (twenty-ninth session, issue 14): (1) the scoring kernel's warps rule and its select-form rank count
# against the tree before (.old/pre29, carried), kernels alone at seven decode points; (2) the decode loop of both
# models at 64k, B = 1 / 8 / 64, with XLA's Triton GEMM emitter on (the default) and off (cuBLAS for every dot:
# the step's GEMMs run at 0.2-0.8 TB/s against a 3-4 us byte floor per layer), profiled at B = 8 and 64.
#   bash bench/calls/gpu_call29b.sh .old/pre29
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
OLD=${1:-.old/pre29}; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
PTS="131072:64 65536:64 131072:8 65536:8 8192:8 131072:1 65536:1"
PYTHONPATH=. timeout 100 python3 bench/decode_kernels.py --points $PTS --tree "$OLD" \
  --out "$OUT/kern_before.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
PYTHONPATH=. timeout 130 python3 bench/decode_kernels.py --points $PTS --variants default score_warps=4 \
  --out "$OUT/kern_after.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
echo "kernels: $((SECONDS - t0)) s" | tee -a "$log"
for tag in triton cublas; do
  left=$((570 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  lim=$left; [ $tag = triton ] && lim=$((left / 2))
  flags=""; [ $tag = cublas ] && flags="--xla_gpu_enable_triton_gemm=false"
  XLA_FLAGS="$flags" PYTHONPATH=. timeout "$lim" python3 bench/decode.py --contexts 65536 --batches 1 8 64 \
    --reps 20 --profile 65536:8 65536:64 --out "$OUT/loop_$tag.json" 2>&1 \
    | grep -E "^(nsa|dense)_125m|loop profile|rror" | tee -a "$log" || rc=1
  echo "loop $tag: $((SECONDS - t0)) s" | tee -a "$log"
done
exit $rc
