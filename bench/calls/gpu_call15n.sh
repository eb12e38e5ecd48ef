#!/usr/bin/env bash
# One device call (fifteenth session): around the compressed backward's best variant of call 21 (64 rows,
# 4 warps), and whether the compressed forward and the scoring kernel (which share cmp_rows) gain from it,
# bench shape, 64k.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 400 python3 -c "
import kernels as k
r = {'cmp_rows': 64, 'num_warps': 4}
k.SWEEP = {'cmp_bwd': [{}, r, dict(r, cmp_bwd_keys=128), dict(r, num_stages=3),
                       {'cmp_rows': 32, 'num_warps': 4}, {'cmp_rows': 32, 'num_warps': 2}, r, {}],
           'cmp_fwd': [{}, r, {}], 'cmp_scores': [{}, {'cmp_rows': 64}, {}]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '10', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "cmp_(bwd|fwd|scores) |FAILED" "$OUT/sweep.log"
exit $rc
