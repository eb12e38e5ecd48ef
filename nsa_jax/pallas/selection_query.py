"""Query-major selected-block attention (NSA §3.3.2, Eq. 10-12 applied): the forward and the
backward's dQ, one program per tile of ``BlockSizes.sel_queries`` consecutive queries of one KV
group.

A program loads the h query heads of each of its queries (padded to >= 16 rows so the dots use
tensor cores; one online-softmax state, or one dQ tile, per query) and walks their selected
blocks (ids from ``idx [B,T,G,n]``, -1 = unused slot; keys s <= t kept) in two loops:

1. the blocks that *every* query of the tile selected (same first key): each K/V sub-tile is
   loaded once and attended by all the tile's queries, each with its own causal mask. Queries of
   one l'-aligned tile share at least the forced blocks (Eq. 11: the initial and the local
   ones), and trained models' neighbouring queries share most of their blocks;
2. each query's remaining blocks, loaded per query.

``tile_slots`` writes that order into the ids (per query: the tile's shared blocks, then its
own, then -1) and the two loop lengths. A tile of q queries with c shared blocks reads
c + q (n - c) blocks instead of q n: the kernels are bound by L2 -> SM traffic of the K/V
tiles at long T (bench/NOTES.md), so the bytes saved are the time saved.
``sel_queries = 1`` is one program per query; every valid block then runs in loop 1.

The forward writes o (float32) and the base-2 log-sum-exp per (t, head) for the backward. The
dQ kernel recomputes P from that lse: dS = P * (dO V^T - delta), dQ = dS K; in ``atomic`` mode
(``KernelChoices.sel_bwd``) it also forms each block's dK/dV tile and adds it atomically to a
float32 accumulator (loop 1: one add of the tile's summed contributions).

Packed documents (``seg``): ids are document-relative, block j of the query at t is the keys
[p, p + l'), p = start(t) + j*l' (an unaligned ``pl.ds`` load); "shared" compares p, so queries of
two documents share nothing.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas.common import (LOG2E, MIN_DOT, NEG_INF, POS_INF, BlockSizes, cdiv,
                                   compiler_params, dot, dot_precision, dscores, load, next_pow2,
                                   probs, sel_sub_tiles, softmax_finish, softmax_init,
                                   softmax_step, store)


def _head_rows(h: int):
    """Rows of a per-query tile: the group's h heads padded to a power of two >= 16."""
    return max(MIN_DOT, next_pow2(h))


def tile_slots(idx, qt: int, l_sel: int, start=None):
    """idx int32 [B,T,G,n] -> (ids, counts int32 [B, C*qt, G, n | 2]), C = cdiv(T, qt): each
    query's row of ids holds first the blocks every query of its tile selected (in the tile's
    first query's order, the same row prefix for all), then its other ids, then -1;
    counts[..., 0] is the number of shared blocks of its tile, counts[..., 1] the number of its
    other ids. Queries past T (the last tile's padding) get -1 rows, no ids of their own, and do
    not limit what the others share.
    ``start`` [B,T] (packed rows): blocks are compared by their first key start + id*l'.
    qt = 1: the ids unchanged, counts (n, 0) (the kernels then run loop 1 only)."""
    B, T, G, n = idx.shape
    idx = idx.astype(jnp.int32)
    C = cdiv(T, qt)
    if qt == 1:
        return idx, jnp.broadcast_to(jnp.array([n, 0], jnp.int32), (B, T, G, 2))
    pad = C * qt - T
    valid = idx >= 0
    pos = jnp.maximum(idx, 0) * l_sel
    if start is not None:
        pos = pos + start[:, :, None, None]
    real = jnp.arange(C * qt) < T
    idx = jnp.pad(idx, ((0, 0), (0, pad), (0, 0), (0, 0)), constant_values=-1)
    valid = jnp.pad(valid, ((0, 0), (0, pad), (0, 0), (0, 0)))
    pos = jnp.pad(pos, ((0, 0), (0, pad), (0, 0), (0, 0)))
    tile = lambda x: x.reshape(B, C, qt, G, n)
    idx, valid, pos = tile(idx), tile(valid), tile(pos)
    real = real.reshape(1, C, qt, 1, 1)
    lead_pos, lead_ok = pos[:, :, :1], valid[:, :, :1]           # [B,C,1,G,n]
    # eq[b,c,i,g,s,u]: the lead's slot s names the block of query i's slot u
    eq = ((lead_pos[..., :, None] == pos[..., None, :]) & lead_ok[..., :, None]
          & valid[..., None, :])
    member = jnp.any(eq, axis=-1) | ~real                        # [B,C,qt,G,n] (s)
    shared = jnp.all(member, axis=2) & lead_ok[:, :, 0]          # [B,C,G,n]: lead slots
    mine = valid & ~jnp.any(eq & shared[:, :, None, :, :, None], axis=-2)   # [B,C,qt,G,n] (u)
    nsh = jnp.sum(shared, axis=-1, dtype=jnp.int32)              # [B,C,G]
    nown = jnp.sum(mine, axis=-1, dtype=jnp.int32)               # [B,C,qt,G]
    slot = jnp.arange(n, dtype=jnp.int32)

    def place(keep, dest, vals):   # vals at dest where keep, as a [.., n] row (0 elsewhere)
        hit = keep[..., :, None] & (dest[..., :, None] == slot)
        return jnp.sum(jnp.where(hit, vals[..., :, None] + 1, 0), axis=-2, dtype=jnp.int32)

    lead_idx = idx[:, :, 0]                                      # [B,C,G,n]
    sh_row = place(shared, jnp.cumsum(shared, axis=-1) - 1, lead_idx)          # [B,C,G,n]
    own_row = place(mine, nsh[:, :, None, :, None] + jnp.cumsum(mine, axis=-1) - 1, idx)
    ids = sh_row[:, :, None] + own_row - 1
    ids = jnp.where(real, ids, -1).reshape(B, C * qt, G, n)
    counts = jnp.stack([jnp.broadcast_to(nsh[:, :, None], nown.shape), nown], axis=-1)
    return ids, counts.reshape(B, C * qt, G, 2)


