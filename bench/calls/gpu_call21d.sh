#!/usr/bin/env bash
# One device call (twenty-first session, issue 15): the 125M train step's device busy time at 2k / B=16 and
# 8k / B=4 (bench/profile_step.py, --steps 2) for the tree before ($1) and this tree (the gate-gradient sums
# each behind a barrier), one process per tree, same call. Logs in one file.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); LOG="$OUT/step.log"
for tree in after before; do
  dir=$HERE; [[ $tree == before ]] && dir=$HERE/$1
  echo "=== tree $tree" >> "$LOG"
  (cd "$dir" && PYTHONPATH=. timeout 240 python3 bench/profile_step.py --models nsa_125m \
    --points 2048:16 8192:4 --steps 2 --top 40 --out "$OUT/step_$tree.json") >> "$LOG" 2>&1 || rc=1
done
grep -E "^=== |^== " "$LOG"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
