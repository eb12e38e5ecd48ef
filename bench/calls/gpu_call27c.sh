#!/usr/bin/env bash
# One device call (twenty-seventh session, issues 14 and 15): the decode growth 8k -> 128k at B=8 (bench/decode.py,
# nsa_125m, the XLA dense layers as the product runs them), then the peers table at the bench shape, 64k
# (bench/peers_run.sh: fla-core from the carried .whl, XunhaoLai from .peers/xunhao). Carry .whl and .peers/xunhao.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 110 python3 bench/decode.py --models nsa_125m --contexts 8192 131072 --batches 8 --reps 30 \
  --out "$OUT/decode.json" > "$OUT/decode.log" 2>&1 || rc=1
echo "decode done at ${SECONDS}s"
grep -E "^nsa_125m" "$OUT/decode.log" | cut -c1-140
PEERS_S=$((590 - SECONDS)) source bench/peers_run.sh
echo "peers done at ${SECONDS}s"
exit $rc
