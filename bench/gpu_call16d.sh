#!/usr/bin/env bash
# One device call (sixteenth session): this tree (rowsum(O * dO) in the dQ kernel; the index sorted flat)
# against the tree before (.old/pre16 = b95b4d3, carried), each process started inside its tree with
# `python3 -P` (no working directory on sys.path), alternating: the selection backward, the dQ kernel alone
# and the NSA op fwd+bwd at the bench shape, 64k; the index sort variants; GPU parity of the gather path.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0; ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  PYTHONPATH=. timeout ${TEST_S:-200} python3 -m pytest -q -p no:xdist -m gpu -rfE \
    tests/test_pallas_gpu.py -k "bench-8192 or f32_matches or sel_dq_block_with_query" \
    > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
fi
timeout 120 python3 -P bench/index_sort.py --T 65536 > "$OUT/index_sort.log" 2>&1 || rc=1
grep -v "^\s*$" "$OUT/index_sort.log" | tail -11
for tree in .old/pre16 . .old/pre16 .; do
  (cd "$ROOT/$tree" && PYTHONPATH=.:bench timeout 150 python3 -P -c "
import jax, jax.numpy as jnp, nsa_jax
import kernels as k
from nsa_jax.nsa import nsa_attention
print('$tree', 'nsa_jax from', nsa_jax.__file__, flush=True)
k.SWEEP = {'sel_bwd': [{}, {}], 'sel_dq': [{}]}
k.sweep('bench', 65536, 20, lambda s: print('$tree', s, flush=True))
sets = [k.make_inputs(s, 65536, 64, 4, 128) for s in (0, 1)]
def loss(*a):
    return jnp.sum(nsa_attention(*a[:8], k.CFG, impl='pallas').astype(jnp.float32)
                   * a[8].astype(jnp.float32))
f = jax.jit(jax.grad(loss, argnums=tuple(range(8))))
print('$tree', '  nsa_fwd_bwd', round(k.timed(f, sets, 20), 3), 'ms', flush=True)
") >> "$OUT/ab.log" 2>&1 || rc=1
done
grep -E "ms|Error|from" "$OUT/ab.log"
exit $rc
