#!/usr/bin/env bash
# One device call (twenty-ninth session, issue 14): the Pallas decode kernels' launch settings at the points that
# hold the targets (128k / B=64: the 8x point; 128k / B=8 and 64k / B=8: the growth and 4x points), then Nsight
# Compute on the compressed and scoring kernels at 128k / B=64 (the scoring kernel runs at ~3x its byte floor
# there; never profiled by a kernel profiler).
#   bash bench/calls/gpu_call29a.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
PYTHONPATH=. timeout 300 python3 bench/decode_kernels.py --points 131072:64 131072:8 65536:8 \
  --variants default splits=8 splits=12 splits=24 splits=32 cmp_warps=8 cmp_stages=3 sel_chunk=256 \
  score_warps=8 score_warps=2 sel_chunk=256,score_warps=8 \
  --out "$OUT/sweep.json" 2>&1 | grep -E "N=|rror" | tee -a "$log" || rc=1
echo "sweep: $((SECONDS - t0)) s" | tee -a "$log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NLOG="$OUT/ncu.log"; : > "$NLOG"
"$NCU" --version | tail -1 | tee -a "$NLOG"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats"
# launches 1-24 (cmp, score alternating per layer) are the compiling call's; 25-26 the warm call's first layer
XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 200 "$NCU" --clock-control none \
  -k "regex:nsa_decode_(cmp|score)" --launch-skip 24 -c 2 $SECTIONS --print-details all \
  python3 bench/decode_kernels.py --warm-only --points 131072:64 >> "$NLOG" 2>&1 || rc=1
echo "ncu: $((SECONDS - t0)) s" | tee -a "$log"
grep -E "^  nsa_decode|Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit|Warp Cycles Per Issued|No Eligible|Grid Size|Block Size|Waves Per SM|Stall" \
  "$NLOG" | sed -E 's/ +/ /g' | cut -c1-150 | head -80
grep -E "Error|Traceback|ERR" "$NLOG" | head -5
exit $rc
