"""Query-major selected-block attention (NSA §3.3.2, Eq. 10-12 applied): the forward and the
backward's dQ, one program per (query t, KV group g, batch b).

A program loads the h query heads of the group together (padded to >= 16 rows so the dots use
tensor cores), walks the group's n selected blocks of l' keys (ids from ``idx [B,T,G,n]``; -1 =
unused slot) with an online softmax and keeps keys s <= t. The forward writes o (float32) and
the base-2 log-sum-exp per (t, head) for the backward; the dQ kernel recomputes p from that lse,
dS = P * (dO V^T - delta), dQ = dS K, and in ``atomic`` mode (``KernelChoices.sel_bwd``) also
forms each selected block's dK/dV tile and adds it atomically to a float32 accumulator. With
``KernelChoices.sel_dq = "ds"`` dQ = dS K comes instead from the dS the inverted dK/dV kernel
stored (``sel_dq_from_ds``: K loaded, no V, dO, lse or p).

Packed documents (``seg``): ids are document-relative, block j of the query at t is the keys
[p, p + l'), p = start(t) + j*l' (an unaligned ``pl.ds`` load), kept where s <= t.

The loop walks (block, sub-tile) steps of ``BlockSizes.sel_q_keys`` keys: one K/V sub-tile per
step, so Triton's pipeline of ``sel_stages`` stages keeps stages - 1 sub-tile loads in flight
per program (default 64 keys = one step per block; at the bench shape, where Nsight Compute puts
the forward at 84% of the L2's throughput, 32-key steps at one warp and 3 stages gained 3-4%,
which ``BlockSizes.for_shape`` takes for bf16 128-wide heads; bench/NOTES.md, fourteenth and
fifteenth sessions). Tiles of several queries per program, loading once the blocks all of them
selected, were measured and dropped: no faster at the bench shape (thirteenth session).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas import atomics
from nsa_jax.pallas.common import (LOG2E, MIN_DOT, NEG_INF, POS_INF, BlockSizes, compiler_params,
                                   dot, dot_precision, dscores, idiv, load, next_pow2, probs,
                                   sel_sub_tiles, softmax_finish, softmax_init, softmax_step,
                                   store)


def _head_rows(h: int):
    """Rows of a per-query tile: the group's h heads padded to a power of two >= 16."""
    return max(MIN_DOT, next_pow2(h))


def _query_rows(q_ref, h: int, load_q: bool = True):
    """This program's (t, g, b), its tile rows (row_ok, head index per row: the group's h heads,
    padded rows masked), the key-dim range and its query tile q [hp, Dk] (None without
    ``load_q``: ``q_ref`` then only gives the key dim, and may be the dQ output)."""
    t, g, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    r = jnp.arange(_head_rows(h))
    row_ok = r < h
    head = g * h + jnp.where(row_ok, r, 0)
    dk_ = jnp.arange(q_ref.shape[-1])
    q = load(q_ref.at[b, t, head[:, None], dk_[None, :]], row_ok[:, None]) if load_q else None
    return (t, g, b), row_ok, head, dk_, q


def _step_block(idx_ref, b, t, g, i, n_sub: int, l_sel: int, start):
    """Step i of the (block, sub-tile) loop -> (block id j (-1 = unused slot), the block's first
    key, sub-tile index, slot index)."""
    si, sub = (i, 0) if n_sub == 1 else (idiv(i, n_sub), lax.rem(i, jnp.int32(n_sub)))
    j = idx_ref[b, t, g, si]
    base = jnp.maximum(j, 0) * l_sel
    return j, base if start is None else start + base, sub, si


def _key_mask(t, base, valid, sub, bk: int, l_sel: int):
    """[bk] keys of sub-tile ``sub`` of the block starting at ``base`` that the query at t sees:
    valid, inside the block, s <= t."""
    off = sub * bk + jnp.arange(bk)
    return valid & (off < l_sel) & (base + off <= t)


