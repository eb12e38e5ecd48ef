#!/usr/bin/env bash
# One device call (fifteenth session): GPU parity of the per-query forward with dQ formed in the
# dK/dV kernel (sel_dq = "block") at the bench shape; the selection backward's variants and the
# per-query dQ kernel alone at the bench shape, T = 64k (issue 15); the decode step at 64k / B=8 with a
# profiled step and loop call (issue 14). JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "sel_dq_block_with_query" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
big = 32768.0
k.SWEEP = {'sel_dq': [{}],
           'sel_bwd': [{}, {'sel_dq': 'block', 'sel_partial_mib': big},
                       {'sel_dq': 'block', 'sel_partial_mib': big, 'sel_dq_rows': 128},
                       {'sel_dq': 'block', 'sel_partial_mib': big, 'sel_dq_rows': 32},
                       {'sel_dq': 'block', 'sel_partial_mib': big, 'num_warps': 4},
                       {'sel_dq': 'block', 'sel_partial_mib': big, 'num_stages': 3},
                       {'sel_dq': 'block', 'sel_partial_mib': 4096.0},
                       {'sel_dq': 'block'}, {}]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(dq|bwd) |FAILED" "$OUT/sweep.log"
PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/dec64k8.json" > "$OUT/dec64k8.log" 2>&1 || rc=1
grep -E "^(nsa|dense)_125m|loop profile|Error" "$OUT/dec64k8.log"
exit $rc
