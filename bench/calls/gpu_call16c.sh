#!/usr/bin/env bash
# One device call (sixteenth session): rowsum(O * dO) formed in the per-query dQ kernel (no XLA pass for
# delta or the selection gate's gradient) against the tree before (.old/pre16 = b95b4d3, carried), one
# process per tree, alternating: the selection backward and the dQ kernel alone (bench/kernels.py sweep
# groups), and the NSA op fwd+bwd, bench shape 64k; the index sort variants (bench/index_sort.py);
# GPU parity of the gather path (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout ${TEST_S:-200} python3 -m pytest -q -p no:xdist -m gpu -rfE \
  tests/test_pallas_gpu.py -k "bench-8192 or f32_matches or sel_dq_block_with_query" \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
timeout 120 python3 bench/index_sort.py --T 65536 > "$OUT/index_sort.log" 2>&1 || rc=1
cat "$OUT/index_sort.log" | grep -v "^\s*$" | tail -6
for tree in .old/pre16 . .old/pre16 .; do
  PYTHONPATH=$tree:$tree/bench timeout 150 python3 -c "
import math, jax, jax.numpy as jnp
import kernels as k
from nsa_jax.nsa import nsa_attention
k.SWEEP = {'sel_bwd': [{}, {}], 'sel_dq': [{}]}
k.sweep('bench', 65536, 20, lambda s: print('$tree', s, flush=True))
sets = [k.make_inputs(s, 65536, 64, 4, 128) for s in (0, 1)]
def loss(*a):
    return jnp.sum(nsa_attention(*a[:8], k.CFG, impl='pallas').astype(jnp.float32)
                   * a[8].astype(jnp.float32))
f = jax.jit(jax.grad(loss, argnums=tuple(range(8))))
print('$tree', '  nsa_fwd_bwd', round(k.timed(f, sets, 20), 3), 'ms', flush=True)
" >> "$OUT/ab.log" 2>&1 || rc=1
done
grep -E "ms|Error" "$OUT/ab.log"
exit $rc