def _sub_tile(k_ref, v_ref, q, b, g, t, base, valid, sub, bk: int, l_sel: int, prec):
    """Sub-tile ``sub`` of the block starting at key ``base`` for the query at t -> (key mask
    [bk], ``_key_mask``; k, v [bk, D] (0 where masked); raw logits q k^T [hp, bk], unscaled
    (the scale enters the exponent: ``common.softmax_step`` / ``probs`` with ``c``) and
    unmasked)."""
    kmask = _key_mask(t, base, valid, sub, bk, l_sel)
    k = load(k_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kmask[:, None])
    v = load(v_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kmask[:, None])
    return kmask, k, v, dot(q, k, trans_b=True, precision=prec)


# ---- forward ---------------------------------------------------------------------------------
def _fwd_kernel(q_ref, k_ref, v_ref, idx_ref, *refs, h, n_sel, l_sel, bk, n_sub, scale, prec,
                packed=False, offset=False):
    if packed:
        st_ref, *refs = refs
    if offset:
        off_ref, *refs = refs
    o_ref, lse_ref = refs
    (t, g, b), row_ok, head, dk_, q = _query_rows(q_ref, h)
    pos = t + off_ref[0] if offset else t     # the query's key position (causal mask)
    hp, Dv = q.shape[0], v_ref.shape[-1]
    dv_ = jnp.arange(Dv)
    c = scale * LOG2E
    start = st_ref[b, t] if packed else None

    def step(i, carry):
        m, l, acc = carry
        j, base, sub, _ = _step_block(idx_ref, b, t, g, i, n_sub, l_sel, start)
        kmask, k, v, s = _sub_tile(k_ref, v_ref, q, b, g, pos, base, j >= 0, sub, bk, l_sel,
                                   prec)
        s = jnp.where(kmask[None, :], s, NEG_INF)
        m, alpha, p, l = softmax_step(m, l, s, c)
        return m, l, acc * alpha[:, None] + dot(p.astype(v.dtype), v, precision=prec)

    m, l, acc = lax.fori_loop(0, n_sel * n_sub, step, softmax_init(hp, Dv))
    l_safe, lse = softmax_finish(m, l)
    o = acc / l_safe[:, None]
    head_st = jnp.where(row_ok, head, o_ref.shape[2])  # masked rows -> out of bounds
    store(o_ref.at[b, t, head_st[:, None], dv_[None, :]], o, row_ok[:, None])
    store(lse_ref.at[b, t, head_st], lse, row_ok)


def sel_forward(q, k, v, idx, cfg: NSAConfig, bs: BlockSizes, scale: float, interpret: bool, *,
                choices: KernelChoices | None = None, seg=None, offset=None):
    """-> o float32 [B,T,Hq,Dv], lse2 float32 [B,T,Hq] (base-2 log-sum-exp of scaled logits,
    +inf for a row with no visible key). ``seg``: packed rows' layout (document-relative idx).
    ``offset`` (int32 [1], traced; unpacked): query row t sits at key position offset + t of
    k/v [B,Tk,G,D] (a continuation chunk over the selection cache, ``pallas.chunk``)."""
    B, T, Hq, Dk = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    h = Hq // G
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_q_keys)
    kernel = functools.partial(_fwd_kernel, h=h, n_sel=idx.shape[-1], l_sel=cfg.sel_block,
                               bk=bk, n_sub=n_sub, scale=scale,
                               prec=dot_precision(q.dtype, interpret, choices),
                               packed=seg is not None, offset=offset is not None)
    extra = (() if seg is None else (seg.start,)) + \
        (() if offset is None else (jnp.asarray(offset, jnp.int32).reshape(1),))
    return pl.pallas_call(
        kernel, grid=(T, G, B),
        out_shape=[jax.ShapeDtypeStruct((B, T, Hq, Dv), jnp.float32),
                   jax.ShapeDtypeStruct((B, T, Hq), jnp.float32)],
        compiler_params=compiler_params(bs.sel_warps, bs.sel_stages),
        interpret=interpret, name="nsa_sel_fwd",
    )(q, k, v, idx, *extra)


