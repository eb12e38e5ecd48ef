#!/usr/bin/env bash
# One device call (fourteenth session, issue 14): GPU decode tests (φ emission skipping the rows no block
# ends at); the decode loop at 128k/B=64 and 64k/B=8 before ($1: a tree without the φ skip, run with this
# tree's bench/decode.py) and now, rows aligned and --ragged. JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
cp bench/decode.py "$OLD/bench/decode.py"
PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
run() {  # run TAG TREE CONTEXT BATCH MODELS... [--ragged]
  local tag=$1 tree=$2 n=$3 b=$4; shift 4
  (cd "$tree" && PYTHONPATH=. timeout 100 python3 bench/decode.py --models "$@" --contexts $n \
    --batches $b --reps 20 --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1) || rc=1
  echo "$tag: $(grep -E "^(nsa|dense)_125m" "$OUT/$tag.log" | sed -E 's/.*loop +([0-9.]+) ms.*/\1/' | tr '\n' ' ')"
}
run old_128k "$OLD" 131072 64 nsa_125m
run new_128k . 131072 64 nsa_125m dense_125m
run old_128k_ragged "$OLD" 131072 64 nsa_125m --ragged
run new_128k_ragged . 131072 64 nsa_125m --ragged
run old_64k "$OLD" 65536 8 nsa_125m
run new_64k . 65536 8 nsa_125m dense_125m
exit $rc
