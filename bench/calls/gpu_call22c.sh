#!/usr/bin/env bash
# One device call (twenty-second session, issue 15): the tiled selection dK/dV's mask built once per tile (lax.cond)
# in the single (tile, head) loop. The op profiled (device busy per fwd+bwd) for the tree before ($1: the single
# loop with the mask per head) and this tree, alternating, two rounds, at 125M 2k / B=16 and 4k / B=8; the tiled
# kernels' launch variants (bench/kernels.py --sel-impl tiled); GPU parity of the tiled kernels. Logs in one file.
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
PYTHONPATH=. timeout 200 python3 bench/kernels.py --sel-impl tiled --shapes 125m --T 2048 4096 --tokens 32768 \
  --reps 20 --tiled-vars "" num_stages=1 num_stages=3 num_warps=8 --out "$OUT/tiled_vars.json" >> "$LOG" 2>&1 || rc=1
sed -n '/== all/,$p' "$LOG"
echo "variants done at ${SECONDS}s"
PYTHONPATH=. timeout $((590 - SECONDS)) python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_tiled.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
