"""Gaps a mutation survey of ``pallas/selection_query.py`` found in the CPU suite (thirty-fifth
session, bench/NOTES.md; ``pallas/cmp_grouped.py`` showed none); interpret mode, float32,
<= 2e-5 against the reference:

* the query-major selection kernels with an index of n slots other than ``cfg.n_sel`` (the
  documented ``block_idx`` [B,T,G,n]) and more used slots than key sub-tiles per block (the
  (block, sub-tile) step decomposition): forward, per-query dQ, atomic dK/dV and dQ from dS.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.selection import sel_backward, sel_forward
from test_pallas import TOL, _inputs, _rel
from test_selection_block import _random_idx

# l' = 32 in two 16-key sub-tiles; Ts = 5 blocks at T = 150; the index has 5 slots, cfg.n_sel 4
CFG32 = NSAConfig(block_l=8, stride_d=4, sel_block=32, n_sel=5, window=16, n_init=1,
                  n_local=1)
SUB = BlockSizes(sel_q_keys=16, sel_keys=16)


@pytest.mark.parametrize("mode,bs", [
    ("query", SUB),
    ("atomic", SUB),
    ("ds", dataclasses.replace(SUB, sel_q_keys=64)),   # dQ-from-dS kernel: sel_keys sub-tiles
])
def test_query_major_kernels_with_more_slots_than_n_sel_and_sub_tiles(mode, bs):
    """An index of n = 5 slots (distinct ids, -1 slots, blocks past the query) under a config
    whose n_sel is 4, each block walked in 2 sub-tiles: o, dq, dk, dv against the reference."""
    T, h, G = 150, 2, 2
    idx = _random_idx(3, 1, T, G, CFG32)                 # [1, T, G, 5] (CFG32.n_sel = 5)
    assert int((idx >= 0).sum(-1).max()) > 2             # some query uses more slots than 2
    cfg = dataclasses.replace(CFG32, n_sel=4)            # the kernels must go by idx's n
    args, do = _inputs(31, 1, T, h * G, G, cfg)
    q, k, v = args[0], args[3], args[4]
    scale = 1 / math.sqrt(q.shape[-1])
    ch = KernelChoices(sel_impl="gather", sel_fwd="query",
                       sel_dq="ds" if mode == "ds" else "query",
                       sel_bwd="atomic" if mode == "atomic" else "inverted")

    @jax.jit
    def pallas(q, k, v, idx, do):
        o, lse = sel_forward(q, k, v, idx, cfg, bs, scale, True, choices=ch)
        return o, sel_backward(q, k, v, idx, o, lse, do, None, cfg, bs, scale, True,
                               choices=ch)

    @jax.jit
    def reference(q, k, v, idx, do):
        o, vjp = jax.vjp(lambda q, k, v: ref.selection_attention(q, k, v, idx, cfg), q, k, v)
        return o, vjp(do)

    (o, grads), (o_r, grads_r) = pallas(q, k, v, idx, do), reference(q, k, v, idx, do)
    assert _rel(o, o_r) <= TOL
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_r):
        assert float(jnp.abs(b).max()) > 0, name
        assert _rel(a, b) <= TOL, name
