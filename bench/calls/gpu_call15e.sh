#!/usr/bin/env bash
# One device call (fifteenth session): Nsight Compute on the selection scoring kernel (nsa_cmp_scores) and
# on the inverted dK/dV kernel with its new tiles, bench shape, T = 32k (issue 15). Logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for spec in "score:nsa_cmp_scores" "bwd:nsa_sel_bwd_dkv"; do kern=${spec%%:*}; name=${spec#*:}
  PYTHONPATH=. timeout 200 "$NCU" --clock-control none -k regex:$name --launch-skip 1 -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis \
    python3 bench/ncu_sel.py --kernel $kern --T ${T:-32768} > "$OUT/ncu_$kern.log" 2>&1 || rc=1
  echo "== $name"
  grep -E "Duration|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit (Registers|Shared)|Registers Per|Dynamic Shared|Issued Warp Per|No Eligible|Executed Ipc A|Grid Size|Block Size" \
    "$OUT/ncu_$kern.log" | sed -E 's/ +/ /g' | head -24
  grep -E "^ +(OPT|WRN) " -A2 "$OUT/ncu_$kern.log" | grep -iE "stall|waiting|cycles|bank|pipe|sectors" | cut -c1-220 | head -8
done
exit $rc
