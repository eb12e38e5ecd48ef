#!/usr/bin/env bash
# One device call (fourteenth session, issue 14): GPU decode tests; the decode loop at 128k/B=64 before ($1:
# no φ skip, the GraphDef hashed per call, the nnx State flattened per call; timed with this tree's
# bench/decode.py) and now, alternated, one process each, then now with dense (the ratio, and a profile of
# one loop call); 64k/B=8 the same way once. Per token in the 16-token loop. JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
cp bench/decode.py bench/profile_step.py "$OLD/bench/"
PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
run() {  # run TAG TREE CONTEXT BATCH MODELS... [flags]
  local tag=$1 tree=$2 n=$3 b=$4; shift 4
  (cd "$tree" && PYTHONPATH=. timeout 110 python3 bench/decode.py --contexts $n --batches $b \
    --reps 20 --out "$OUT/$tag.json" --models "$@" > "$OUT/$tag.log" 2>&1) || rc=1
  echo "$tag: $(grep -E "^(nsa|dense)_125m" "$OUT/$tag.log" | sed -E 's/.*step +([0-9.]+) ms.*loop +([0-9.]+) ms.*/step \1 loop \2/' | tr '\n' ' ')"
  grep "loop profile" "$OUT/$tag.log"
}
run old_128k_1 "$OLD" 131072 64 nsa_125m
run new_128k_1 . 131072 64 nsa_125m
run old_128k_2 "$OLD" 131072 64 nsa_125m
run new_128k_2 . 131072 64 nsa_125m dense_125m --profile 131072:64
run old_64k "$OLD" 65536 8 nsa_125m
run new_64k . 65536 8 nsa_125m dense_125m
exit $rc
