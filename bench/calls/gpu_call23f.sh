#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): launch variants of the tiled kernels after the causal split
# and the keys-first dK/dV (register-bound dK/dV: 222 registers, 2 CTAs per SM). The op profiled
# (bench/profile_op.py, device busy per fwd+bwd) with the defaults and with num_warps=8, num_stages=3,
# sel_keys=32, at 125M 2k / B=16 (two rounds) and 4k / B=8 (one); ncu's registers and stalls of the dK/dV kernel
# at 8 warps. Logs in one file.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TMP=$(mktemp -d); LOG="$OUT/bench.log"
for p in "2048 16 1" "4096 8 1" "2048 16 2"; do set -- $p
  for v in default num_warps=8 num_stages=3 sel_keys=32; do
    tiles=""; [[ $v != default ]] && tiles="--tiles $v"
    echo "== $v $1 $2 round $3 (t=${SECONDS}s)" >> "$LOG"
    PYTHONPATH=. timeout 90 python3 bench/profile_op.py --shape 125m --T $1 --B $2 --reps 5 $tiles \
      --top 40 --out "$TMP/op_125m_$1_${v/=/}_r$3.json" >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_tiled_bwd_dkv nsa_sel_tiled_bwd_dq \
  nsa_sel_tiled_fwd | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
echo "== ncu dkv num_warps=8 (t=${SECONDS}s)" >> "$LOG"
XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 100 "$NCU" --clock-control none -k regex:nsa_sel_tiled_bwd_dkv \
  --launch-skip 1 -c 1 --metrics $M python3 bench/profile_op.py --warm-only --reps 2 --shape 125m --T 2048 --B 16 \
  --tiles num_warps=8 >> "$LOG" 2>&1 || rc=1
grep -E "^  nsa_sel|gpu__time|registers|warps_active|hmma_cycles|stalled" "$LOG" | sed -E 's/ +/ /g'
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
