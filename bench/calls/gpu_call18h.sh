#!/usr/bin/env bash
# One device call (eighteenth session): the 125M train step at 8k / B=4 profiled for NSA and dense in one
# process (bench/profile_step.py: device time by category and top ops), the profile behind the 8k miss.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 540 python3 bench/profile_step.py --models nsa_125m dense_125m --points 8192:4 \
  --steps 2 --top 30 --out "$OUT/prof_8k.json" > "$OUT/prof_8k.log" 2>&1 || rc=1
grep -E "device busy|^==|Error" "$OUT/prof_8k.log" | head -12
exit $rc