# ---- backward: dQ (and dK/dV in "atomic" mode) -------------------------------------------------
def _bwd_q_kernel(q_ref, k_ref, v_ref, idx_ref, do_ref, lse_ref, delta_ref, *refs, h, n_sel,
                  l_sel, bk, n_sub, scale, prec, atomic, packed=False):
    if packed:
        st_ref, *refs = refs
    if atomic:
        _dk_in, _dv_in, dq_ref, dk_ref, dv_ref = refs
    else:
        (dq_ref,) = refs
    (t, g, b), row_ok, head, dk_, q = _query_rows(q_ref, h)
    hp, Dk, Dv = q.shape[0], q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    dv_ = jnp.arange(Dv)
    do = load(do_ref.at[b, t, head[:, None], dv_[None, :]], row_ok[:, None]).astype(cdt)
    lse = load(lse_ref.at[b, t, head], row_ok, POS_INF)
    delta = load(delta_ref.at[b, t, head], row_ok)
    c = scale * LOG2E
    start = st_ref[b, t] if packed else None

    def step(i, dq):
        j, base, sub, _ = _step_block(idx_ref, b, t, g, i, n_sub, l_sel, start)
        # a block starting past t has no visible key; its (zero) atomic tiles go to 0, not past
        # the accumulator (a caller's block_idx may name one)
        valid = (j >= 0) & (base <= t)
        base = jnp.where(valid, base, 0)
        kmask, k, v, s = _sub_tile(k_ref, v_ref, q, b, g, t, base, valid, sub, bk, l_sel, prec)
        p = probs(s, kmask[None, :], lse, c)
        ds = dscores(p, do, v, None, delta, prec)   # the gate is in p (common.fold_gate)
        dq = dq + dot(ds.astype(cdt), k, precision=prec)
        if atomic:
            dv_t = dot(p.astype(cdt), do, trans_a=True, precision=prec)
            dk_t = dot(ds.astype(cdt), q, trans_a=True, precision=prec) * scale
            atomics.add(dk_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dk)), dk_t)
            atomics.add(dv_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dv)), dv_t)
        return dq

    dq = lax.fori_loop(0, n_sel * n_sub, step, jnp.zeros((hp, Dk), jnp.float32))
    head_st = jnp.where(row_ok, head, dq_ref.shape[2])
    store(dq_ref.at[b, t, head_st[:, None], dk_[None, :]], dq * scale, row_ok[:, None])


def sel_dq(q, k, v, idx, do, lse, delta, cfg: NSAConfig, bs: BlockSizes, prec, scale: float,
           interpret: bool, *, seg=None, acc=None):
    """dQ float32 [B,T,Hq,Dk] of the selection branch (``lse``, ``delta`` with the gate folded
    in: ``common.fold_gate``); with ``acc`` (float32 dK, dV accumulators) the "atomic" variant:
    -> (dq, dk_acc, dv_acc) with every selected block's dK/dV tiles added."""
    B, T, Hq, Dk = q.shape
    G = k.shape[2]
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_q_keys)
    segs = () if seg is None else (seg.start,)
    kern = functools.partial(_bwd_q_kernel, h=Hq // G, n_sel=idx.shape[-1], l_sel=cfg.sel_block,
                             bk=bk, n_sub=n_sub, scale=scale, prec=prec, atomic=acc is not None,
                             packed=seg is not None)
    dq_shape = jax.ShapeDtypeStruct((B, T, Hq, Dk), jnp.float32)
    params = dict(grid=(T, G, B), interpret=interpret,
                  compiler_params=compiler_params(bs.sel_warps, bs.sel_stages))
    args = (q, k, v, idx, do, lse, delta, *segs)
    if acc is None:
        return pl.pallas_call(kern, out_shape=dq_shape, name="nsa_sel_bwd_dq", **params)(*args)
    n_in = len(args)
    return pl.pallas_call(
        kern, out_shape=[dq_shape, jax.ShapeDtypeStruct(acc[0].shape, jnp.float32),
                         jax.ShapeDtypeStruct(acc[1].shape, jnp.float32)],
        input_output_aliases={n_in: 1, n_in + 1: 2}, name="nsa_sel_bwd_atomic", **params,
    )(*args, *acc)