def _tile_queries(T: int, qt: int):
    """This program's queries: (t_i, in range, t_i clamped into [0, T)) for i < qt, and the
    tile's last query in range (the loads of a shared block are masked to it)."""
    t0 = pl.program_id(0) * qt
    ts = [t0 + i for i in range(qt)]
    return ts, [t < T for t in ts], [jnp.minimum(t, T - 1) for t in ts], jnp.minimum(
        t0 + qt - 1, T - 1)


def _block_base(ids_ref, st_ref, b, t, g, si, l_sel: int):
    """-> (j >= 0, first key of the block in slot si of query t's row)."""
    j = ids_ref[b, t, g, si]
    base = jnp.maximum(j, 0) * l_sel
    if st_ref is not None:
        base = st_ref[b, t] + base
    return j >= 0, base


def _two_loops(ids_ref, cnt_ref, st_ref, b, g, t_lead, tc, oks, l_sel: int, init, shared_step,
               own_step, finish):
    """Loop 1 over the tile's shared slots (``shared_step(valid, base, carry)``: the block named
    by the lead query's row, the carry a list with one entry per query); then, one query after
    the other, a loop over its own slots (``own_step(i, valid, base, carry_i)``), and
    ``finish(i, carry_i)``. One loop per query keeps one query's K/V buffers live at a time (a
    single loop over (slot, query) held q pipelined tile pairs in shared memory at once)."""
    nsh = cnt_ref[b, t_lead, g, 0]

    def loop1(si, carry):
        valid, base = _block_base(ids_ref, st_ref, b, t_lead, g, si, l_sel)
        return shared_step(valid, base, carry)

    carry = lax.fori_loop(0, nsh, loop1, init)
    for i in range(len(tc)):
        state = carry[i]
        if len(tc) > 1:
            def loop2(si, state, i=i):
                valid, base = _block_base(ids_ref, st_ref, b, tc[i], g, si, l_sel)
                return own_step(i, valid & oks[i], base, state)
            state = lax.fori_loop(nsh, nsh + cnt_ref[b, tc[i], g, 1], loop2, state)
        finish(i, state)


