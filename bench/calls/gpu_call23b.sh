#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): the tiled selection kernels' causal split (full pairs take
# a row bias, no mask). The op profiled (bench/profile_op.py, device busy per fwd+bwd) for the tree before ($1)
# and this tree, alternating, two rounds, at 125M 2k / B=16 and 4k / B=8; Nsight Compute's pipe and issue
# counters of this tree's three tiled kernels at 2k; GPU parity of the tiled kernels. Logs in one file.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
for round in 1 2; do
  for p in "125m 2048 16" "125m 4096 8"; do set -- $p
    for tree in before after; do
      dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
      echo "== $tree $1 $2 $3 round $round (t=${SECONDS}s)" >> "$LOG"
      (cd "$dir" && PYTHONPATH=. timeout 110 python3 bench/profile_op.py --shape $1 --T $2 --B $3 --reps 5 \
        --top 40 --out "$TMP/op_${1}_$2_${tree}_r$round.json") >> "$LOG" 2>&1 || rc=1
    done
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_tiled_bwd_dkv nsa_sel_tiled_bwd_dq \
  nsa_sel_tiled_fwd | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "== ncu (t=${SECONDS}s)" >> "$LOG"
XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 120 "$NCU" --clock-control none -k regex:nsa_sel_tiled \
  --launch-skip 3 -c 3 --metrics gpu__time_duration.sum,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__instruction_throughput.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__registers_per_thread \
  python3 bench/profile_op.py --warm-only --reps 2 --shape 125m --T 2048 --B 16 >> "$LOG" 2>&1 || rc=1
grep -E "^  nsa_sel|gpu__time|pipe_alu|instruction_throughput|hmma_cycles|inst_executed.sum|registers" "$LOG" \
  | sed -E 's/ +/ /g'
PYTHONPATH=. timeout $((590 - SECONDS)) python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_tiled.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
