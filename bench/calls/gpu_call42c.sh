#!/usr/bin/env bash
# One device call (forty-second session, issue 14): part of the decode grid the issue asks for (contexts 8k, 32k, 64k,
# 128k x batches 1, 8, 32, 64), NSA and dense in one process, dense on its flash-decoding kernel (the fair yardstick
# since the twenty-seventh session; the twenty-eighth session's grid had 8k / 64k / 128k x 1 / 8 / 64 only).
#   bash bench/calls/gpu_call42c.sh TAG CONTEXT...      e.g. gpu_call42c.sh a 8192 32768 (BATCHES="1 8 32 64")
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1; t0=$SECONDS
tag=$1; shift
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$OUT/run_$tag.log"
timeout "${GRID_S:-560}" python3 -W ignore::DeprecationWarning bench/decode.py --contexts "$@" --batches ${BATCHES:-1 8 32 64} \
  --reps 30 --out "$OUT/grid42$tag.json" > "$OUT/grid42$tag.log" 2>&1; rc=$?
echo "grid $tag: rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/run_$tag.log"
grep -E "N= *[0-9]+ B=|Error|failed|^ +[0-9]+ +[0-9]+ " "$OUT/grid42$tag.log" | tail -n 40
exit $rc