# ---- forward ---------------------------------------------------------------------------------
def _fwd_kernel(q_ref, k_ref, v_ref, ids_ref, cnt_ref, *refs, h, qt, l_sel, bk, n_sub, scale,
                prec, packed=False):
    if packed:
        st_ref, o_ref, lse_ref = refs
    else:
        st_ref, (o_ref, lse_ref) = None, refs
    g, b = pl.program_id(1), pl.program_id(2)
    T, Dk, Dv = q_ref.shape[1], q_ref.shape[-1], v_ref.shape[-1]
    hp = _head_rows(h)
    r = jnp.arange(hp)
    row_ok = r < h
    head = g * h + jnp.where(row_ok, r, 0)
    dk_, dv_ = jnp.arange(Dk), jnp.arange(Dv)
    ts, oks, tc, t_last = _tile_queries(T, qt)
    qs = [load(q_ref.at[b, tc[i], head[:, None], dk_[None, :]], row_ok[:, None] & oks[i])
          for i in range(qt)]
    c = scale * LOG2E

    def attend(state, q, k, v, kmask):
        m, l, acc = state
        s = jnp.where(kmask[None, :], dot(q, k, trans_b=True, precision=prec) * c, NEG_INF)
        m, alpha, p, l = softmax_step(m, l, s)
        return m, l, acc * alpha[:, None] + dot(p.astype(v.dtype), v, precision=prec)

    def kv(base, sub, mask):
        return (load(k_ref.at[b, pl.ds(base + sub * bk, bk), g, :], mask[:, None]),
                load(v_ref.at[b, pl.ds(base + sub * bk, bk), g, :], mask[:, None]))

    def shared_step(valid, base, states):
        states = list(states)
        for sub in range(n_sub):
            off = sub * bk + jnp.arange(bk)
            kin = valid & (off < l_sel)
            k, v = kv(base, sub, kin & (base + off <= t_last))
            for i in range(qt):
                states[i] = attend(states[i], qs[i], k, v, kin & (base + off <= ts[i]))
        return states

    def own_step(i, valid, base, state):
        for sub in range(n_sub):
            off = sub * bk + jnp.arange(bk)
            kmask = valid & (off < l_sel) & (base + off <= ts[i])
            k, v = kv(base, sub, kmask)
            state = attend(state, qs[i], k, v, kmask)
        return state

    def finish(i, state):
        m, l, acc = state
        l_safe, lse = softmax_finish(m, l)
        ok = row_ok & oks[i]
        head_st = jnp.where(ok, head, o_ref.shape[2])  # masked rows -> out of bounds
        store(o_ref.at[b, tc[i], head_st[:, None], dv_[None, :]], acc / l_safe[:, None],
              ok[:, None])
        store(lse_ref.at[b, tc[i], head_st], lse, ok)

    _two_loops(ids_ref, cnt_ref, st_ref, b, g, ts[0], tc, oks, l_sel,
               [softmax_init(hp, Dv) for _ in range(qt)], shared_step, own_step, finish)


def sel_forward(q, k, v, idx, cfg: NSAConfig, bs: BlockSizes, scale: float, interpret: bool, *,
                choices: KernelChoices | None = None, seg=None):
    """-> o float32 [B,T,Hq,Dv], lse2 float32 [B,T,Hq] (base-2 log-sum-exp of scaled logits,
    +inf for a row with no visible key). ``seg``: packed rows' layout (document-relative idx)."""
    B, T, Hq, Dk = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    h = Hq // G
    qt = bs.sel_queries
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_keys)
    ids, counts = tile_slots(idx, qt, cfg.sel_block, None if seg is None else seg.start)
    kernel = functools.partial(_fwd_kernel, h=h, qt=qt, l_sel=cfg.sel_block, bk=bk,
                               n_sub=n_sub, scale=scale,
                               prec=dot_precision(q.dtype, interpret, choices),
                               packed=seg is not None)
    return pl.pallas_call(
        kernel, grid=(cdiv(T, qt), G, B),
        out_shape=[jax.ShapeDtypeStruct((B, T, Hq, Dv), jnp.float32),
                   jax.ShapeDtypeStruct((B, T, Hq), jnp.float32)],
        compiler_params=compiler_params(bs.sel_warps, bs.sel_stages),
        interpret=interpret, name="nsa_sel_fwd",
    )(q, k, v, ids, counts, *(() if seg is None else (seg.start,)))


