"""Selected-block attention, block-major (NSA §3.3.2, Eq. 10-12 applied): the forward
(``KernelChoices.sel_fwd = "block"``) and a backward that forms dQ with dK/dV
(``KernelChoices.sel_dq = "block"``, ``sel_backward_block``, documented there).

The query-major forward (``selection.sel_forward``) runs one program per (query, KV group) and
loads each of the query's n selected K/V blocks: n * l' * (Dk + Dv) * 2 bytes per (query, group),
16 KB per block at the 125M shape, from L2. Its tiles have h rows (6 at 125M, padded to 16), so
it is bound by L2 -> SM traffic, not by the tensor cores (bench/NOTES.md).

Here the loop is turned around, as the inverted dK/dV kernel does (and as FSA, Flash Sparse
Attention, does for its forward): the block -> query index (``selection.inverted_index``) lists,
for each key block, the queries that selected it; one program takes one key block and up to
``sel_chunk`` of its queries, loads the block's K and V once, and walks the queries in tiles of
``rows // h`` queries x h heads (128 rows by default: full-height tensor-core tiles). For each
(query, slot) it writes the block's *partial* result, the softmax over that block's visible keys:
o_i ([Hq, Dv], in q's dtype if 16-bit, else float32) and its base-2 log-sum-exp lse_i (float32).
The merge (Eq. 10's softmax over the union of the selected keys, the same online-softmax identity
the kernels use between tiles):

    lse = log2 sum_i 2^lse_i,    o = sum_i 2^(lse_i - lse) o_i

runs in XLA over the n slots. Bytes per (query, group) move from n K/V tiles (L2) to n gathered
query rows in and n partial rows out (h * (2 Dk + 2 Dv + 4) bytes each in bf16, through HBM).
The index is returned for the backward, whose dK/dV kernel (``selection.sel_backward``) or fused
dK/dV + dQ kernel (``sel_backward_block``) walks the same (block, queries) items.

Causal split of the forward (``selection.causal_parts``): only an item's first entries (queries
inside the block's own l' keys, at most l' - 1) see part of the block. The forward runs twice
over the same index: a "diag" launch takes those entries with the causal mask, a "rest" launch
the others without any mask (its loop 639 -> 459 instructions at 160 -> 136 registers in the sm_90
proxy). The backward keeps one masked launch (its split measured slower: ``causal_parts``).

Packed rows: ``inverted_index`` lists each (query, block) pair once, under a key range of l'
keys that holds the keys the query sees of its block (an aligned block, or the range starting
at the block's first key when it crosses an aligned boundary: ``selection`` module docstring),
so packed rows have n slots, as unpacked ones, and the kernels are the same (the entry's first
key p masks the range to [p, p + l')). Unused slots keep lse = -inf (the partial lse buffer
starts at -inf) and weigh nothing.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas import atomics
from nsa_jax.pallas.common import (LOG2E, NEG_INF, POS_INF, BlockSizes, choices_or_default,
                                   compiler_params, dkv_accumulate, dot, dot_precision,
                                   fold_gate, idiv, load, sel_sub_tiles, softmax_first,
                                   softmax_scale_lse, softmax_step, store, stored_dtype)
from nsa_jax.pallas.selection import (block_kv, causal_parts, dkv_rows, inverted_index,
                                      item_entries, item_mask, item_part, item_rows, item_tiles,
                                      num_ranges, slot_keys, work_item)


def _fwd_block_kernel(meta_ref, ot_ref, *refs, h, rows, n_slots, l_sel, bk, n_sub, scale, prec,
                      approx, packed=False, part=None, offset=False):
    """``part``: the entries of each item this launch takes (``selection.item_part``): "diag"
    with the causal mask, "rest" without any, None all with the mask. The refs after q, k, v
    are the aliased outputs of the launch before (or the -inf lse start), then po, plse.
    ``offset`` (unpacked): the first ref after the index is int32 [1], the key position of
    query row 0 (a continuation chunk: row t sits at key position offset + t)."""
    if packed:
        pt_ref, *refs = refs
    off = None
    if offset:
        off_ref, *refs = refs
        off = off_ref[0]
    q_ref, k_ref, v_ref = refs[:3]
    po_ref, plse_ref = refs[-2:]
    b, g, base, start, count, qi, head = work_item(meta_ref, h, rows)
    # the diagonal entries by query row: the block's first key in rows is base - offset
    start, count = item_part(ot_ref, b, g, base if off is None else base - off, start, count,
                             n_slots, l_sel, part)
    run = functools.partial(
        _fwd_item, ot_ref, pt_ref if packed else None, q_ref, k_ref, v_ref, po_ref, plse_ref, b,
        g, base, start, count, qi, head, h=h, rows=rows, n_slots=n_slots, l_sel=l_sel, bk=bk,
        n_sub=n_sub, scale=scale, prec=prec, approx=approx, masked=part != "rest", off=off)
    if part == "diag":   # most items have no diagonal entry: nothing loaded
        pl.when(count > 0)(run)
    else:
        run()


def _fwd_item(ot_ref, pt_ref, q_ref, k_ref, v_ref, po_ref, plse_ref, b, g, base, start, count,
              qi, head, *, h, rows, n_slots, l_sel, bk, n_sub, scale, prec, approx, masked,
              off=None):
    """One work item's entries [start, start + count) (module docstring); ``masked`` False:
    no causal mask (every row sees the whole block); ``off``: query row t's key position is
    off + t (None: t)."""
    packed = pt_ref is not None
    Dk, Dv = q_ref.shape[-1], v_ref.shape[-1]
    bq = rows // h
    dk_, dv_ = jnp.arange(Dk), jnp.arange(Dv)
    c = scale * LOG2E
    # the block's K/V, loaded once for all of its queries
    kv = [block_kv(k_ref, v_ref, b, g, base, sub, bk, l_sel) for sub in range(n_sub)]

    def entries(it):   # tile ``it``'s rows: (row_ok, index entry, t*n + slot)
        return item_entries(ot_ref, b, g, start, count, it, qi, bq)

    def rows_of(ix):   # the tile's gathered q rows (and packed rows' block starts)
        row_ok, ent, ts = ix
        t = idiv(ts, n_slots)
        q = load(q_ref.at[b, t[:, None], head[:, None], dk_[None, :]], row_ok[:, None])
        return q, load(pt_ref.at[b, g, ent], row_ok) if packed else None

    # Loads one tile ahead, by hand: tile it + 1's q rows and tile it + 2's index entries are
    # loaded while tile it computes (in the sm_90 proxy, Triton's own pipelining of this loop
    # waits for its copies at the top of each tile). Tiles past the item's count load nothing
    # (row_ok is False).
    # On an H200 this forward moved -0.5% at 8k / B=4 and -4% at 64k (bench/NOTES.md,
    # thirty-sixth session).
    def tile(it, carry):
        (row_ok, _, ts), (q, p0), ix1 = carry
        ix2 = entries(it + 2)
        nxt = rows_of(ix1)
        t = idiv(ts, n_slots)
        # Every tile is a whole softmax over the block's keys: its first sub-tile starts it
        # (no rescale of an empty state), and the result is scaled by one reciprocal per row.
        for sub, (k, v, kpos, kcol) in enumerate(kv):
            s = dot(q, k, trans_b=True, precision=prec)
            if masked:   # else every key of the block is visible to every row
                pos = t if off is None else t + off
                s = jnp.where(item_mask(kcol, kpos, pos, p0, l_sel), s, NEG_INF)
            if sub == 0:
                m, p, lsum = softmax_first(s, c)
                acc = dot(p.astype(v.dtype), v, precision=prec)
            else:
                m, alpha, p, lsum = softmax_step(m, lsum, s, c)
                acc = acc * alpha[:, None] + dot(p.astype(v.dtype), v, precision=prec)
        inv_l, lse = softmax_scale_lse(m, lsum, approx)
        ts_st = jnp.where(row_ok, ts, po_ref.shape[1])   # masked rows -> out of bounds
        store(po_ref.at[b, ts_st[:, None], head[:, None], dv_[None, :]],
              acc * inv_l[:, None], row_ok[:, None])
        store(plse_ref.at[b, ts_st, head], jnp.where(lse == POS_INF, NEG_INF, lse), row_ok)
        return ix1, nxt, ix2

    ix0 = entries(0)
    lax.fori_loop(0, idiv(count + (bq - 1), bq), tile, (ix0, rows_of(ix0), entries(1)))


def merge_partials(po, plse, prev=None):
    """Partial results per slot -> (o float32 [B,T,Hq,Dv], lse2 [B,T,Hq], +inf where no key):
    po [B,T,N,Hq,Dv] (float32 or the 16-bit input dtype), plse [B,T,N,Hq] float32 base-2
    (-inf = no partial; po is then ignored, it may be uninitialised). ``prev``: (o, lse2) of
    an earlier slot pass (this function's output), merged in as one more partial."""
    m = jnp.max(plse, axis=2)
    if prev is not None:
        o0, l0 = prev
        l0 = jnp.where(l0 == POS_INF, NEG_INF, l0)
        m = jnp.maximum(m, l0)
    m_safe = jnp.where(m == NEG_INF, 0.0, m)
    w = jnp.exp2(plse - m_safe[:, :, None])                       # 0 where plse = -inf
    den = jnp.sum(w, axis=2)
    if prev is not None:
        w0 = jnp.exp2(l0 - m_safe)
        den = den + w0
    has = den > 0
    den_safe = jnp.where(has, den, 1.0)
    o = jnp.sum(jnp.where((plse > NEG_INF)[..., None], po.astype(jnp.float32), 0.0)
                * (w / den_safe[:, :, None])[..., None], axis=2)
    if prev is not None:
        o = o + o0 * (w0 / den_safe)[..., None]
    return o, jnp.where(has, m_safe + jnp.log2(den_safe), POS_INF)


def slot_passes(idx_shape, Hq: int, D: int, dtype, choices: KernelChoices | None = None):
    """[(lo, hi)]: the slot groups idx[..., lo:hi] that the block-major forward and fused
    backward run one after the other, so that no pass's per-slot partials (B*T*n*Hq*D in the
    stored dtype) exceed ``choices.sel_partial_mib`` MiB (or a pass is one
    slot). The forward and the backward compute it from the same arguments (D = max(Dk, Dv)),
    so their passes match."""
    B, T, _, n = idx_shape
    nbytes = B * T * n * Hq * D * jnp.dtype(stored_dtype(dtype)).itemsize
    limit = choices_or_default(choices).sel_partial_mib * 2**20
    p = max(1, min(n, math.ceil(nbytes / limit)))
    edges = [round(i * n / p) for i in range(p + 1)]
    return [(edges[i], edges[i + 1]) for i in range(p)]


def _pass_index(idx, T, Ts, chunk, seg, l_sel, pos0=0):
    """The block -> query index (slot payloads) of one slot group."""
    return inverted_index(idx, T, Ts, chunk, l_sel, None if seg is None else seg.start,
                          slots=True, pos0=pos0)


def sel_forward_block(q, k, v, idx, cfg: NSAConfig, bs: BlockSizes, scale: float,
                      interpret: bool, *, choices: KernelChoices | None = None, seg=None,
                      return_index: bool = False, offset=None):
    """Same contract as ``selection.sel_forward``: -> o float32 [B,T,Hq,Dv], lse2 float32
    [B,T,Hq] (module docstring for the schedule); with ``return_index`` also the block -> query
    indices it built, one per slot pass (``sel_backward_block(index=...)`` reuses them instead
    of sorting again; ``selection.sel_backward(index=...)`` takes a single pass's).
    The partial outputs are stored in q's dtype when it is 16-bit (bf16 / f16: half the bytes;
    one more rounding of each block's partial output), in float32 otherwise. Slots run in
    passes (``slot_passes``, bounded by ``choices.sel_partial_mib``): each pass's partials are
    merged before the next pass starts (an optimization barrier orders them), the running
    result entering the next pass's merge as one more partial.
    ``offset`` (int32 scalar, traced; unpacked, forward only): query row t sits at key position
    offset + t of k / v [B,S,G,D] (S >= offset + T), ids count the blocks of k: a continuation
    chunk of a chunked prefill (``pallas.chunk``), as ``selection.sel_forward(offset=)``."""
    B, T, Hq, Dk = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    h = Hq // G
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_keys)
    if offset is not None and (seg is not None or return_index):
        raise ValueError("sel_forward_block: offset is for unpacked rows, forward only")
    Ts = cfg.num_sel_blocks(T if offset is None else k.shape[1])
    pos0 = 0 if offset is None else jnp.asarray(offset, jnp.int32)
    off_in = () if offset is None else (jnp.reshape(pos0, (1,)),)
    rows, chunk = item_tiles(bs, h)
    packed = seg is not None
    pdt = stored_dtype(q.dtype)
    o = lse = None
    indices = []
    for lo, hi in slot_passes(idx.shape, Hq, max(Dk, Dv), q.dtype, choices):
        index = _pass_index(idx[..., lo:hi], T, Ts, chunk, seg, cfg.sel_block, pos0)
        meta, *extra = index
        N = hi - lo
        if o is not None:   # the previous pass's partials are merged (and freed) first
            q, o, lse = lax.optimization_barrier((q, o, lse))
        out_shape = [jax.ShapeDtypeStruct((B, T * N, Hq, Dv), pdt),
                     jax.ShapeDtypeStruct((B, T * N, Hq), jnp.float32)]
        outs = (jnp.full((B, T * N, Hq), NEG_INF, jnp.float32),)   # plse starts at -inf
        for part in causal_parts(cfg.sel_block, bk, packed):
            kern = functools.partial(_fwd_block_kernel, h=h, rows=rows, n_slots=N,
                                     l_sel=cfg.sel_block, bk=bk, n_sub=n_sub, scale=scale,
                                     prec=dot_precision(q.dtype, interpret, choices),
                                     approx=not interpret, packed=packed, part=part,
                                     offset=offset is not None)
            n_in = len(extra) + len(off_in) + 4
            aliases = {n_in: 1} if len(outs) == 1 else {n_in: 0, n_in + 1: 1}
            outs = pl.pallas_call(
                kern, grid=(meta.shape[0],), out_shape=out_shape,
                input_output_aliases=aliases,
                compiler_params=compiler_params(bs.num_warps, bs.num_stages),
                interpret=interpret, name="nsa_sel_fwd_block",
            )(meta, *extra, *off_in, q, k, v, *outs)
        po, plse = outs
        o, lse = merge_partials(po.reshape(B, T, N, Hq, Dv), plse.reshape(B, T, N, Hq),
                                None if o is None else (o, lse))
        indices.append(index)
    return (o, lse, tuple(indices)) if return_index else (o, lse)


