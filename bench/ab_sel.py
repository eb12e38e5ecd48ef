"""One tree's selection backward, its dQ kernel and the NSA op fwd+bwd at the bench shape, 64k (GPU).

    (cd TREE && PYTHONPATH=.:bench python3 -P /path/to/bench/ab_sel.py LABEL)

For before/after comparisons of whole trees in one device call, one process per tree: ``-P`` keeps
the working directory and this script's folder off ``sys.path``, so ``nsa_jax`` and ``kernels``
come from TREE (printed). Prints the ``bench/kernels.py`` sweep lines of groups ``sel_bwd`` (twice)
and ``sel_dq`` with the tree's defaults, then the op's median ms, each line prefixed by LABEL.
"""
import sys

import jax
import jax.numpy as jnp
import kernels as k
import nsa_jax
from nsa_jax.nsa import nsa_attention

label = sys.argv[1] if len(sys.argv) > 1 else "tree"
print(label, "nsa_jax from", nsa_jax.__file__, flush=True)
k.SWEEP = {"sel_bwd": [{}, {}], "sel_dq": [{}]}
k.sweep("bench", 65536, 20, lambda s: print(label, s, flush=True))
sets = [k.make_inputs(s, 65536, 64, 4, 128) for s in (0, 1)]


def loss(*a):
    return jnp.sum(nsa_attention(*a[:8], k.CFG, impl="pallas").astype(jnp.float32)
                   * a[8].astype(jnp.float32))


f = jax.jit(jax.grad(loss, argnums=tuple(range(8))))
print(label, "  nsa_fwd_bwd", round(k.timed(f, sets, 20), 3), "ms", flush=True)