# ---- backward: dQ from the inverted dK/dV kernel's dS (KernelChoices.sel_dq = "ds") -----------
def _dq_ds_kernel(k_ref, idx_ref, pos_ref, ds_ref, dq_ref, *, h, n_sel, l_sel, bk, n_sub, scale,
                  prec):
    """dQ of one (query t, group g, row b) = sum over its selected blocks of dS K (the gradient
    of Eq. 10's selected-block attention through the scores), dS [h, l'] per slot as the dK/dV
    kernel stored it (the input dtype: the rounding the per-query kernel's dot takes) at rows
    pos*h .. of the (b, g) buffer, pos = the entry's place in the index. Unused slots (never
    written) and blocks starting past t (left out of the index, so never written) are masked,
    not read."""
    (t, g, b), row_ok, head, dk_, _ = _query_rows(dq_ref, h, load_q=False)
    G = dq_ref.shape[2] // h
    hp = row_ok.shape[0]

    def step(i, dq):
        j, base, sub, si = _step_block(idx_ref, b, t, g, i, n_sub, l_sel, None)
        kmask = _key_mask(t, base, j >= 0, sub, bk, l_sel)   # a block past t: all masked
        k = load(k_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kmask[:, None])
        # rows p*h .. p*h + hp - 1 (the padded head rows masked; the buffer's pad keeps them in
        # bounds): contiguous, as the dK/dV kernel stored them
        row = pos_ref[b, g, t * n_sel + si] * h
        ds = load(ds_ref.at[b * G + g, pl.ds(row, hp), pl.ds(sub * bk, bk)],
                  row_ok[:, None] & kmask[None, :])
        return dq + dot(ds, k, precision=prec)

    dq = lax.fori_loop(0, n_sel * n_sub, step, jnp.zeros((hp, k_ref.shape[-1]), jnp.float32))
    head_st = jnp.where(row_ok, head, dq_ref.shape[2])
    store(dq_ref.at[b, t, head_st[:, None], dk_[None, :]], dq * scale, row_ok[:, None])


def sel_dq_from_ds(k, idx, ds, pos, h: int, cfg: NSAConfig, bs: BlockSizes, prec, scale: float,
                   interpret: bool):
    """dQ float32 [B,T,G*h,Dk] from ``ds`` [B*G, T*n*h + pad, L] (``selection.sel_backward`` with
    ``KernelChoices.sel_dq = "ds"``: entry p of the (b, g) index row at rows p*h .. p*h + h - 1,
    columns in the dK/dV kernel's ``bs.sel_keys`` sub-tiles) and ``pos`` [B,G,T*n], each (query,
    slot) entry's place in the index. Loads each selected block's K once per (query, group): half
    the per-query dQ kernel's tile bytes (no V), and no p recomputed."""
    B, T, G, n = idx.shape
    Dk = k.shape[-1]
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_keys)
    kern = functools.partial(_dq_ds_kernel, h=h, n_sel=n, l_sel=cfg.sel_block, bk=bk,
                             n_sub=n_sub, scale=scale, prec=prec)
    return pl.pallas_call(
        kern, grid=(T, G, B),
        out_shape=jax.ShapeDtypeStruct((B, T, G * h, Dk), jnp.float32),
        compiler_params=compiler_params(bs.sel_warps, bs.sel_stages),
        interpret=interpret, name="nsa_sel_bwd_dq_ds",
    )(k, idx, pos, ds)
