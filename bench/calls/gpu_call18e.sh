#!/usr/bin/env bash
# One device call (eighteenth session, final tree): the peers table at the bench shape, 64k, with our backward
# under the default and the opt-in sel_dq "ds" (carry .whl and .peers/xunhao; bench/peers_run.sh); on an H200
# also the 64k / B=8 decode step, NSA and dense (no decode code changed since the fifteenth session's H200 point).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
source bench/peers_run.sh
if [[ $gpu == *H200* ]]; then
  PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts 65536 --batches 8 --reps 30 \
    --out "$OUT/dec_64k.json" > "$OUT/dec_64k.log" 2>&1 || rc=1
  grep -hE "^(nsa|dense)_125m|Error" "$OUT/dec_64k.log"
fi
exit $rc
