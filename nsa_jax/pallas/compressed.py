"""Compressed-token attention (NSA Eq. 8): Pallas kernels (the fused block scoring of Eq. 9-10
that reuses this forward's lse is ``scoring.py``).

Rows of every tile are (query, head) pairs of one KV group: ``rows // h`` consecutive queries x
the group's h heads, so the heads sharing a compressed key are computed from one K/V load.
Compressed block i covers tokens [i*d, i*d + l) and is visible to query t iff i*d + l - 1 <= t.

* forward: flash attention over the visible compressed keys -> o (float32) and the base-2
  log-sum-exp per (t, head) (also returned, so the scoring pass can reuse it);
* backward: dQ per query tile and dK/dV per compressed-key tile (FlashAttention-2 style), from
  the saved lse and delta = rowsum(dO * O); the query range of a dK/dV tile can be split over
  several programs whose partial sums meet in float32 atomic adds
  (``KernelChoices.cmp_bwd_split``). A cotangent on the returned lse is honoured
  (d lse / d s = p).

Packed documents (``seg``, a ``semantics.SegmentLayout``; None = one document per row, which
compiles exactly the unpacked kernels): the query at t sees slot i iff 0 <= i - lo(t) and
(i - lo(t))*d + l - 1 <= r(t) (Eq. 8 in document-relative coordinates, lo = ``cmp_lo``,
r = ``rel``). The visible slots of a tile are the one range [lo(first row), lo(last row) +
Tc(r(last row) + 1)) (both ends are non-decreasing in t), so the forward and dQ loops only move
their start; the dK/dV tile of slots walks the query tiles from the first token that sees its
first slot to the end of its last slot's document.
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
from nsa_jax.pallas.common import (LOG2E, MIN_DOT, NEG_INF, POS_INF, BlockSizes, cdiv,
                                   choices_or_default, compiler_params, dkv_accumulate, dot,
                                   dot_precision, dscores, idiv, load,
                                   next_pow2, probs, softmax_finish,
                                   softmax_init, softmax_step, store)


def _tile_rows(h: int, bs: BlockSizes, backward: bool = False) -> int:
    """(query, head) rows per compressed-attention tile: ``cmp_rows``, or the backward's own
    ``cmp_bwd_rows`` where set; at least the group's h heads."""
    rows = bs.cmp_bwd_rows if backward and bs.cmp_bwd_rows is not None else bs.cmp_rows
    return max(rows, next_pow2(h))


def _rows(qt, g, h: int, rows: int, T: int, hs: int | None = None, head_major: bool = False):
    """Row r of query tile qt -> (query-in-tile, head, position t (0 where masked), valid).

    Rows hold rows // hs queries with hs >= h row slots each (the last hs - h slots masked):
    row r = qi * hs + head slot, or with ``head_major`` r = head slot * (rows // hs) + qi (the
    scoring kernel's rows layout, where a query's heads then sum without lane shuffles:
    ``scoring``). The scoring kernel's loop layout calls it with hs = 1: one row per query,
    head g*h (its slot 0), and adds each of the group's heads to that itself.
    """
    hs = hs or h
    bq = rows // hs
    r = jnp.arange(rows)
    if head_major:
        hd = idiv(r, bq)
        qi = r - hd * bq
    else:
        qi = idiv(r, hs)
        hd = r - qi * hs
    t = qt * bq + qi
    ok = (qi < bq) & (t < T) & (hd < h)
    return qi, g * h + jnp.where(hd < h, hd, 0), jnp.where(ok, t, 0), ok


def _num_visible(t, d: int, l: int, Tc: int):
    """Number of compressed blocks visible to position t: #{i : i*d + l - 1 <= t}."""
    n = idiv(jnp.maximum(t - (l - 1), 0), d) + 1
    return jnp.where(t >= l - 1, jnp.minimum(n, Tc), 0)


