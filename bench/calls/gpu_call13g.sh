#!/usr/bin/env bash
# One device call (thirteenth session, issue 15): does the query-major selection forward wait on its
# block-id loads? The forward at the bench shape, T = 64k (bench/kernels.py --sweep), in this tree and in a
# copy whose forward loads a query's n ids once as a vector and takes each from registers (an ablation:
# /tmp/abl_ids). JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
d=/tmp/abl_ids; rm -rf "$d"; mkdir -p "$d"; cp -r nsa_jax bench "$d/"
python3 - "$d/nsa_jax/pallas/selection_query.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = """    def block(si, carry):
        m, l, acc = carry
        j = idx_ref[b, t, g, si]"""
new = """    slots = jnp.arange(max(2, next_pow2(n_sel)))
    ids = load(idx_ref.at[b, t, g, jnp.minimum(slots, n_sel - 1)], slots < n_sel, -1)

    def block(si, carry):
        m, l, acc = carry
        j = jnp.sum(jnp.where(slots == si, ids, 0))"""
assert s.count(old) == 1, "pattern"
open(p, "w").write(s.replace(old, new))
PY
sweep() {  # $1 tree, $2 tag
  (cd "$1" && PYTHONPATH=.:bench timeout 200 python3 -c "
import kernels as k
k.SWEEP = {'sel_fwd': [{}, {'sel_stages': 3}], 'sel_bwd': []}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/$2.json'])") \
    > "$OUT/$2.log" 2>&1 || rc=1
  echo "== $2"; grep -E "sel_fwd " "$OUT/$2.log"
}
sweep . now
sweep "$d" ids_in_registers
exit $rc
