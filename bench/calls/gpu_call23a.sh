#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): Nsight Compute on the kernels that hold the 125M 2k and 8k
# train steps, never profiled by a kernel profiler before: the tiled selection kernels at 2k / B=16
# (nsa_sel_tiled_fwd, _bwd_dq, _bwd_dkv) and the block-major ones at 8k / B=4 (nsa_sel_fwd_block,
# nsa_sel_bwd_block), each inside the whole op (bench/profile_op.py --warm-only, second call profiled).
# Sections: throughput, occupancy, launch, warp states (details), instruction stats; then the tensor pipes'
# instruction counts (wgmma vs mma.sync) and the stall reasons as raw metrics, from names ncu lists here.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
LOG="$OUT/ncu.log"; : > "$LOG"
"$NCU" --version | tail -1 | tee -a "$LOG"
"$NCU" --query-metrics --chip gh100 > "$OUT/metrics.txt" 2>&1 || true
pick() { awk '{print $1}' "$OUT/metrics.txt" | grep -E "$1" | head -40; }
TENSOR=$(pick '^sm__(inst_executed_pipe_tensor_op_[a-z0-9_]*|pipe_tensor_op_[a-z0-9_]*_cycles_active)$' \
  | awk '/cycles_active/ {print $0".avg.pct_of_peak_sustained_active"; next} {print $0".sum"}' | paste -sd, -)
STALL=$(pick '^smsp__average_warps_issue_stalled_[a-z_]*_per_issue_active$' | sed 's/$/.ratio/' | paste -sd, -)
echo "tensor metrics: $TENSOR" >> "$LOG"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats"
run() {  # $1 label, $2 kernel regex, $3 launches to skip, $4 count, rest: profile_op args
  local label=$1 re=$2 skip=$3 cnt=$4; shift 4
  echo "===== $label sections (t=${SECONDS}s)" >> "$LOG"
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 170 "$NCU" --clock-control none -k "regex:$re" \
    --launch-skip "$skip" -c "$cnt" $SECTIONS --print-details all \
    python3 bench/profile_op.py --warm-only --reps 2 "$@" >> "$LOG" 2>&1 || rc=1
  echo "===== $label metrics (t=${SECONDS}s)" >> "$LOG"
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 110 "$NCU" --clock-control none -k "regex:$re" \
    --launch-skip "$skip" -c "$cnt" --metrics "gpu__time_duration.sum,launch__registers_per_thread,$TENSOR,$STALL" \
    python3 bench/profile_op.py --warm-only --reps 2 "$@" >> "$LOG" 2>&1 || rc=1
}
run tiled2k 'nsa_sel_tiled' 3 3 --shape 125m --T 2048 --B 16
run block8k 'nsa_sel_(fwd|bwd)_block' 2 2 --shape 125m --T 8192 --B 4
echo "done at ${SECONDS}s" >> "$LOG"
# short table: per kernel, the headline numbers
grep -E "^  nsa_sel|^=====|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit Reg|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|tensor_op|stalled_(long|short|barrier|math|wait|mio|lg|not_sel|dispatch|no_inst|branch)[a-z_]*" \
  "$LOG" | sed -E 's/ +/ /g' | cut -c1-160 | head -150
grep -E "Error|Traceback|ERR" "$LOG" | head -5
exit $rc
