#!/usr/bin/env bash
# One device call (fifteenth session): the selection backward's per-query dQ kernel (warps, stages, key
# steps: the fields it shares with the forward) and the dK/dV kernel's chunk / stages, bench shape, 64k.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
k.SWEEP = {'sel_bwd': [{}, {'sel_warps': 2}, {'sel_warps': 2, 'sel_stages': 2},
                       {'sel_q_keys': 64, 'sel_warps': 2, 'sel_stages': 2}, {'sel_stages': 4},
                       {'sel_chunk': 512}, {'num_stages': 3}, {}]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(dq|bwd) |FAILED" "$OUT/sweep.log"
exit $rc
