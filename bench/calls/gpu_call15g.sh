#!/usr/bin/env bash
# One device call (fifteenth session): GPU parity of the dS backward (sel_dq = "ds": bench 8192 takes it by
# default; bench 1027 / 2048 and 125M 1027 explicitly, with "block" beside it); the selection backward with
# dS against the per-query dQ at the bench shape, 64k; the op profiled there (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 300 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "bench-8192 or sel_dq_with_query" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
q = {'sel_dq': 'query'}
k.SWEEP = {'sel_bwd': [{}, q, {'sel_warps': 4}, {'sel_stages': 3}, {'sel_warps': 1}, {}, q]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(dq|bwd) |FAILED" "$OUT/sweep.log"
PYTHONPATH=. timeout 200 python3 bench/profile_op.py --shape bench --T 65536 --top 12 \
  --out "$OUT/profile_op.json" 2>&1 | grep -E "device busy|ms " | head -14 || rc=1
exit $rc
