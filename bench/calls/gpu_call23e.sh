#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): the 125M train step's device busy time at 2k / B=16
# (bench/profile_step.py, --steps 2): this tree for NSA and dense in one process, the tree before ($1) for NSA.
# Logs in one file.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); LOG="$OUT/step.log"
echo "=== tree after (t=${SECONDS}s)" >> "$LOG"
PYTHONPATH=. timeout 290 python3 bench/profile_step.py --models nsa_125m dense_125m --points 2048:16 --steps 2 \
  --top 40 --out "$OUT/step_after.json" >> "$LOG" 2>&1 || rc=1
echo "=== tree before (t=${SECONDS}s)" >> "$LOG"
(cd "$HERE/$1" && PYTHONPATH=. timeout $((580 - SECONDS)) python3 bench/profile_step.py --models nsa_125m \
  --points 2048:16 --steps 2 --top 40 --out "$OUT/step_before.json") >> "$LOG" 2>&1 || rc=1
echo "done at ${SECONDS}s"
grep -E "^=== |^== |busy" "$LOG" | head -20
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
