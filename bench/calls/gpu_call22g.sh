#!/usr/bin/env bash
# One device call (twenty-second session; ran from the tree of branch exp/dkv-tile-list, whose code change is
# bench/results/tiled22/call7/patch.diff; issue 15): the tiled dK/dV's tile list in
# registers. The op profiled at 125M 2k / B=16 for the tree before ($1) and this tree, alternating, two rounds;
# then GPU parity of the tiled kernels if the call has the time. Logs in one file.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
for round in 1 2; do
  for tree in before after; do
    dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
    echo "== $tree round $round (t=${SECONDS}s)" >> "$LOG"
    (cd "$dir" && PYTHONPATH=. timeout 60 python3 bench/profile_op.py --shape 125m --T 2048 --B 16 --reps 5 \
      --top 40 --out "$TMP/op_125m_2048_${tree}_r$round.json") >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_tiled_bwd_dkv nsa_sel_tiled_bwd_dq | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
PYTHONPATH=. timeout 120 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_tiled.py \
  -k "test_gpu_tiled_selection_bf16" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