# ---- backward: dK/dV and dQ in one block-major kernel ----------------------------------------
def _bwd_block_kernel(meta_ref, qt_ref, *refs, h, rows, n_slots, l_sel, bk, n_sub, scale, prec,
                      packed=False):
    if packed:
        pt_ref, *refs = refs
    (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, _dk_in, _dv_in, dk_ref, dv_ref,
     pdq_ref) = refs
    b, g, base, start, count, qi, head = work_item(meta_ref, h, rows)
    Dk, Dv = q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    bq = rows // h
    dk_ = jnp.arange(Dk)
    c = scale * LOG2E
    kv = [block_kv(k_ref, v_ref, b, g, base, sub, bk, l_sel) for sub in range(n_sub)]

    def entries(it):   # tile ``it``'s rows: (row_ok, index entry, t*n + slot)
        return item_entries(qt_ref, b, g, start, count, it, qi, bq)

    def rows_of(ix):   # the tile's per-row operands (item_rows: q, dO, lse, delta)
        row_ok, _, ts = ix
        return item_rows(q_ref, do_ref, lse_ref, delta_ref, b, idiv(ts, n_slots), head, row_ok,
                         cdt)

    # loads one tile ahead, as in the forward: tile it + 1's rows and tile it + 2's entries
    # (20 spill instructions in the sm_90 proxy at the 255-register cap, and still -3.5% at 8k
    # on an H200 against the pipeliner's copies: bench/NOTES.md, thirty-sixth session)
    def tile(it, carry):
        (row_ok, ent, ts), (q, do, lse, delta), ix1 = carry[:3]
        carry = carry[3:]
        ix2 = entries(it + 2)
        nxt = rows_of(ix1)
        t = idiv(ts, n_slots)
        p0 = load(pt_ref.at[b, g, ent], row_ok) if packed else None
        out, dq = [], None
        for sub, (k, v, kpos, kcol) in enumerate(kv):
            dk, dv = carry[2 * sub], carry[2 * sub + 1]
            s = dot(q, k, trans_b=True, precision=prec)   # raw; scaled in the exponent
            dk, dv, ds = dkv_accumulate(dk, dv, s, item_mask(kcol, kpos, t, p0, l_sel),
                                        q, do, v, None, lse, delta, prec, cdt, c)
            # the first sub-tile's dot starts dQ (0 + x stays an add per entry when written
            # so); the softmax scale is applied in the slot sum, not per tile
            dq_s = dot(ds, k, precision=prec)
            dq = dq_s if dq is None else dq + dq_s
            out += [dk, dv]
        ts_st = jnp.where(row_ok, ts, pdq_ref.shape[1])   # masked rows -> out of bounds
        store(pdq_ref.at[b, ts_st[:, None], head[:, None], dk_[None, :]], dq, row_ok[:, None])
        return (ix1, nxt, ix2, *out)

    zeros = []
    for _ in range(n_sub):
        zeros += [jnp.zeros((bk, Dk), jnp.float32), jnp.zeros((bk, Dv), jnp.float32)]
    ix0 = entries(0)
    acc = lax.fori_loop(0, idiv(count + (bq - 1), bq), tile,
                        (ix0, rows_of(ix0), entries(1), *zeros))[3:]

    @pl.when(count > 0)
    def _add():
        for sub in range(n_sub):
            atomics.add(dk_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dk)),
                        acc[2 * sub] * scale)
            atomics.add(dv_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dv)),
                        acc[2 * sub + 1])


