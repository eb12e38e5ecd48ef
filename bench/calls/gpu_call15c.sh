#!/usr/bin/env bash
# One device call (fifteenth session): the inverted dK/dV kernel's tile and launch variants at the bench
# shape, T = 64k (the whole selection backward timed; num_warps / num_stages reach only that kernel in
# it), after Nsight Compute showed it at one 8-warp program per SM (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
k.SWEEP = {'sel_bwd': [{}, {'sel_rows': 64}, {'sel_rows': 64, 'num_warps': 4},
                       {'num_stages': 1}, {'sel_rows': 64, 'num_warps': 4, 'num_stages': 1},
                       {'sel_rows': 64, 'num_warps': 4, 'num_stages': 3},
                       {'sel_rows': 32, 'num_warps': 4}, {'sel_rows': 32, 'num_warps': 2},
                       {'num_warps': 4}, {}]}
k.main(['--shapes', 'bench', '--sweep', '${T:-65536}', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(dq|bwd) |FAILED" "$OUT/sweep.log"
exit $rc
