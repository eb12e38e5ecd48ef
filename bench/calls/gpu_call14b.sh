#!/usr/bin/env bash
# One device call (fourteenth session, issue 15): the query-major selection kernels walking (block,
# sub-tile) steps of BlockSizes.sel_q_keys keys with deeper pipelines, bench shape T = 64k
# (bench/kernels.py --sweep; the first variant, {}, is the tree before's kernel: one 64-key step per
# block, the same loop); then Nsight Compute on the forward (bench/ncu_sel.py) for three variants:
# L2 / DRAM throughput, occupancy and warp stalls. JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 240 python3 -c "
import kernels as k
v = [{}, {'sel_q_keys': 32, 'sel_stages': 2}, {'sel_q_keys': 32, 'sel_stages': 3},
     {'sel_q_keys': 32, 'sel_stages': 4}, {'sel_q_keys': 32, 'sel_stages': 3, 'sel_warps': 1},
     {'sel_q_keys': 32, 'sel_stages': 4, 'sel_warps': 4}, {'sel_q_keys': 16, 'sel_stages': 4},
     {'sel_q_keys': 16, 'sel_stages': 6}, {'sel_q_keys': 16, 'sel_stages': 4, 'sel_warps': 1}]
k.SWEEP = {'sel_fwd': v, 'sel_bwd': v}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(fwd|bwd) " "$OUT/sweep.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
i=0
for v in "" "sel_q_keys=32 sel_stages=4" "sel_q_keys=16 sel_stages=4"; do i=$((i+1))
  PYTHONPATH=. timeout 150 "$NCU" --clock-control none -k regex:sel_fwd --launch-skip 1 -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    python3 bench/ncu_sel.py --set $v > "$OUT/ncu_$i.log" 2>&1 || rc=1
  echo "== ncu [$v]"
  grep -E "Duration|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per" "$OUT/ncu_$i.log" | sed -E 's/ +/ /g' | head -24
  grep -E "^ +(OPT|WRN|INF) " -A2 "$OUT/ncu_$i.log" | grep -iE "stall|waiting|cycles" | cut -c1-220 | head -6
done
exit $rc