def sel_backward_block(q, k, v, idx, o, lse, do, gs, cfg: NSAConfig, bs: BlockSizes,
                       scale: float, interpret: bool, *, choices: KernelChoices | None = None,
                       seg=None, index=None):
    """Same contract as ``selection.sel_backward`` (-> dq float32, dk, dv), with dQ formed in
    the block-major dK/dV kernel (``KernelChoices.sel_dq = "block"``): each (query, slot) row of
    a work item already has dS = P (dP - delta) against the item's key block for dK; dQ's share
    of that block is dS K, one more tile dot, written as a partial per (query, slot) (q's dtype
    if 16-bit, else float32; without the softmax scale) and summed over the slots in XLA, which
    applies the scale (Eq. 10's gradient is a sum over the selected blocks; no softmax merge is
    needed, the saved lse already normalises P). This replaces the query-major dQ kernel, which
    loads the n blocks of every query again.
    Slots run in the forward's passes (``slot_passes``): dK/dV accumulate through the passes
    (aliased), and each pass's dQ partials are summed before the next pass starts. dQ added
    into one float32 buffer by atomics instead of the partials was measured slower twice: +51%
    of the op at 8k with acquire-release adds (H100), and with relaxed ones this kernel 1.33 ->
    1.96 ms at 8k / B=4, the op +12% (H200; bench/NOTES.md, thirty-third and forty-first
    sessions).
    ``index``: the block forward's indices, one per pass; None builds them here."""
    B, T, Hq, Dk = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    h = Hq // G
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_keys)
    Ts = cfg.num_sel_blocks(T)
    rows, chunk = item_tiles(bs, h, bs.sel_dq_rows)
    packed = seg is not None
    doc = (seg.start if packed else None, cfg.sel_block)
    passes = slot_passes(idx.shape, Hq, max(Dk, Dv), q.dtype, choices)
    if index is None:
        index = [None] * len(passes)
    if len(index) != len(passes):
        raise ValueError(f"sel_backward_block: {len(index)} indices for {len(passes)} slot "
                         "passes (the forward ran with other KernelChoices)")
    lse, delta = fold_gate(lse, gs, o, do)   # no gs in the kernel: P' = gs P
    T_acc = dkv_rows(T, Ts, cfg.sel_block, bk, n_sub, packed)
    dk = jnp.zeros((B, T_acc, G, Dk), jnp.float32)
    dv = jnp.zeros((B, T_acc, G, Dv), jnp.float32)
    pdt = stored_dtype(q.dtype)
    kern_args = dict(h=h, rows=rows, l_sel=cfg.sel_block, bk=bk, n_sub=n_sub, scale=scale,
                     prec=dot_precision(q.dtype, interpret, choices), packed=packed)
    dq = None
    for (lo, hi), ix in zip(passes, index):
        idx_p = idx[..., lo:hi]
        meta, *extra = ix if ix is not None else _pass_index(idx_p, T, Ts, chunk, seg,
                                                             cfg.sel_block)
        N = hi - lo
        if dq is not None:  # the previous pass's dQ partials are summed (and freed) first
            q, dq, dk, dv = lax.optimization_barrier((q, dq, dk, dv))
        dk, dv, pdq = pl.pallas_call(
            functools.partial(_bwd_block_kernel, n_slots=N, **kern_args),
            grid=(meta.shape[0],),
            out_shape=[jax.ShapeDtypeStruct(dk.shape, jnp.float32),
                       jax.ShapeDtypeStruct(dv.shape, jnp.float32),
                       jax.ShapeDtypeStruct((B, T * N, Hq, Dk), pdt)],
            input_output_aliases={len(extra) + 7: 0, len(extra) + 8: 1},
            compiler_params=compiler_params(bs.num_warps, bs.num_stages),
            interpret=interpret, name="nsa_sel_bwd_block",
        )(meta, *extra, q, k, v, do, lse, delta, dk, dv)
        # slots never listed in the index were not written: masked, not read
        used = slot_keys(idx_p, T, Ts, *doc) < num_ranges(Ts, packed)        # [B,T,G,N]
        used = used.transpose(0, 1, 3, 2)[..., None, None]                   # [B,T,N,G,1,1]
        pdq = pdq.reshape(B, T, N, G, h, Dk)
        dq_p = jnp.sum(jnp.where(used, pdq.astype(jnp.float32), 0.0), axis=2) * scale
        dq = dq_p if dq is None else dq + dq_p
    return dq.reshape(B, T, Hq, Dk), dk[:, :T].astype(k.dtype), dv[:, :T].astype(v.dtype)
