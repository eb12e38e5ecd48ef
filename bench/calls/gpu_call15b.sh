#!/usr/bin/env bash
# One device call (fifteenth session): Nsight Compute on the selection backward's two kernels at the
# bench shape, 64k (the per-query dQ kernel nsa_sel_bwd_dq and the inverted nsa_sel_bwd_dkv; issue 15);
# the decode kernels alone at 64k / B = 1 and 8 under compressed-split variants (issue 14).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 240 "$NCU" --clock-control none -k regex:nsa_sel_bwd --launch-skip 2 -c 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis \
  python3 bench/ncu_sel.py --kernel bwd > "$OUT/ncu_bwd.log" 2>&1 || rc=1
grep -E "^  nsa_sel|Duration|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit (Registers|Shared)|Registers Per|Dynamic Shared|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Executed Ipc A" \
  "$OUT/ncu_bwd.log" | sed -E 's/ +/ /g' | head -60
grep -E "^ +(OPT|WRN) " -A2 "$OUT/ncu_bwd.log" | grep -iE "stall|waiting|cycles|bank|uncoalesced|sectors" | cut -c1-220 | head -10
[[ ${1:-} == ncu ]] && exit $rc
PYTHONPATH=. timeout 240 python3 bench/decode_kernels.py --points 65536:1 65536:8 \
  --variants default splits=16 splits=64 cmp_stages=1 cmp_keys=32,splits=64 \
  --out "$OUT/dec_kern.json" > "$OUT/dec_kern.log" 2>&1 || rc=1
tail -30 "$OUT/dec_kern.log"
exit $rc
