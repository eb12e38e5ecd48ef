#!/usr/bin/env bash
# One device call (twenty-eighth session, issue 14) on an H200 (needs_h200: the 128k / B=64 NSA point does not fit
# an H100's 78 GiB): the decode grid of the twentieth session's call 4 (gpu_call20c.sh) at this tree, where the
# dense model's decode attention runs on the Pallas flash-decoding kernel (the fair yardstick since the
# twenty-seventh session). NSA and dense in one process. Then, time permitting, a profile of NSA at 128k / B=64.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 500 python3 bench/decode.py --contexts 8192 65536 131072 --batches 1 8 64 --reps 20 \
  --out "$OUT/grid28.json" > "$OUT/grid28.log" 2>&1; rc=$?
echo "grid: rc=$rc, $((SECONDS - t0)) s"
left=$((570 - (SECONDS - t0)))
if [ "$left" -gt 90 ]; then
  timeout "$left" python3 bench/decode.py --models nsa_125m --contexts 131072 --batches 64 --reps 5 \
    --profile 131072:64 --out "$OUT/prof28.json" > "$OUT/prof28.log" 2>&1 || echo "profile: rc=$?"
  echo "profile: $((SECONDS - t0)) s"
fi
grep -E "N= *[0-9]+ B=|Error|failed|^ +[0-9]+ +[0-9]+ " "$OUT/grid28.log" | tail -n 40
exit $rc
