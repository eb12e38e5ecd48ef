#!/usr/bin/env bash
# One device call (thirty-fifth session, issue 15): the 125M training targets at this tree, NSA and dense in one process
# (bench/train_throughput.py --steps 8 at 64k / B=1, 8k / B=4, 2k / B=16), the first H200 run of the training
# rows since the twenty-seventh session (the Mosaic GPU dK/dV at 2k / 4k and the dQ chain have landed since).
#   bash bench/calls/gpu_call35c.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
PYTHONPATH=. timeout 570 python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
  --models nsa_125m dense_125m --points 65536:1 8192:4 2048:16 --steps 8 --out "$OUT/train.json" \
  > "$OUT/train.log" 2>&1 || rc=1
echo "train done at ${SECONDS}s (rc=$rc)"
grep -E "^(model|nsa|dense)" "$OUT/train.log" | cut -c1-200
tail -n 3 "$OUT/train.log" | cut -c1-200
exit $rc
