#!/usr/bin/env bash
# Device call (twenty-second session; ran with the tree of branch exp/bf16-residuals at d2dfb77, whose code change
# is bench/results/bf16res22/patch.diff): the branch outputs saved for the
# backward kept in bf16 behind a barrier (pallas/nsa.py _saved). The op profiled for the tree before ($1: main at
# the branch point) and this tree, alternating, at the bench shape at 64k, 125M 2k / B=16 and 8k / B=4; then GPU
# parity on this tree if the call has the time left. Logs in one file.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
for p in "bench 65536 1" "125m 2048 16" "125m 8192 4"; do set -- $p
  for tree in before after; do
    dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
    echo "== $tree $1 $2 $3 (t=${SECONDS}s)" >> "$LOG"
    (cd "$dir" && PYTHONPATH=. timeout 110 python3 bench/profile_op.py --shape $1 --T $2 --B $3 --reps 5 \
      --top 40 --out "$TMP/op_${1}_$2_$tree.json") >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op input_convert_reduce_fusion loop_convert_fusion | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
if (( SECONDS < 400 )); then
  PYTHONPATH=. timeout $((590 - SECONDS)) python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
    -k "bf16_matches_f32_reference and not sel_ and not packed" > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
else echo "tests skipped: no time left"; fi
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
