#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): the 125M train step's device busy time at 2k / B=16
# (bench/profile_step.py, --steps 2): this tree for NSA and dense in one process, the tree before ($1) for NSA;
# then the packed op (mean document 2048, 64k / B=1 and 8k / B=4) for the tree $2 and this tree, one round.
# Logs in one file.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); LOG="$OUT/step.log"; STEP_OLD=$1; OP_OLD=$2
echo "=== tree after (t=${SECONDS}s)" >> "$LOG"
PYTHONPATH=. timeout 250 python3 bench/profile_step.py --models nsa_125m dense_125m --points 2048:16 --steps 2 \
  --top 40 --out "$OUT/step_after.json" >> "$LOG" 2>&1 || rc=1
echo "=== tree before (t=${SECONDS}s)" >> "$LOG"
(cd "$HERE/$STEP_OLD" && PYTHONPATH=. timeout $((440 - SECONDS)) python3 bench/profile_step.py --models nsa_125m \
  --points 2048:16 --steps 2 --top 40 --out "$OUT/step_before.json") >> "$LOG" 2>&1 || rc=1
echo "steps done at ${SECONDS}s"
TMP=$(mktemp -d)
for p in "125m 65536 1" "125m 8192 4"; do set -- $p
  for tree in before after; do
    dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OP_OLD
    echo "== $tree $1 $2 $3 packed (t=${SECONDS}s)" >> "$LOG"
    (cd "$dir" && PYTHONPATH=. timeout 100 python3 bench/profile_op.py --shape $1 --T $2 --B $3 --reps 5 \
      --packed-mean-doc 2048 --top 40 --out "$TMP/op_${1}_$2_${tree}_r1.json") >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_local_bwd_dkv nsa_cmp_bwd_dkv_split nsa_local_fwd \
  | tee -a "$LOG"
echo "done at ${SECONDS}s"
grep -E "^=== |^== |busy" "$LOG" | head -20
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
