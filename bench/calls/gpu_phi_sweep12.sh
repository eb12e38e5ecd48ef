#!/usr/bin/env bash
# One device call (issue 14, twelfth session): the decode emission's tile sweep alone
# (bench/phi_decode.py; XLA's form against pallas.phi_decode variants). JSON and log under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
VARS=${1:-"xla default rows=16 h_tile=32 h_tile=16 k_tile=256 rows=16,k_tile=512 stages=3 stages=4 h_tile=32,k_tile=256,stages=3 warps=8 h_tile=16,k_tile=512,rows=16"}
timeout 300 python3 bench/phi_decode.py --batches 64 8 --variants $VARS --out "$OUT/phi_decode.json" \
  > "$OUT/phi_decode.log" 2>&1; rc=$?
grep "B=" "$OUT/phi_decode.log"; tail -n 3 "$OUT/phi_decode.log"
exit $rc
