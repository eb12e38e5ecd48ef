#!/usr/bin/env bash
# One device call (fifteenth session): the Pallas compressed backward (packed rows' and float32's path; the
# peers table compares it with XunhaoLai's) under tile / warp / stage / split variants, bench shape, 64k.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 400 python3 -c "
import kernels as k
k.SWEEP = {'cmp_bwd': [{}, {'num_warps': 4}, {'cmp_rows': 64}, {'cmp_rows': 64, 'num_warps': 4},
                       {'cmp_bwd_keys': 32}, {'cmp_bwd_keys': 128}, {'num_stages': 3},
                       {'cmp_bwd_split': 8}, {'cmp_bwd_split': 32}, {}]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '10', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "cmp_bwd |FAILED" "$OUT/sweep.log"
exit $rc
