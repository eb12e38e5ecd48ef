#!/usr/bin/env bash
# One device call (issue 14, twelfth session, last): GPU decode tests; the emission sweep
# (bench/phi_decode.py); the decode step before ($1, NSA only) and now (NSA + dense) at 128k/B=64
# (with a profile) and 64k/B=8, XLA's default flags. JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=. timeout 120 python3 bench/phi_decode.py --batches 64 8 \
  --variants xla default "h_tile=64,k_tile=128,stages=2" "rows=16,k_tile=512" \
  --out "$OUT/phi_decode.json" > "$OUT/phi_decode.log" 2>&1 || rc=1
grep "B=" "$OUT/phi_decode.log"
for pt in "131072 64" "65536 8"; do set -- $pt
  (cd "$OLD" && PYTHONPATH=. timeout 120 python3 bench/decode.py --models nsa_125m --contexts $1 \
    --batches $2 --out "$OUT/old_$1_$2.json" > "$OUT/old_$1_$2.log" 2>&1) || rc=1
  prof=(); [[ $1 == 131072 ]] && prof=(--profile 131072:64)
  PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts $1 --batches $2 "${prof[@]}" \
    --out "$OUT/new_$1_$2.json" > "$OUT/new_$1_$2.log" 2>&1 || rc=1
  echo "== $1/$2 before"; grep -E "^nsa_125m" "$OUT/old_$1_$2.log" | tail -n 1
  echo "== $1/$2 now"; grep -E "^(nsa|dense)_125m|^ *$1 " "$OUT/new_$1_$2.log" | tail -n 3
done
exit $rc
