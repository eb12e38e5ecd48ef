#!/usr/bin/env bash
# One device call (twentieth session, issue 14): after the last read's refactor of the one-launch phi kernel, the
# GPU decode tests and the phi-heavy point of call 5 (64k / B=64, rows staggered) at this tree.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 240 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  tests/test_pallas_decode_select.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=. timeout 150 python3 bench/decode.py --models nsa_125m --contexts 65536 --batches 64 --reps 30 \
  --ragged --profile 65536:64 --out "$OUT/new_65536_64.json" > "$OUT/bench.log" 2>&1 || rc=1
grep -E "^nsa_125m|loop profile|Error" "$OUT/bench.log"
python3 -c "
import json; p = json.load(open('$OUT/new_65536_64.json'))['points'][0]['loop_profile']
print('busy', round(p['device_busy_ms_per_step'], 3), [(o['name'], round(1e3 * o['ms_per_step'] / o['calls_per_step'], 1))
      for o in p['top_ops'] if o['name'].startswith('nsa_decode_phi')])"
exit $rc
