#!/usr/bin/env bash
# One device call (eighteenth session): why the inverted dK/dV kernel is slower when it stores dS (sel_dq "ds"):
# Nsight Compute on nsa_sel_bwd_dkv with "query" and with "ds" (launch stats, occupancy, memory, warp stalls),
# bench shape, 64k; and the A/B with the dK/dV kernel at one pipeline stage (less shared memory) in "ds".
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in query ds; do
  PYTHONPATH=. timeout 150 "$NCU" --clock-control none -k regex:nsa_sel_bwd_dkv --launch-skip 1 -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    python3 bench/ncu_sel.py --kernel bwd --choices sel_dq=$m > "$OUT/ncu_$m.log" 2>&1 || rc=1
  echo "== ncu dK/dV [$m]"
  grep -E "Duration|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Static Shared|Dynamic Shared|Shared Memory Configuration Size|Warp Cycles Per Issued|No Eligible" "$OUT/ncu_$m.log" | sed -E 's/ +/ /g' | head -22
  grep -E "^ +(OPT|WRN|INF) " -A2 "$OUT/ncu_$m.log" | grep -iE "stall|waiting|cycles|shared" | cut -c1-220 | head -6
done
PYTHONPATH=.:bench timeout 150 python3 bench/sel_dq_ab.py --shape bench --T 65536 --rounds 2 --modes query ds \
  ds:num_stages=1 --out "$OUT/ab.json" > "$OUT/ab.log" 2>&1 || rc=1
grep -E "rrmse|sel_bwd|Error" "$OUT/ab.log"
exit $rc
