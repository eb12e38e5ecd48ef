#!/usr/bin/env bash
# One device call (thirteenth session, issue 14, last): the decode step at 128k/B=64, the tree before
# ($1) and this tree alternated twice (NSA only, one process each), then this tree with dense (the
# ratio), per token in the 16-token loop; then 64k/B=8 the same way once. JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
run() {  # run TAG TREE CONTEXT BATCH MODELS...
  local tag=$1 tree=$2 n=$3 b=$4; shift 4
  (cd "$tree" && PYTHONPATH=. timeout 120 python3 bench/decode.py --models "$@" --contexts $n \
    --batches $b --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1) || rc=1
  echo "$tag: $(grep -E "^(nsa|dense)_125m" "$OUT/$tag.log" | sed -E 's/.*loop +([0-9.]+) ms.*/\1/' | tr '\n' ' ')"
}
for i in 1 2; do
  run "old_128k_$i" "$OLD" 131072 64 nsa_125m
  run "new_128k_$i" . 131072 64 nsa_125m
done
run new_128k_dense . 131072 64 nsa_125m dense_125m
run old_64k_1 "$OLD" 65536 8 nsa_125m
run new_64k_dense . 65536 8 nsa_125m dense_125m
exit $rc
