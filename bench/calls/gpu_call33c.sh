#!/usr/bin/env bash
# One device call (thirty-third session, issue 15): the NSA op's "auto" choices at group sizes and head dims the
# defaults were not tuned on (bench/shape_audit.py: h = 1, 2, 4 at 64-wide heads and h = 4 at 128-wide heads, 2k / B=16
# and 8k / B=4), each against the alternatives "auto" picks between, in one process.
#   bash bench/calls/gpu_call33c.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
PYTHONPATH=. timeout 570 python3 -W ignore::DeprecationWarning bench/shape_audit.py --reps 10 \
  --out "$OUT/shape_audit.json" 2>&1 | grep -v "^WARNING" | tee -a "$log" || rc=1
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
