#!/usr/bin/env bash
# One device call (issue 15, seventh session): device-busy time of the NSA 125M train step at 2k
# and 8k before (.old/pre7) and after (this tree) the compressed gate-gradient barrier, same call.
set -u
OUT=${OUT:-/tmp/nsa_step_ab}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
HERE=$(pwd); LOG="$OUT/step_ab.log"; rc=0
for tree in before after; do
  dir=$HERE; [ $tree = before ] && dir=$HERE/.old/pre7
  (cd "$dir" && PYTHONPATH=. timeout 250 python3 bench/profile_step.py --models nsa_125m \
    --points 2048:16 8192:4 --steps 2 --top 40 --out "$OUT/step_$tree.json") >> "$LOG" 2>&1 || rc=1
done
grep -E "^== " "$LOG"
exit $rc