# ---- backward: dQ (and dK/dV in "atomic" mode) -------------------------------------------------
def _bwd_q_kernel(q_ref, k_ref, v_ref, ids_ref, cnt_ref, do_ref, gs_ref, lse_ref, delta_ref,
                  *refs, h, qt, l_sel, bk, n_sub, scale, prec, atomic, packed=False):
    st_ref = None
    if packed:
        st_ref, *refs = refs
    if atomic:
        _dk_in, _dv_in, dq_ref, dk_ref, dv_ref = refs
    else:
        (dq_ref,) = refs
    g, b = pl.program_id(1), pl.program_id(2)
    T, Dk, Dv = q_ref.shape[1], q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    hp = _head_rows(h)
    r = jnp.arange(hp)
    row_ok = r < h
    head = g * h + jnp.where(row_ok, r, 0)
    dk_, dv_ = jnp.arange(Dk), jnp.arange(Dv)
    ts, oks, tc, t_last = _tile_queries(T, qt)
    rows = []
    for i in range(qt):
        ok = row_ok & oks[i]
        rows.append((load(q_ref.at[b, tc[i], head[:, None], dk_[None, :]], ok[:, None]),
                     load(do_ref.at[b, tc[i], head[:, None], dv_[None, :]],
                          ok[:, None]).astype(cdt),
                     load(gs_ref.at[b, tc[i], head], ok),
                     load(lse_ref.at[b, tc[i], head], ok, POS_INF),
                     load(delta_ref.at[b, tc[i], head], ok)))
    c = scale * LOG2E

    def grads(i, k, v, kmask):
        """-> (dS K contribution to dQ_i, and in atomic mode the dK, dV tile contributions)."""
        q, do, gs, lse, delta = rows[i]
        p = probs(dot(q, k, trans_b=True, precision=prec) * c, kmask[None, :], lse)
        ds = dscores(p, do, v, gs, delta, prec)
        dq = dot(ds.astype(cdt), k, precision=prec)
        if not atomic:
            return dq, None, None
        return (dq, dot(ds.astype(cdt), q, trans_a=True, precision=prec) * scale,
                dot((p * gs[:, None]).astype(cdt), do, trans_a=True, precision=prec))

    def kv(base, sub, mask):
        return (load(k_ref.at[b, pl.ds(base + sub * bk, bk), g, :], mask[:, None]),
                load(v_ref.at[b, pl.ds(base + sub * bk, bk), g, :], mask[:, None]))

    def add(base, sub, dk_t, dv_t):
        plgpu.atomic_add(dk_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dk)), dk_t)
        plgpu.atomic_add(dv_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dv)), dv_t)

    def shared_step(valid, base, dqs):
        dqs = list(dqs)
        # a block starting past t has no visible key; its (zero) atomic tiles go to 0, not
        # past the accumulator (a caller's block_idx may name one)
        valid = valid & (base <= t_last)
        base = jnp.where(valid, base, 0)
        for sub in range(n_sub):
            off = sub * bk + jnp.arange(bk)
            kin = valid & (off < l_sel)
            k, v = kv(base, sub, kin & (base + off <= t_last))
            dk_t = dv_t = 0.0
            for i in range(qt):
                dq, dk_i, dv_i = grads(i, k, v, kin & (base + off <= ts[i]))
                dqs[i] = dqs[i] + dq
                if atomic:
                    dk_t, dv_t = dk_t + dk_i, dv_t + dv_i
            if atomic:
                add(base, sub, dk_t, dv_t)
        return dqs

    def own_step(i, valid, base, dq):
        valid = valid & (base <= ts[i])
        base = jnp.where(valid, base, 0)
        for sub in range(n_sub):
            off = sub * bk + jnp.arange(bk)
            kmask = valid & (off < l_sel) & (base + off <= ts[i])
            k, v = kv(base, sub, kmask)
            dq_i, dk_t, dv_t = grads(i, k, v, kmask)
            dq = dq + dq_i
            if atomic:
                add(base, sub, dk_t, dv_t)
        return dq

    def finish(i, dq):
        ok = row_ok & oks[i]
        head_st = jnp.where(ok, head, dq_ref.shape[2])
        store(dq_ref.at[b, tc[i], head_st[:, None], dk_[None, :]], dq * scale, ok[:, None])

    _two_loops(ids_ref, cnt_ref, st_ref, b, g, ts[0], tc, oks, l_sel,
               [jnp.zeros((hp, Dk), jnp.float32) for _ in range(qt)], shared_step, own_step,
               finish)


def sel_dq(q, k, v, idx, do, gs, lse, delta, cfg: NSAConfig, bs: BlockSizes, prec, scale: float,
           interpret: bool, *, seg=None, acc=None):
    """dQ float32 [B,T,Hq,Dk] of the selection branch (``gs``, ``delta`` from
    ``selection.grad_scales``); with ``acc`` (float32 dK, dV accumulators) the "atomic" variant:
    -> (dq, dk_acc, dv_acc) with every block's dK/dV tiles added."""
    B, T, Hq, Dk = q.shape
    G = k.shape[2]
    qt = bs.sel_queries
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_keys)
    ids, counts = tile_slots(idx, qt, cfg.sel_block, None if seg is None else seg.start)
    segs = () if seg is None else (seg.start,)
    kern = functools.partial(_bwd_q_kernel, h=Hq // G, qt=qt, l_sel=cfg.sel_block, bk=bk,
                             n_sub=n_sub, scale=scale, prec=prec, atomic=acc is not None,
                             packed=seg is not None)
    dq_shape = jax.ShapeDtypeStruct((B, T, Hq, Dk), jnp.float32)
    params = dict(grid=(cdiv(T, qt), G, B), interpret=interpret,
                  compiler_params=compiler_params(bs.sel_warps, bs.sel_stages))
    args = (q, k, v, ids, counts, do, gs, lse, delta, *segs)
    if acc is None:
        return pl.pallas_call(kern, out_shape=dq_shape, name="nsa_sel_bwd_dq", **params)(*args)
    n_in = len(args)
    return pl.pallas_call(
        kern, out_shape=[dq_shape, jax.ShapeDtypeStruct(acc[0].shape, jnp.float32),
                         jax.ShapeDtypeStruct(acc[1].shape, jnp.float32)],
        input_output_aliases={n_in: 1, n_in + 1: 2}, name="nsa_sel_bwd_atomic", **params,
    )(*args, *acc)
