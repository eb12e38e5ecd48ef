"""Selected-block attention (NSA §3.3.2, Eq. 10-12 applied) with the forced blocks taken apart
(``KernelChoices.sel_forced = "tiled"``).

Every query's selection holds the ``n_init`` initial blocks and its ``n_local`` most recent ones
(block j = floor(t / l') and the blocks before it; ``semantics.select_blocks``), and those are
the same for whole runs of consecutive queries: the initial ones for all of them, a local one for
the 2 l' queries of its own and the next block. The query-major kernels (``selection_query``)
load each query's blocks from L2 one query at a time, so at the bench shape 3 of its 16 tile
loads per query are these shared blocks; Nsight Compute puts that forward at 84% of the L2's
throughput (bench/NOTES.md, fourteenth session). Here the selection is split per slot:

* the forced ids of ``idx`` (whichever of them the row selected: a caller's ``block_idx`` need
  not hold them) go to the tiled kernels (``selection_tiled``: a program per (head, tile of
  ``sel_tile_q`` queries) loads the union of its rows' blocks once: here the few forced ones);
* the others to the query-major kernels, whose online softmax starts from the tiled forward's
  (o, lse) (``sel_forward(init=...)``), so the output is written once.

The backward's dQ is the sum of both kernels' dQ (each recomputes its keys' probabilities from
the final lse), and dK/dV come from the inverted index over the whole selection as in
``selection.sel_backward`` (the tiled dK/dV kernel would walk every query tile for block 0 in
one program). The same keys with the same weights: equal to ``selection`` up to float rounding.
Unpacked rows only (``nsa.selection_kernels`` keeps packed rows on the plain kernels).
"""
from __future__ import annotations

import jax.numpy as jnp

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import BlockSizes, idiv
from nsa_jax.pallas.selection import grad_scales, sel_backward
from nsa_jax.pallas.selection_query import sel_forward
from nsa_jax.pallas.selection_tiled import sel_tiled_bwd_dq, sel_tiled_forward, tile_index


def split_forced(idx, cfg: NSAConfig):
    """idx int32 [B,T,G,n] -> (forced, other): the same shape, each slot's id kept in the one
    whose kind it is and -1 in the other. Forced: j < n_init or cur - n_local < j <= cur, cur =
    floor(t / l') (``semantics.select_blocks``' rule), for ids >= 0."""
    T = idx.shape[1]
    idx = idx.astype(jnp.int32)
    cur = idiv(jnp.arange(T, dtype=jnp.int32), cfg.sel_block)[None, :, None, None]
    forced = (idx >= 0) & ((idx < cfg.n_init) | ((idx <= cur) & (idx > cur - cfg.n_local)))
    return jnp.where(forced, idx, -1), jnp.where(forced, -1, idx)


def sel_forward_forced(q, k, v, idx, cfg: NSAConfig, bs: BlockSizes, scale: float,
                       interpret: bool, *, choices=None, seg=None):
    """Same contract as ``selection.sel_forward`` (-> o float32, base-2 lse); unpacked only."""
    if seg is not None:
        raise ValueError("sel_forced='tiled' takes unpacked rows only")
    idx_f, idx_o = split_forced(idx, cfg)
    init = sel_tiled_forward(q, k, v, idx_f, cfg, bs, scale, interpret, choices=choices)
    return sel_forward(q, k, v, idx_o, cfg, bs, scale, interpret, choices=choices, init=init)


def sel_backward_forced(q, k, v, idx, o, lse, do, gs, cfg: NSAConfig, bs: BlockSizes,
                        scale: float, interpret: bool, *, choices=None, seg=None, index=None):
    """Same contract as ``selection.sel_backward`` (-> dq float32, dk, dv in the input dtypes):
    dQ of the forced slots from the tiled dQ kernel, of the others from the per-query one, and
    dK/dV of all from the inverted index (``index``: a prebuilt one, as there)."""
    if seg is not None:
        raise ValueError("sel_forced='tiled' takes unpacked rows only")
    idx_f, idx_o = split_forced(idx, cfg)
    dq, dk, dv = sel_backward(q, k, v, idx, o, lse, do, gs, cfg, bs, scale, interpret,
                              choices=choices, index=index, dq_idx=idx_o)
    gs32, delta = grad_scales(o, do, gs)
    blocks, bcount, _, _ = tile_index(idx_f, q.shape[1], cfg, bs.sel_tile_q)
    return dq + sel_tiled_bwd_dq(q, k, v, idx_f, blocks, bcount, do, gs32, lse, delta, cfg, bs,
                                 scale, interpret, choices=choices), dk, dv
