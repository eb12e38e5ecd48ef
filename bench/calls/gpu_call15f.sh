#!/usr/bin/env bash
# One device call (fifteenth session): an experiment copy of the tree ($1, carried) whose query-major
# selection kernels load K/V tiles through L1 (NSA_EXP_L1=all: every tile with .ca / evict_last; =first:
# the first slot's tile, block 0, so, the rest evict_first; =none: as the product). Selection forward and
# backward at the bench shape, 64k, one process per mode (issue 15).
set -u
EXP=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for mode in ${MODES:-none first all none}; do
  (cd "$EXP" && NSA_EXP_L1=$mode PYTHONPATH=.:bench timeout 200 python3 -c "
import kernels as k
k.SWEEP = {'sel_fwd': [{}], 'sel_bwd': [{}]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep_$mode.json'])" \
    > "$OUT/sweep_$mode.log" 2>&1) || rc=1
  echo "== $mode"; grep -E "sel_(fwd|bwd) |FAILED|Error" "$OUT/sweep_$mode.log" | head -4
done
exit $rc
