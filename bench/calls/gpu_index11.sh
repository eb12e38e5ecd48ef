#!/usr/bin/env bash
# One device call (eleventh session): GPU tests through the inverted index, then 125M training with
# the tree before (a copy in OLD, carried) and after the change to selection._count_below, in the
# same call: NSA at 64k before/after, dense at 64k (for the ratio), both models at 8k after.
# Usage: bash bench/calls/gpu_index11.sh OLD_TREE
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
OLD=${1:?old tree}; HERE=$PWD
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -d ' '); echo "device $dev"
PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:xdist -rfE tests/test_pallas.py \
  -k "count_below or inverted_index" > "$OUT/tests.log" 2>&1 || rc=1
PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "packed_bf16 or (bf16_matches and 125m and 8192) or (no_nan and auto)" >> "$OUT/tests.log" 2>&1 || rc=1
run() {  # tag dir models point
  (cd "$2" && PYTHONPATH=. timeout 200 python3 bench/train_throughput.py --no-loader --models $3 \
    --points "$4" --steps 8 --out "$OUT/train_${dev}_$1_$(echo "$4" | tr : x).json") \
    >> "$OUT/train.log" 2>&1 || rc=1
}
run before "$HERE/$OLD" nsa_125m 65536:1
run after "$HERE" "nsa_125m dense_125m" 65536:1
run after "$HERE" "nsa_125m dense_125m" 8192:4
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
python3 bench/train_rows.py "$OUT"/train_*.json
exit $rc
