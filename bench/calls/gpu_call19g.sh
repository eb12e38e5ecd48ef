#!/usr/bin/env bash
# One device call (nineteenth session, issue 14): the lse merge in the scoring kernel at other decode points,
# NSA only (dense's code did not change): 64k / B=1 and 32k / B=64, the tree before ($1) and this tree, one
# process each, per token in the 16-token loop, each point profiled.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for pt in "65536 1" "32768 64"; do set -- $pt
  ARGS="--models nsa_125m --contexts $1 --batches $2 --reps 30 --profile $1:$2"
  (cd "$OLD" && PYTHONPATH=. timeout 150 python3 bench/decode.py $ARGS --out "$OUT/old_$1_$2.json" \
    > "$OUT/old_$1_$2.log" 2>&1) || rc=1
  PYTHONPATH=. timeout 150 python3 bench/decode.py $ARGS --out "$OUT/new_$1_$2.json" \
    > "$OUT/new_$1_$2.log" 2>&1 || rc=1
  for f in old new; do echo "== $1/$2 $f"; grep -E "^nsa_125m|loop profile|Error" "$OUT/${f}_$1_$2.log"; done
done
exit $rc
