#!/usr/bin/env bash
# One device call (issue 15, eleventh session): RoPE's custom VJP. 125M training with the tree before
# (a copy in OLD, carried) and after in the same call: NSA at 64k and 8k in each tree, dense at 64k
# after (for the ratio). JSON and logs under $OUT. Usage: bash bench/calls/gpu_rope11.sh OLD_TREE
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
OLD=${1:?old tree}; HERE=$PWD
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -d ' '); echo "device $dev"
run() {  # tag dir models points...
  local tag=$1 dir=$2 models=$3; shift 3
  (cd "$dir" && PYTHONPATH=. timeout 260 python3 bench/train_throughput.py --no-loader --models $models \
    --points "$@" --steps 8 --out "$OUT/train_${dev}_$tag.json") >> "$OUT/train.log" 2>&1 || rc=1
}
run before "$HERE/$OLD" nsa_125m 65536:1 8192:4
run after "$HERE" nsa_125m 65536:1 8192:4
run after_dense "$HERE" dense_125m 65536:1
python3 bench/train_rows.py "$OUT"/train_*.json
exit $rc
