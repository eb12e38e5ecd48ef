#!/usr/bin/env bash
# One device call (issue 14, twelfth session): GPU decode tests; the decode step before ($1, NSA only) and
# now (NSA + dense) at 128k/B=64 (with a profile) and 64k/B=8, under XLA's default command buffers and with
# them off. Usage: bash bench/calls/gpu_phi12.sh OLD_TREE; JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
(cd "$OLD" && PYTHONPATH=. timeout 150 python3 bench/decode.py --models nsa_125m --contexts 131072 \
  --batches 64 --out "$OUT/old_128k64.json" > "$OUT/old_128k64.log" 2>&1) || rc=1
for flags in default off; do
  F=""; [[ $flags == off ]] && F="--xla_gpu_enable_command_buffer="
  prof=(); [[ $flags == default ]] && prof=(--profile 131072:64)
  XLA_FLAGS="$F" PYTHONPATH=. timeout 170 python3 bench/decode.py --contexts 131072 --batches 64 \
    "${prof[@]}" --out "$OUT/${flags}_128k64.json" > "$OUT/${flags}_128k64.log" 2>&1 || rc=1
  XLA_FLAGS="$F" PYTHONPATH=. timeout 120 python3 bench/decode.py --contexts 65536 --batches 8 \
    --out "$OUT/${flags}_64k8.json" > "$OUT/${flags}_64k8.log" 2>&1 || rc=1
done
echo "== before, default flags"; grep -E "^nsa_125m" "$OUT/old_128k64.log" | tail -n 1
for f in default_128k64 off_128k64 default_64k8 off_64k8; do
  echo "== $f"; grep -E "^ *(131072|65536) " "$OUT/$f.log" | tail -n 1; done
exit $rc
