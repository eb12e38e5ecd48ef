#!/usr/bin/env bash
# One device call (eighteenth session): GPU parity of sel_dq "ds" with dS in the index's entry order (and of
# "block" beside it); the selection backward with "ds" against "query" at the bench shape, 64k, in one process
# (values compared, alternating order), with the op fwd+bwd per mode; the op profiled with "ds" (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "sel_dq_with_query" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=.:bench timeout 200 python3 bench/sel_dq_ab.py --shape bench --T 65536 --modes query ds \
  --rounds 2 --op --out "$OUT/ab.json" > "$OUT/ab.log" 2>&1 || rc=1
cat "$OUT/ab.log" | grep -vE "^\s*$" | tail -12
PYTHONPATH=. timeout 150 python3 bench/profile_op.py --shape bench --T 65536 --top 12 \
  --choices sel_dq=ds --out "$OUT/profile_ds.json" > "$OUT/profile_ds.log" 2>&1 || rc=1
grep -E "device busy|ms " "$OUT/profile_ds.log" | head -16
exit $rc