def _seg_rows(lo_ref, rel_ref, b, t, ok):
    """Per-row (cmp_lo, rel) of a packed row (0 where masked)."""
    return load(lo_ref.at[b, t], ok), load(rel_ref.at[b, t], ok)


def _packed_range(lo_ref, rel_ref, b, t_first, t_last, d: int, l: int, Tc: int):
    """Slots [lo(t_first), lo(t_last) + Tc(r(t_last) + 1)) seen by queries t_first..t_last."""
    return lo_ref[b, t_first], lo_ref[b, t_last] + _num_visible(rel_ref[b, t_last], d, l, Tc)


def _tile_keys(seg_refs, b, qt, bq: int, t, ok, d: int, l: int, T: int, Tc: int, bk: int):
    """Key loop of a query tile (rows at t, valid ok): -> (first key tile, end of the visible
    slots, per-row lo (None unpacked), per-row position for Eq. 8 (t, or r(t) packed)).
    ``seg_refs``: (cmp_lo, rel) refs of packed rows, None unpacked."""
    t_last = jnp.minimum(qt * bq + bq - 1, T - 1)
    if seg_refs is None:
        return 0, _num_visible(t_last, d, l, Tc), None, t
    lo_ref, rel_ref = seg_refs
    lo, rel = _seg_rows(lo_ref, rel_ref, b, t, ok)
    first, n_vis = _packed_range(lo_ref, rel_ref, b, qt * bq, t_last, d, l, Tc)
    return idiv(first, bk), n_vis, lo, rel


def _visible(i, t, ok, imask, d: int, l: int, lo=None):
    """[rows, keys] bool: row (position t, valid ok) sees slot i (Eq. 8); packed: t is r(t) and
    slot i is document block i - lo."""
    if lo is None:
        return ok[:, None] & imask[None, :] & (i[None, :] * d + (l - 1) <= t[:, None])
    blk = i[None, :] - lo[:, None]
    return ok[:, None] & imask[None, :] & (blk >= 0) & (blk * d + (l - 1) <= t[:, None])


def _load_rows(ref, b, t, head, ok, D):
    dd = jnp.arange(D)
    return load(ref.at[b, t[:, None], head[:, None], dd[None, :]], ok[:, None])


def _store_rows(ref, val, b, t, head, ok):
    dd = jnp.arange(val.shape[-1])
    t_st = jnp.where(ok, t, ref.shape[1])  # masked rows -> out of bounds (dropped)
    store(ref.at[b, t_st[:, None], head[:, None], dd[None, :]], val, ok[:, None])


# ---- forward ---------------------------------------------------------------------------------
def _fwd_kernel(q_ref, k_ref, *refs, h, rows, bk, d, l, scale, prec, with_o, packed=False):
    if packed:
        seg_refs, refs = refs[:2], refs[2:]
    else:
        seg_refs = None
    if with_o:
        v_ref, o_ref, lse_ref = refs
    else:
        (lse_ref,) = refs
    qt, g, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    T, Tc, Dk = q_ref.shape[1], k_ref.shape[1], q_ref.shape[-1]
    bq = rows // h
    _, head, t, ok = _rows(qt, g, h, rows, T)
    q = _load_rows(q_ref, b, t, head, ok, Dk)
    kt0, n_vis, lo, tv = _tile_keys(seg_refs, b, qt, bq, t, ok, d, l, T, Tc, bk)
    c = scale * LOG2E
    Dv = v_ref.shape[-1] if with_o else MIN_DOT

    def step(kt, carry):
        m, lsum, acc = carry
        i = kt * bk + jnp.arange(bk)
        imask = i < n_vis
        k = load(k_ref.at[b, pl.ds(kt * bk, bk), g, :], imask[:, None])
        s = dot(q, k, trans_b=True, precision=prec)   # raw; scaled in the exponent
        vis = _visible(i, tv, ok, imask, d, l, lo)
        s = jnp.where(vis, s, NEG_INF)
        m, alpha, p, lsum = softmax_step(m, lsum, s, c)
        if with_o:
            v = load(v_ref.at[b, pl.ds(kt * bk, bk), g, :], imask[:, None])
            acc = acc * alpha[:, None] + dot(p.astype(v.dtype), v, precision=prec)
        return m, lsum, acc

    m, lsum, acc = lax.fori_loop(kt0, idiv(n_vis + (bk - 1), bk), step, softmax_init(rows, Dv))
    l_safe, lse = softmax_finish(m, lsum)
    t_st = jnp.where(ok, t, T)
    store(lse_ref.at[b, t_st, head], lse, ok)
    if with_o:
        _store_rows(o_ref, acc / l_safe[:, None], b, t, head, ok)


