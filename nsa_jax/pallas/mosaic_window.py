"""Sliding-window branch (NSA §3.3.3: query t attends keys t - w < s <= t) on Hopper, in Pallas
Mosaic GPU: the tiled selection kernels (``mosaic_tiled``: forward; ``mosaic_tiled_dq``: dQ;
``mosaic_tiled_dkv``: dK/dV) run on the window's fixed block lists instead of a selection's, with
no row bias.

With 64-row query tiles, 64-key blocks and w a multiple of 64, query tile i sees blocks
i - w/64 .. i (fewer near the start): the first of them (when i >= w/64) only through the window's
lower edge (key > row - w: a strict upper triangle of the pair), the last through the causal
diagonal (key <= row), and every block between them whole. The kernels walk each list in three
runs (``mosaic_common.walk``: masked, unmasked, masked); the dK/dV kernel walks block j's tiles
j .. j + w/64 the same way from the other side (its own tile causal first, the tile where the
window opens last). The lists are a function of the shape alone (:func:`window_lists`), built in
XLA as constants: no index, no membership table, no bias loads.

:func:`window_attention_mosaic` is the branch with its own VJP: forward (o in q's dtype and the
base-2 lse), then dQ and dK/dV from the saved lse with delta = rowsum(o * dO). Picked by
``KernelChoices.win_attn`` ("mosaic"; ``window.window_attention``) where
:func:`window_unsupported` allows: ``mosaic_common.operands_unsupported`` (Hopper, bf16/fp16, head
dims 64 / 128, even h, T % 64 = 0) and w a multiple of 64. Unpacked rows only (packed documents
run the document-local kernel).

No interpret mode (Mosaic GPU): on the CPU the tests check the lists against
``semantics.window_visible`` and lower the kernels for CUDA; values are checked on the GPU.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from nsa_jax.pallas.mosaic_common import KEYS, ROWS, STAGES, operands_unsupported, row_vectors
from nsa_jax.pallas.mosaic_tiled import forward_call
from nsa_jax.pallas.mosaic_tiled_dkv import dkv_call
from nsa_jax.pallas.mosaic_tiled_dq import dq_call, dq_stages


def window_unsupported(q, k, v, window: int, interpret: bool) -> str | None:
    """None where :func:`window_attention_mosaic` runs these operands and window, else why not."""
    why = operands_unsupported(q, k, v, interpret)
    if why is not None:
        return why
    if window < KEYS or window % KEYS:
        return f"it takes a window that is a multiple of {KEYS}, got {window}"
    return None


def window_lists(B: int, G: int, T: int, window: int):
    """The window's 64-row tile lists in ``tiled_index``'s layout, int32 constants.

    -> (fwd, bwd), L = min(nw, nqt - 1) + 1. fwd = (blocks [B,G,nqt,L], bcount [B,G,nqt], nfull [B,G,nqt], None): tile
    i lists blocks i - c + 1 .. i, c = min(i, nw) + 1 (nw = w / 64), the first c - 1 of them
    before the tile's first query (nfull; the kernels mask the first one as well when i >= nw,
    ``mosaic_common.edge_count``). bwd = (tiles [B,G,nqt,L], tcount [B,G,nqt], ndiag, nlate,
    None): block j lists tiles j .. j + c - 1, c = min(nqt - 1 - j, nw) + 1; the first is its
    diagonal (ndiag = 1), and from nlate on (the last, when j + nw < nqt) the window's edge.
    Entries past a count are padding (nqt), never read."""
    nqt, nw = T // ROWS, window // KEYS
    i = np.arange(nqt, dtype=np.int32)
    u = np.arange(min(nw, nqt - 1) + 1, dtype=np.int32)     # no list is longer (w > T)
    count = np.minimum(i, nw) + 1
    blocks = np.where(u < count[:, None], (i - count + 1)[:, None] + u, nqt)
    tcount = np.minimum(nqt - 1 - i, nw) + 1
    tiles = np.where(u < tcount[:, None], i[:, None] + u, nqt)
    nlate = np.where(i + nw <= nqt - 1, tcount - 1, tcount)

    def bc(x):   # one small constant, broadcast over (B, G)
        return jnp.broadcast_to(jnp.asarray(x.astype(np.int32)), (B, G) + x.shape)

    fwd = (bc(blocks), bc(count), bc(count - 1), None)
    bwd = (bc(tiles), bc(tcount), bc(np.ones_like(tcount)), bc(nlate), None)
    return fwd, bwd


def _stages(window: int) -> int:
    return max(2, min(STAGES, window // KEYS + 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def window_attention_mosaic(q, k, v, window: int):
    """q [B,T,Hq,D], k/v [B,T,G,D] -> o [B,T,Hq,D] in q's dtype: softmax attention of each
    query over the keys t - w < s <= t (``semantics.window_visible``). Operands must pass
    :func:`window_unsupported` (checked by the caller, ``window.window_attention``)."""
    return _fwd(q, k, v, window)[0]


def _fwd(q, k, v, window: int):
    B, T, Hq, D = q.shape
    fwd_lists, _ = window_lists(B, k.shape[2], T, window)
    o, lse = forward_call(q, k, v, fwd_lists, 1.0 / math.sqrt(D), stages=_stages(window),
                          name="nsa_win_fwd_mgpu", window=window)
    return o, (q, k, v, o, lse)


def _bwd(window: int, res, do):
    q, k, v, o, lse = res
    B, T, Hq, D = q.shape
    fwd_lists, bwd_lists = window_lists(B, k.shape[2], T, window)
    scale = 1.0 / math.sqrt(D)
    # a row reduction of its own: left to XLA it fused into row_vectors' transposing concatenate
    # (one thread per output walking a strided row: 0.20 ms at 125M 2k / B=16, 1.07 at the bench
    # heads 2k / B=8 on an H100; bench/NOTES.md, thirty-second session)
    delta = jax.lax.optimization_barrier(
        jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1))
    rv = row_vectors(lse, delta, jnp.ones_like(delta))
    dq = dq_call(q, k, v, do, rv, fwd_lists, scale,
                 stages=dq_stages(_stages(window), D, v.shape[-1]), name="nsa_win_bwd_dq_mgpu",
                 window=window)
    dk, dv = dkv_call(q, k, v, do, rv, bwd_lists, scale, stages=2, name="nsa_win_bwd_dkv_mgpu",
                      window=window)
    return dq.astype(q.dtype), dk, dv


window_attention_mosaic.defvjp(_fwd, _bwd)
