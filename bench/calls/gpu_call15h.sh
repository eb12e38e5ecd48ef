#!/usr/bin/env bash
# One device call (fifteenth session): the dS backward's dK/dV kernel (it stores dS) under tile / warp /
# stage variants, bench shape, 64k (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
k.SWEEP = {'sel_bwd': [{}, {'sel_dq': 'query'}, {'num_stages': 1}, {'sel_rows': 32},
                       {'sel_rows': 32, 'num_stages': 1}, {'sel_bwd_warps': 8},
                       {'sel_rows': 128, 'sel_bwd_warps': 8}, {'num_stages': 3}]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '10', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(dq|bwd) |FAILED" "$OUT/sweep.log"
exit $rc