def cmp_forward(q, kc, vc, cfg: NSAConfig, bs: BlockSizes, scale: float, interpret: bool, *,
                choices: KernelChoices | None = None, seg=None):
    """-> (o float32 [B,T,Hq,Dv] or None when vc is None, lse2 float32 [B,T,Hq]); lse2 is the
    base-2 log-sum-exp of the scaled logits over visible blocks, +inf where none is visible.
    ``seg``: a ``semantics.SegmentLayout`` for packed rows (kc/vc in its slot layout)."""
    B, T, Hq, Dk = q.shape
    Tc, G = kc.shape[1], kc.shape[2]
    h = Hq // G
    rows = _tile_rows(h, bs)
    with_o = vc is not None
    Dv = vc.shape[-1] if with_o else 0
    if Tc == 0:
        o = jnp.zeros((B, T, Hq, Dv), jnp.float32) if with_o else None
        return o, jnp.full((B, T, Hq), POS_INF, jnp.float32)
    kern = functools.partial(_fwd_kernel, h=h, rows=rows, bk=bs.cmp_keys, d=cfg.stride_d,
                             l=cfg.block_l, scale=scale,
                             prec=dot_precision(q.dtype, interpret, choices), with_o=with_o,
                             packed=seg is not None)
    lse_shape = jax.ShapeDtypeStruct((B, T, Hq), jnp.float32)
    out_shape = [jax.ShapeDtypeStruct((B, T, Hq, Dv), jnp.float32), lse_shape] if with_o \
        else [lse_shape]
    res = pl.pallas_call(
        kern, grid=(cdiv(T, rows // h), G, B), out_shape=out_shape,
        compiler_params=compiler_params(bs.cmp_warps or bs.num_warps, bs.num_stages),
        interpret=interpret, name="nsa_cmp_fwd" if with_o else "nsa_cmp_lse",
    )(q, kc, *(() if seg is None else (seg.cmp_lo, seg.rel)), *((vc,) if with_o else ()))
    return (res[0], res[1]) if with_o else (None, res[0])


# ---- backward --------------------------------------------------------------------------------
def _bwd_dq_kernel(q_ref, k_ref, v_ref, do_ref, gs_ref, lse_ref, delta_ref, *refs, h, rows,
                   bk, d, l, scale, prec, packed=False, with_init=False):
    seg_refs = refs[:2] if packed else None
    dq_ref = refs[-1]
    init_ref = refs[-2] if with_init else None   # dQ of the branches before (dq_in)
    qt, g, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    T, Tc = q_ref.shape[1], k_ref.shape[1]
    Dk, Dv = q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    bq = rows // h
    _, head, t, ok = _rows(qt, g, h, rows, T)
    q = _load_rows(q_ref, b, t, head, ok, Dk)
    do = _load_rows(do_ref, b, t, head, ok, Dv).astype(cdt)
    gs = load(gs_ref.at[b, t, head], ok)
    lse = load(lse_ref.at[b, t, head], ok, POS_INF)
    delta = load(delta_ref.at[b, t, head], ok)
    kt0, n_vis, lo, tv = _tile_keys(seg_refs, b, qt, bq, t, ok, d, l, T, Tc, bk)
    c = scale * LOG2E

    def step(kt, dq):
        i = kt * bk + jnp.arange(bk)
        imask = i < n_vis
        k = load(k_ref.at[b, pl.ds(kt * bk, bk), g, :], imask[:, None])
        v = load(v_ref.at[b, pl.ds(kt * bk, bk), g, :], imask[:, None])
        s = dot(q, k, trans_b=True, precision=prec)   # raw; scaled in the exponent
        vis = _visible(i, tv, ok, imask, d, l, lo)
        p = probs(s, vis, lse, c)
        ds = dscores(p, do, v, gs, delta, prec)
        return dq + dot(ds.astype(cdt), k, precision=prec)

    # dq_in enters as the accumulator's start (in units of the unscaled sum): its load is issued
    # before the key loop, not exposed after it (bench/NOTES.md, thirty-fourth session)
    dq0 = jnp.zeros((rows, Dk), jnp.float32)
    if with_init:
        dq0 = _load_rows(init_ref, b, t, head, ok, Dk).astype(jnp.float32) * (1.0 / scale)
    dq = lax.fori_loop(kt0, idiv(n_vis + (bk - 1), bk), step, dq0)
    _store_rows(dq_ref, dq * scale, b, t, head, ok)


def _bwd_dkv_kernel(q_ref, k_ref, v_ref, do_ref, gs_ref, lse_ref, delta_ref, *refs, h, rows,
                    bk, d, l, scale, prec, split, packed=False):
    """dK/dV of one compressed-key tile from the queries that see it. With split > 1 the query
    range is cut into ``split`` equal parts (programs of one key tile differ a lot in length:
    the first tile is seen by every query) whose partial sums meet in float32 atomic adds.
    Packed: ``qr_ref`` [B, n_kt, 2] holds the tile's query-tile range (``_packed_query_tiles``)."""
    if packed:
        lo_ref, rel_ref, qr_ref, *refs = refs
    if split > 1:
        _dk_in, _dv_in, dk_ref, dv_ref = refs
    else:
        dk_ref, dv_ref = refs
    kt, g, bsp = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    b, part = bsp // split, bsp % split
    T, Tc = q_ref.shape[1], k_ref.shape[1]
    Dk, Dv = q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    bq = rows // h
    i = kt * bk + jnp.arange(bk)
    imask = i < Tc
    k = load(k_ref.at[b, pl.ds(kt * bk, bk), g, :], imask[:, None])
    v = load(v_ref.at[b, pl.ds(kt * bk, bk), g, :], imask[:, None])
    c = scale * LOG2E

    def step(qt, carry):
        dk, dv = carry
        _, head, t, ok = _rows(qt, g, h, rows, T)
        q = _load_rows(q_ref, b, t, head, ok, Dk)
        do = _load_rows(do_ref, b, t, head, ok, Dv).astype(cdt)
        gs = load(gs_ref.at[b, t, head], ok)
        lse = load(lse_ref.at[b, t, head], ok, POS_INF)
        delta = load(delta_ref.at[b, t, head], ok)
        s = dot(q, k, trans_b=True, precision=prec)   # raw; scaled in the exponent
        if packed:
            lo, rel = _seg_rows(lo_ref, rel_ref, b, t, ok)
            vis = _visible(i, rel, ok, imask, d, l, lo)
        else:
            vis = _visible(i, t, ok, imask, d, l)
        dk, dv, _ = dkv_accumulate(dk, dv, s, vis, q, do, v, gs, lse, delta, prec, cdt, c)
        return dk, dv

    nqt = cdiv(T, bq)
    if packed:  # query tiles from the first token seeing slot kt*bk to its last slot's doc end
        qt0, nqt = qr_ref[b, kt, 0], qr_ref[b, kt, 1]
    else:
        qt0 = jnp.minimum(idiv(kt * bk * d + (l - 1), bq), nqt)  # first query tile seeing it
    per = idiv(nqt - qt0 + (split - 1), split)
    lo = jnp.minimum(qt0 + part * per, nqt)
    hi = jnp.minimum(lo + per, nqt)
    dk, dv = lax.fori_loop(lo, hi, step, (jnp.zeros((bk, Dk), jnp.float32),
                                          jnp.zeros((bk, Dv), jnp.float32)))
    if split > 1:
        @pl.when(hi > lo)
        def _():
            atomics.add(dk_ref, (b, pl.ds(kt * bk, bk), g, pl.ds(0, Dk)), dk * scale)
            atomics.add(dv_ref, (b, pl.ds(kt * bk, bk), g, pl.ds(0, Dv)), dv)
    else:
        store(dk_ref.at[b, pl.ds(kt * bk, bk), g, :], dk * scale, imask[:, None])
        store(dv_ref.at[b, pl.ds(kt * bk, bk), g, :], dv, imask[:, None])


def _packed_query_tiles(seg, Tc: int, bk: int, bq: int, cfg: NSAConfig):
    """int32 [B, ceil(Tc/bk), 2]: the query tiles [lo, hi) a dK/dV tile of slots
    [kt*bk, kt*bk + bk) must visit: from the first token that sees its first slot (the slot's
    first token + l - 1) to the end of the document of its last used slot; (0, 0) for a tile of
    padding slots. O(T) from the layout."""
    B, T = seg.rel.shape
    n_kt = cdiv(Tc, bk)
    t = jnp.arange(T, dtype=jnp.int32)
    nxt = jnp.where(seg.rel == 0, t, T)  # document firsts
    nxt = jnp.concatenate([nxt[:, 1:], jnp.full((B, 1), T, jnp.int32)], axis=1)
    doc_end = lax.cummin(nxt, axis=1, reverse=True)  # one past t's document
    used = jnp.sum(seg.cmp_ok, axis=1, dtype=jnp.int32)[:, None]  # slots in use per row
    c0 = jnp.arange(n_kt, dtype=jnp.int32)[None, :] * bk
    c1 = jnp.clip(jnp.minimum(c0 + bk, used) - 1, 0, Tc - 1)
    live = c0 < used
    first = jnp.take_along_axis(seg.cmp_src, jnp.minimum(c0, Tc - 1), axis=1) + (cfg.block_l - 1)
    end = jnp.take_along_axis(doc_end, jnp.take_along_axis(seg.cmp_src, c1, axis=1), axis=1)
    lo = jnp.where(live, first // bq, 0)
    hi = jnp.where(live, (end + bq - 1) // bq, 0)
    return jnp.stack([lo, hi], axis=-1).astype(jnp.int32)


def cmp_backward(q, kc, vc, o, lse, do, gs, dlse, cfg: NSAConfig, bs: BlockSizes, scale: float,
                 interpret: bool, *, choices: KernelChoices | None = None, seg=None,
                 dq_in=None, dq_dtype=jnp.float32):
    """-> dq (``dq_dtype``), dk, dv (input dtypes) for output cotangent ``gs[..., None] * do`` and
    lse cotangent ``dlse`` (None = 0); ``gs`` [B,T,Hq] per-row float32 scale (None = 1), applied
    after the dots so a bf16 ``do`` reaches them unrounded. dK/dV tiles split their query range
    ``choices.cmp_bwd_split`` ways. ``seg``: packed rows (``cmp_forward``). ``dq_in`` (q's shape,
    any float dtype; None = 0): added to dQ in float32 inside the kernel before it is stored, so
    that other branches' dQ need no [B,T,Hq,Dk] sum of their own (``nsa.py``)."""
    B, T, Hq, Dk = q.shape
    Tc, G, Dv = kc.shape[1], kc.shape[2], vc.shape[-1]
    if Tc == 0:
        dq = jnp.zeros(q.shape, dq_dtype) if dq_in is None else dq_in.astype(dq_dtype)
        return dq, jnp.zeros_like(kc), jnp.zeros_like(vc)
    h = Hq // G
    rows = _tile_rows(h, bs, backward=True)
    # d lse2 / d s = p * log2(e): folding it into delta gives dS = P * (dP - delta + dlse).
    gs = jnp.ones((B, T, Hq), jnp.float32) if gs is None else gs.astype(jnp.float32)
    delta = gs * jnp.sum(o * do.astype(jnp.float32), axis=-1)
    if dlse is not None:
        delta = delta - dlse.astype(jnp.float32) * LOG2E
    packed = seg is not None
    common = dict(h=h, rows=rows, d=cfg.stride_d, l=cfg.block_l, scale=scale,
                  prec=dot_precision(q.dtype, interpret, choices), packed=packed)
    segs = () if seg is None else (seg.cmp_lo, seg.rel)
    cp = compiler_params(bs.cmp_bwd_warps or bs.num_warps, bs.num_stages)
    init = () if dq_in is None else (dq_in,)
    dq = pl.pallas_call(
        functools.partial(_bwd_dq_kernel, bk=bs.cmp_bwd_keys, with_init=bool(init), **common),
        grid=(cdiv(T, rows // h), G, B),
        out_shape=jax.ShapeDtypeStruct((B, T, Hq, Dk), dq_dtype), compiler_params=cp,
        interpret=interpret, name="nsa_cmp_bwd_dq",
    )(q, kc, vc, do, gs, lse, delta, *segs, *init)
    bk, split = bs.cmp_bwd_keys, choices_or_default(choices).cmp_bwd_split
    n_kt = cdiv(Tc, bk)
    if packed:
        segs = segs + (_packed_query_tiles(seg, Tc, bk, rows // h, cfg),)
    kern = functools.partial(_bwd_dkv_kernel, bk=bk, split=split, **common)
    if split == 1:
        dk, dv = pl.pallas_call(
            kern, grid=(n_kt, G, B),
            out_shape=[jax.ShapeDtypeStruct((B, Tc, G, Dk), jnp.float32),
                       jax.ShapeDtypeStruct((B, Tc, G, Dv), jnp.float32)], compiler_params=cp,
            interpret=interpret, name="nsa_cmp_bwd_dkv",
        )(q, kc, vc, do, gs, lse, delta, *segs)
    else:
        acc = [jnp.zeros((B, n_kt * bk, G, Dk), jnp.float32),
               jnp.zeros((B, n_kt * bk, G, Dv), jnp.float32)]
        dk, dv = pl.pallas_call(
            kern, grid=(n_kt, G, B * split),
            out_shape=[jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in acc],
            input_output_aliases={7 + len(segs): 0, 8 + len(segs): 1}, compiler_params=cp,
            interpret=interpret, name="nsa_cmp_bwd_dkv_split",
        )(q, kc, vc, do, gs, lse, delta, *segs, *acc)
        dk, dv = dk[:, :Tc], dv[:, :Tc]
    return dq, dk.astype(kc.dtype), dv.astype(vc.dtype)


# ---- custom VJP ---------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def cmp_attention(q, kc, vc, cfg: NSAConfig, bs: BlockSizes, scale: float, interpret: bool):
    """Compressed attention (Eq. 8) -> (o float32 [B,T,Hq,Dv], lse2 float32 [B,T,Hq])."""
    return cmp_forward(q, kc, vc, cfg, bs, scale, interpret)


def _vjp_fwd(q, kc, vc, cfg, bs, scale, interpret):
    o, lse = cmp_forward(q, kc, vc, cfg, bs, scale, interpret)
    return (o, lse), (q, kc, vc, o, lse)


def _vjp_bwd(cfg, bs, scale, interpret, res, cts):
    q, kc, vc, o, lse = res
    do, dlse = cts
    dq, dk, dv = cmp_backward(q, kc, vc, o, lse, do, None, dlse, cfg, bs, scale, interpret)
    return dq.astype(q.dtype), dk, dv


cmp_attention.defvjp(_vjp_fwd, _vjp_bwd)
