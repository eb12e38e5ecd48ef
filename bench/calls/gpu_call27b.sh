#!/usr/bin/env bash
# One device call (twenty-seventh session, issues 14 and 15): the skinny decode kernels with the weight stored [N, K]
# (bench/skinny.py variants t=1...), then the 125M train step at 64k / B=1, 8k / B=4 and 2k / B=16, NSA and dense in
# one process (bench/train_throughput.py --steps 8): the issue-15 training targets on this machine.
# Its skinny part needs commit bb0320a's tree (bench/skinny.py, removed after); the train part runs on any tree.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 150 python3 bench/skinny.py --batches 1 8 64 \
  --variants t=1 t=1,bk=512 t=1,bk=128 t=1,bn=32 t=1,warps=8 --out "$OUT/skinny_t.json" > "$OUT/skinny_t.log" 2>&1 || rc=1
echo "skinny done at ${SECONDS}s"
PYTHONPATH=. timeout $((590 - SECONDS)) python3 bench/train_throughput.py --no-loader --models nsa_125m dense_125m \
  --points 65536:1 8192:4 2048:16 --steps 8 --out "$OUT/train.json" > "$OUT/train.log" 2>&1 || rc=1
echo "train done at ${SECONDS}s"
grep busy "$OUT/skinny_t.log" | cut -c1-100
grep -E "^(model|nsa|dense)" "$OUT/train.log" | cut -c1-200
exit $rc
