#!/usr/bin/env bash
# One device call (fifteenth session): GPU parity with the compressed backward's own tiles (bench 1027 with
# the Pallas compressed kernels), its time against the old tiles, and the peers table at the
# bench shape, 64k (carry .whl and .peers/xunhao).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 300 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "sel_fwd_block and bench" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=.:bench timeout 200 python3 -c "
import kernels as k
old = {'cmp_bwd_rows': 128, 'cmp_bwd_warps': 8}
k.SWEEP = {'cmp_bwd': [{}, old, {}, old]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '10', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "cmp_bwd |FAILED" "$OUT/sweep.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 330 python3 bench/peers.py --shapes bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
sed -n '/^shape/,$p' "$OUT/peers.log" | grep -E "shape|sel_|cmp_|nsa_fwd_bwd|dense_fwd_bwd" | tail -n 14
exit $rc
