#!/usr/bin/env bash
# One device call (issue 14, twelfth session): GPU decode tests; the decode kernels alone, tree
# before ($1) and now (bench/decode_kernels.py); the whole decode step at 128k/B=64 before (NSA only)
# and now (NSA + dense, with a profile). Usage: bash bench/calls/gpu_decode12.sh OLD_TREE; JSON under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=. timeout 240 python3 bench/decode_kernels.py --points 131072:64 65536:8 \
  --tree "$OLD" --out "$OUT/kern_old.json" > "$OUT/kern_old.log" 2>&1 || rc=1
PYTHONPATH=. timeout 240 python3 bench/decode_kernels.py --points 131072:64 65536:8 \
  --out "$OUT/kern_new.json" > "$OUT/kern_new.log" 2>&1 || rc=1
(cd "$OLD" && PYTHONPATH=. timeout 240 python3 bench/decode.py --models nsa_125m --contexts 131072 \
  --batches 64 --out "$OUT/dec_old.json" > "$OUT/dec_old.log" 2>&1) || rc=1
PYTHONPATH=. timeout 300 python3 bench/decode.py --contexts 131072 --batches 64 \
  --profile 131072:64 --out "$OUT/dec_new.json" > "$OUT/dec_new.log" 2>&1 || rc=1
echo "== kernels before"; grep -v "^{" "$OUT/kern_old.log" | tail -n 8
echo "== kernels now"; grep -v "^{" "$OUT/kern_new.log" | tail -n 8
echo "== step before"; tail -n 4 "$OUT/dec_old.log"
echo "== step now"; tail -n 8 "$OUT/dec_new.log"
exit $rc
