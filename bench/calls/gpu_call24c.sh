#!/usr/bin/env bash
# One device call (twenty-fourth session, issue 15): the GPU parity tests call 2 ran out of time for (packed rows
# through the local, Pallas compressed and selection kernels; cuDNN compressed attention), then the 125M train
# step's device busy time for this tree, NSA and dense in one process, at 2k / B=16 and 8k / B=4
# (bench/profile_step.py, --steps 2).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -v -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "packed_bf16 or cmp_attn_cudnn" > "$OUT/tests.log" 2>&1 || rc=1
grep -cE " PASSED" "$OUT/tests.log"; grep -E "passed|failed| FAILED|^(FAILED|ERROR)" "$OUT/tests.log"
echo "tests done at ${SECONDS}s"
PYTHONPATH=. timeout $((585 - SECONDS)) python3 bench/profile_step.py --models nsa_125m dense_125m \
  --points 2048:16 8192:4 --steps 2 --top 40 --out "$OUT/step.json" > "$OUT/step.log" 2>&1 || rc=1
grep -E "^== " "$OUT/step.log"
echo "done at ${SECONDS}s"
exit $rc
