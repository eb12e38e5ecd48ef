#!/usr/bin/env bash
# One device call (twenty-fourth session, issue 15): GPU parity after the softmax scale moved into the exponent
# of every training kernel: bf16 against the float32 reference through the whole op (125M and bench shapes;
# every selection route, the local and the Pallas compressed kernels with packed rows), the float32 "highest"
# parity, the selection scores and top-n: all of tests/test_pallas_gpu.py (-v: a timeout keeps the lines so far).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 580 python3 -m pytest -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -v > "$OUT/tests.log" 2>&1 || rc=1
grep -cE " PASSED" "$OUT/tests.log"; grep -E "passed|failed| FAILED|^(FAILED|ERROR)" "$OUT/tests.log"
exit $rc
