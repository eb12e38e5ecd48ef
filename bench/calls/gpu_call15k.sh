#!/usr/bin/env bash
# One device call (fifteenth session, final tree, part 2 of 2, on the H200 part 1 held): the selection
# kernels with this session's tiles against the tree before's (the same fields set back) at the bench shape,
# 64k; the peers table there (bench/peers.py; carry .whl with fla-core and .peers/xunhao) (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 200 python3 -c "
import kernels as k
old = {'sel_rows': 128, 'sel_bwd_warps': 8, 'sel_warps': 2, 'sel_q_keys': 64, 'sel_stages': 2}
k.SWEEP = {'sel_fwd': [{}, old, {}, old], 'sel_bwd': [{}, old, {}, old]}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(fwd|bwd) |FAILED" "$OUT/sweep.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 330 python3 bench/peers.py --shapes bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 22
exit $rc
