#!/usr/bin/env bash
# One device call (fifteenth session): GPU parity with the new dK/dV tiles (bench 8192: the gather kernels
# at h = 16, D = 128; the per-query forward + fused dQ pair); the selection backward with the new and the old
# dK/dV tiles and chunk variants at the bench shape, 64k; the peers table at the bench shape, 64k
# (bench/peers.py; carry .whl with fla-core and .peers/xunhao). JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "bench-8192 or sel_dq_block_with_query" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
old = {'sel_rows': 128, 'sel_bwd_warps': 8}
k.SWEEP = {'sel_bwd': [{}, old, {'sel_chunk': 512}, {'sel_chunk': 2048}, {'sel_stages': 3},
                       {}, old]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(dq|bwd) |FAILED" "$OUT/sweep.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 400 python3 bench/peers.py --shapes bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 30
exit $rc
