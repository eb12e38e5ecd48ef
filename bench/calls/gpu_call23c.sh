#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): dK/dV with keys as rows (s^T = K Q^T) in the tiled dK/dV
# and the block-major backward. The op profiled (bench/profile_op.py, device busy per fwd+bwd) for the tree
# before ($1) and this tree, alternating, two rounds, at 125M 2k / B=16, 4k / B=8 (tiled) and 8k / B=4 (block);
# Nsight Compute's counters of this tree's two kernels; GPU parity of both. Logs in one file.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
for round in 1 2; do
  for p in "125m 2048 16" "125m 4096 8" "125m 8192 4"; do set -- $p
    for tree in before after; do
      dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
      echo "== $tree $1 $2 $3 round $round (t=${SECONDS}s)" >> "$LOG"
      (cd "$dir" && PYTHONPATH=. timeout 110 python3 bench/profile_op.py --shape $1 --T $2 --B $3 --reps 5 \
        --top 40 --out "$TMP/op_${1}_$2_${tree}_r$round.json") >> "$LOG" 2>&1 || rc=1
    done
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_tiled_bwd_dkv nsa_sel_bwd_block \
  nsa_sel_fwd_block | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,launch__registers_per_thread,sm__instruction_throughput.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
for p in "nsa_sel_tiled_bwd_dkv 1 2048 16" "nsa_sel_bwd_block 1 8192 4"; do set -- $p
  echo "== ncu $1 (t=${SECONDS}s)" >> "$LOG"
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 100 "$NCU" --clock-control none -k regex:$1 \
    --launch-skip $2 -c 1 --metrics $M \
    python3 bench/profile_op.py --warm-only --reps 2 --shape 125m --T $3 --B $4 >> "$LOG" 2>&1 || rc=1
done
grep -E "^  nsa_sel|gpu__time|instruction_throughput|hmma_cycles|registers|stalled" "$LOG" | sed -E 's/ +/ /g'
PYTHONPATH=. timeout $((590 - SECONDS)) python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_tiled.py \
  tests/test_pallas_gpu.py -k "bf16_matches_f32_reference or packed" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
