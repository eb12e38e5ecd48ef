#!/usr/bin/env bash
# One device call (fifteenth session): the per-query selection forward (and, through the same fields, the
# dQ kernel) at one warp per program, bench shape, 64k (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
v = [{}, {'sel_warps': 1}, {'sel_warps': 1, 'sel_stages': 3}, {'sel_warps': 1, 'sel_q_keys': 32},
     {'sel_warps': 1, 'sel_q_keys': 32, 'sel_stages': 3}, {'sel_warps': 1, 'sel_q_keys': 32, 'sel_stages': 4}, {}]
k.SWEEP = {'sel_fwd': v, 'sel_bwd': v}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(fwd|bwd) |FAILED" "$OUT/sweep.log"
exit $rc
