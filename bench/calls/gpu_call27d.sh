#!/usr/bin/env bash
# One device call (twenty-seventh session, issue 14): the dense model's decode attention, XLA vs the Pallas
# flash-decoding kernel (bench/decode_dense.py, 64k / B=8 and B=1), its GPU parity tests, then the dense decode loop
# at 64k / B=8 with it (bench/decode.py, time permitting: the session's device budget is nearly spent).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 60 python3 bench/decode_dense.py --points 65536:8 65536:1 --out "$OUT/decode_dense.json" \
  > "$OUT/decode_dense.log" 2>&1 || rc=1
cat "$OUT/decode_dense.log" | grep busy
timeout 50 python3 -m pytest -q -m gpu tests/test_decode_dense.py > "$OUT/tests.log" 2>&1 || rc=1
tail -1 "$OUT/tests.log"
PYTHONPATH=. timeout 60 python3 bench/decode.py --models dense_125m --contexts 65536 --batches 8 --reps 30 \
  --out "$OUT/decode.json" > "$OUT/decode.log" 2>&1 || rc=1
grep -E "^dense_125m" "$OUT/decode.log" | cut -c1-140
exit $rc
