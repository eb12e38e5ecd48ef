#!/usr/bin/env bash
# One device call (eighteenth session): the inverted dK/dV kernel's work items by query span
# (BlockSizes.sel_span) against none, with "query" and "ds", bench shape, 64k, one process
# (bench/sel_dq_ab.py); the tree before (.old/pre18 = git archive of b41f05d: nsa_jax, bench/kernels.py;
# carried) in its own process for the count > 0 guard; GPU parity of the span path.
# (sel_span and its GPU test exist only in commit fe9dcb7, reverted in the next commit: run it there.)
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0; ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
(cd .old/pre18 && PYTHONPATH=.:bench timeout 100 python3 -P "$ROOT/bench/sel_dq_ab.py" --shape bench \
  --T 65536 --rounds 2 --modes query --out "$OUT/ab_pre.json") > "$OUT/ab_pre.log" 2>&1 || rc=1
sed 's/^/pre18 /' "$OUT/ab_pre.log" | grep -E "sel_bwd|Error"
PYTHONPATH=.:bench timeout 260 python3 bench/sel_dq_ab.py --shape bench --T 65536 --rounds 2 --modes query \
  query:sel_span=4096 query:sel_span=8192 query:sel_span=16384 ds:sel_span=8192 ds \
  --out "$OUT/ab.json" > "$OUT/ab.log" 2>&1 || rc=1
grep -E "rrmse|sel_bwd|Error" "$OUT/ab.log"
PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "sel_span" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
exit $rc
