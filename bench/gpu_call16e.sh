#!/usr/bin/env bash
# One device call (sixteenth session): this tree against itself without the rowsum change (.old/norow:
# cf4cd25 reverted on f6a2ecb, carried), one process each started inside its tree with `python3 -P`: the
# selection backward, the dQ kernel and the NSA op at the bench shape, 64k; then the peers table there
# (bench/peers.py; carry .whl with fla-core and .peers/xunhao) (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0; ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for tree in ${TREES:-.old/norow .}; do
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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 330 python3 -P bench/peers.py --shapes bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 22
exit $rc
