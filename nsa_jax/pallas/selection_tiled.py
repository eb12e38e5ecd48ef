"""Selected-block attention (NSA §3.3.2, Eq. 10-12 applied) as a block-sparse FlashAttention-2.

Same contract as ``selection.sel_forward`` / ``selection.sel_backward``: query t of KV group g
attends to the keys s <= t of the blocks listed in ``idx [B,T,G,n]`` (block j = keys
[j*l', (j+1)*l'), -1 = unused slot). Where the gather kernels run one program per query and load
that query's n blocks, these kernels tile the queries:

* Forward and dQ: one program per (query head, batch, tile of ``bq`` consecutive queries). Rows
  are the queries of one head (no padding of the group's h heads to 16 rows; GQA: head ->
  group head // h). The program walks the *union* of the blocks its rows selected, in sub-tiles
  of ``bs.sel_keys`` keys, with an online softmax (forward) or recomputing p from the saved lse
  (dQ: dS = P * (dP - delta), dQ = dS K). Key s counts for row t iff its block is in t's
  selection (``any(idx[b, t, g, :] == j)``: unpacked rows read it as a bit of the pair's words,
  ``tiled_index.member_table``; packed rows compare their ids in the kernel) and s <= t. Blocks
  no row selected are never loaded.
* dK/dV: one program per (group, batch, key block) walks, in one loop, the (query tile, head)
  pairs of the tiles whose union holds the block and the group's h heads (unpacked rows: two
  loops, the tiles that overlap the block's keys, then the rest; see the causal split below),
  accumulating dK/dV in registers; one plain store per block (each program owns its block's
  rows: no atomics, no zero-initialised accumulator). Its logits are formed keys-first (s^T = K Q^T,
  ``common.dkv_accumulate_t``), so P^T and dS^T enter the dV and dK dots without a transpose
  through shared memory (-7% at 2k and 4k on an H100; bench/NOTES.md, twenty-third session).

Grids put the tile / block axis last (slowest in launch order) and order it longest program
first: the last query tiles see the most blocks, the first key blocks (forced initial blocks
among them) are in the most tiles.

Both lists come from ``tiled_index.tile_index`` (outside the kernels, each call): per tile its
ascending blocks (the forward / dQ loops), per block its ascending tiles (dK/dV), with counts that
bound dynamic trip counts.

Causal split (unpacked rows): a (tile, block) pair whose block ends at or before the tile's first
query is *full*: every key is causally visible to every row, so the only mask left is the row's
membership, a per-row bias (0 or -inf) instead of a [bq, bk] mask of compares and selects (Nsight
Compute, twenty-third session: the forward's integer/logic pipe was its busiest, 49% of peak). The
bias enters per row, with the row max or the saved lse: p = exp2(s * c - (m - bias)), one fused
multiply-add per logit on the raw dot s (``common.softmax_step`` / ``probs`` with ``c``;
bench/NOTES.md, twenty-fourth session: forward -6% on an H100 at 2k). Where the key sub-tiles reach
past l' (l' not a multiple of the sub-tile), a per-key bias (-inf) masks those keys in s. Because
the lists ascend, the full pairs are a prefix of each tile's block list and a suffix of each
block's tile list (``tiled_index.full_counts``, ``diagonal_counts``), so each kernel runs two
loops, neither with a branch inside: the full pairs with the bias, the others with the whole mask.
Same values for finite logits: a row with bias 0 is unbiased and a row with -inf gets p = 0. (A
non-finite logit, from an inf in q or K, becomes NaN for the tile's rows that did not select its
block, where the mask dropped it before; the rows that selected it are NaN either way, as in the
reference.) The split itself: on an H100 at the 125M shape the forward went -12% / -15% and dQ
-11% / -15% at 2k / 4k.

Work: a tile pays for every block of its union, so cost grows with how far the rows' selections
differ. At short T most visible blocks are selected anyway (with n = 16, l' = 64 every query
t < 1024 selects all of its blocks) and the tiled kernels do near-dense causal work at full
tensor-core tile height with each K/V tile read once per (tile, head) instead of once per query;
at long T the union approaches all visible blocks (random-like selections) and the work grows
~T^2 while the gather kernels grow ~T. ``nsa.py`` picks between them (``KernelChoices.sel_impl``).

Packed documents (``seg``, a ``semantics.SegmentLayout``; None compiles exactly the unpacked
kernels): ids are document-relative, so block j of the query at t covers keys [S + j*l',
S + (j+1)*l'), S = start(t), visible where S <= s <= t. Documents need not start at multiples
of l', so the kernels keep walking *aligned* blocks u (keys [u*l', (u+1)*l'), one K/V tile per
(tile, block) as above) and ``tile_index`` lists, for each selected (t, j), the aligned block
floor((S + j*l')/l') and, when S is unaligned, the next one (only blocks with a key <= t).
Inside aligned block u, row t's document-relative block of key s is floor((s - S)/l'): at most
two values, j0 = floor((u*l' - S)/l') and j0 + 1, split at S + (j0 + 1)*l'. The kernels test
both for membership in the row's selection (O(bq * n) per block, as the unpacked test of u) and
keep s where its half's block is selected, s >= S and s <= t (``_block_rule``, ``_visible``).
No [T, T] mask and no per-query gather; the cost is in the union: a selected block of an
unaligned document overlaps two aligned blocks, so a tile's union (and the K/V it reads) can
grow to up to 2x the blocks of the same selection in an aligned document, and a tile that spans
documents takes the union of their selections (as rows with different selections do).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import (LOG2E, NEG_INF, BlockSizes, cdiv, compiler_params,
                                   dkv_accumulate_t, dot, dot_precision, dscores, fold_gate,
                                   grad_rows, idiv, load, probs, sel_sub_tiles, softmax_finish,
                                   softmax_init, softmax_step, store)
from nsa_jax.pallas.tiled_index import (WORD_BITS, diagonal_counts, full_counts, rows_operand,
                                        seg_args, tile_lists)


def _sub_tiles(cfg: NSAConfig, bs: BlockSizes):
    return sel_sub_tiles(cfg.sel_block, bs.sel_keys)


def _row_bias(member):
    """[bq] float32: 0 where the row selected the pair's block, -inf where not (a full pair's
    mask)."""
    return jnp.where(member, 0.0, NEG_INF)


def _list_members(words_ref, b, g, a, u, bq: int):
    """[bq] bool: the rows of a (tile, block) pair that selected its block (unpacked rows), from
    the pair's bits ``words_ref[b, g, a, u, :]`` (``tiled_index.member_table``; a is the tile
    whose block list, or the block whose tile list, holds the pair at position u): ceil(bq / 32)
    scalar loads per pair and a select and a shift per row, where a test of the row's ids costs
    a [bq, n] compare and a reduction per pair."""
    nw = words_ref.shape[-1]
    r = jnp.arange(bq, dtype=jnp.int32)
    word = words_ref[b, g, a, u, nw - 1]
    for i in range(nw - 2, -1, -1):
        word = jnp.where(r < (i + 1) * WORD_BITS, words_ref[b, g, a, u, i], word)
    return (lax.shift_right_logical(word, r % WORD_BITS) & 1) != 0


def _full_keys(l_sel: int, bk: int, n_sub: int) -> bool:
    """The sub-tiles cover exactly l' keys (no key past the block to mask)."""
    return bk * n_sub == l_sel


def _members(sel, j):
    """[bq] bool: row r selected block j (``sel`` [bq, n_p] block ids, -1 unused; j a scalar or
    one id per row, [bq, 1])."""
    return jnp.max(jnp.where(sel == j, 1, 0), axis=1) > 0


def _block_rule(sel, j, l_sel: int, st):
    """Per-row facts that decide which keys of aligned block j (keys [j*l', (j+1)*l')) a tile's
    packed rows see (``_visible``; unpacked rows' rule is their membership, ``_list_members``).
    With ``st`` [bq] the document starts, row r's document-relative block of key s is
    floor((s - st_r) / l'), which over block j takes at most two values, j0 = floor((j*l' -
    st_r) / l') below the split st_r + (j0 + 1)*l' and j0 + 1 from there; -> (j0 selected,
    j0 + 1 selected, split, st). j*l' - st_r is clamped to >= -l' (an earlier block lies wholly
    before the document, masked by s >= st_r) so the division is of non-negative values; a
    clamped j0 = -1 may match an unused -1 slot, but only for keys s < split = st_r."""
    j0 = idiv(jnp.maximum(j * l_sel - st, -l_sel) + l_sel, l_sel) - 1
    return (_members(sel, j0[:, None]), _members(sel, j0[:, None] + 1),
            st + (j0 + 1) * l_sel, st)


def _visible(rule, t, kpos, kvalid, keys_first: bool = False):
    """[bq, bk] bool (``keys_first``: [bk, bq]): row t sees key kpos (``rule``: the rows'
    membership [bq], or packed ``_block_rule``): s in one of its selected blocks, s <= t, s < T
    (and s >= its document's start, packed)."""
    def row(x):   # a per-row vector along the rows' axis
        return x[None, :] if keys_first else x[:, None]

    def key(x):   # a per-key vector along the keys' axis
        return x[:, None] if keys_first else x[None, :]

    if not isinstance(rule, tuple):
        return row(rule) & key(kvalid) & (key(kpos) <= row(t))
    m0, m1, split, st = rule
    s = key(kpos)
    member = ((s < row(split)) & row(m0)) | ((s >= row(split)) & row(m1))
    return member & (s >= row(st)) & key(kvalid) & (s <= row(t))


def _starts(st_ref, b, qt, bq: int, ok):
    """[bq] document starts of a tile's rows (packed kernels; 0 for rows past T)."""
    return load(st_ref.at[b, pl.ds(qt * bq, bq)], ok)


def _tile_program(T: int, bq: int):
    """(head, batch, query tile) of a forward / dQ program on grid (Hq, B, n_tiles). The
    launch order runs the grid's first axis fastest, so tiles go last to first: later tiles
    see more blocks, and the longest programs start first."""
    return pl.program_id(0), pl.program_id(1), cdiv(T, bq) - 1 - pl.program_id(2)


def _tile_rows(qt, bq: int, T: int):
    t = qt * bq + jnp.arange(bq)
    return t, t < T


def _tile_rule(rows_ref, st_ref, b, g, qt, bq: int, l_sel: int, ok):
    """-> rule(u, j): the forward / dQ tile's rule for the pair at position u of its block list
    (block j): unpacked (``st_ref`` None), the rows' membership from the pair's bits; packed,
    ``_block_rule`` of the rows' ids (loaded once per tile) and document starts."""
    if st_ref is None:
        return lambda u, j: _list_members(rows_ref, b, g, qt, u, bq)
    sel = load(rows_ref.at[b, pl.ds(qt * bq, bq), g, :], ok[:, None], other=-1)
    st = _starts(st_ref, b, qt, bq, ok)
    return lambda u, j: _block_rule(sel, j, l_sel, st)


def _full_sub_tile(k_ref, v_ref, b, base, sub, g, bk: int, l_sel: int, n_sub: int):
    """K, V of sub-tile ``sub`` of a full pair's block and the column bias of its keys past l'
    (None when the sub-tiles cover exactly l'). A full block lies before the tile's first query,
    so every key is < T: no bound to test."""
    rows = pl.ds(base + sub * bk, bk)
    if _full_keys(l_sel, bk, n_sub):
        return plgpu.load(k_ref.at[b, rows, g, :]), plgpu.load(v_ref.at[b, rows, g, :]), None
    kvalid = sub * bk + jnp.arange(bk) < l_sel
    return (load(k_ref.at[b, rows, g, :], kvalid[:, None]),
            load(v_ref.at[b, rows, g, :], kvalid[:, None]), jnp.where(kvalid, 0.0, NEG_INF))


def _with_cols(s, col_bias):
    """A full pair's raw logits with its padded keys' bias (None: no key past l')."""
    return s if col_bias is None else s + col_bias[None, :]


def _pair_sub_tiles(full: bool, q, k_ref, v_ref, b, g, j, rule, t, *, T: int, l_sel: int,
                    bk: int, n_sub: int, prec):
    """For each key sub-tile of block j against a query tile (forward and dQ): (k, v, the raw
    logits q k^T, their mask). A full pair's mask is None: its rows' membership enters as the
    caller's row bias (``_row_bias``, folded into the exponent with the scale:
    ``common.softmax_step`` / ``probs`` with ``c``), and keys past l' carry -inf in s; any
    other pair's mask is ``_visible`` of ``rule``."""
    base = j * l_sel
    for sub in range(n_sub):
        if full:
            k, v, cb = _full_sub_tile(k_ref, v_ref, b, base, sub, g, bk, l_sel, n_sub)
            yield k, v, _with_cols(dot(q, k, trans_b=True, precision=prec), cb), None
            continue
        off = sub * bk + jnp.arange(bk)
        kpos = base + off
        kvalid = (off < l_sel) & (kpos < T)
        k = load(k_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kvalid[:, None])
        v = load(v_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kvalid[:, None])
        yield k, v, dot(q, k, trans_b=True, precision=prec), _visible(rule, t, kpos, kvalid)


# ---- forward ---------------------------------------------------------------------------------
def _fwd_kernel(blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref, rows_ref, *refs, h, bq,
                l_sel, bk, n_sub, scale, prec, packed=False):
    """``rows_ref``: unpacked, the pairs' membership bits (``tiled_index.member_table``, by
    tile); packed, the rows' padded ids."""
    if packed:
        st_ref, o_ref, lse_ref = refs
    else:
        o_ref, lse_ref = refs
    T, Dv = q_ref.shape[1], v_ref.shape[-1]
    hd, b, qt = _tile_program(T, bq)
    g = idiv(hd, h)
    t, ok = _tile_rows(qt, bq, T)
    q = load(q_ref.at[b, pl.ds(qt * bq, bq), hd, :], ok[:, None])
    rule = _tile_rule(rows_ref, st_ref if packed else None, b, g, qt, bq, l_sel, ok)
    c = scale * LOG2E

    pairs = functools.partial(_pair_sub_tiles, q=q, k_ref=k_ref, v_ref=v_ref, b=b, g=g, t=t, T=T,
                              l_sel=l_sel, bk=bk, n_sub=n_sub, prec=prec)

    def block(u, carry, full):
        m, lsum, acc = carry
        j = blocks_ref[b, g, qt, u]
        r = rule(u, j)
        bias = _row_bias(r) if full else None
        for k, v, s, vis in pairs(full, j=j, rule=r):
            s = s if vis is None else jnp.where(vis, s, NEG_INF)
            m, alpha, p, lsum = softmax_step(m, lsum, s, c, bias)
            acc = acc * alpha[:, None] + dot(p.astype(v.dtype), v, precision=prec)
        return m, lsum, acc

    carry = softmax_init(bq, Dv)
    nfull = 0
    if not packed:
        nfull = nfull_ref[b, g, qt]
        carry = lax.fori_loop(0, nfull, functools.partial(block, full=True), carry)
    m, lsum, acc = lax.fori_loop(nfull, bcount_ref[b, g, qt], functools.partial(block, full=False),
                                 carry)
    l_safe, lse = softmax_finish(m, lsum)
    t_st = jnp.where(ok, t, T)  # masked rows -> out of bounds (dropped)
    dv_ = jnp.arange(Dv)
    store(o_ref.at[b, t_st[:, None], hd, dv_[None, :]], acc / l_safe[:, None], ok[:, None])
    store(lse_ref.at[b, t_st, hd], lse, ok)


def sel_tiled_forward(q, k, v, idx, cfg: NSAConfig, bs: BlockSizes, scale: float,
                      interpret: bool, *, choices=None, seg=None):
    """-> o float32 [B,T,Hq,Dv], lse2 float32 [B,T,Hq] (base-2 log-sum-exp of scaled logits,
    +inf for a row with no visible key); same as ``selection.sel_forward`` (``choices``:
    ``KernelChoices``, None = defaults; ``seg``: packed rows' ``semantics.SegmentLayout``, idx
    document-relative, None = unpacked)."""
    B, T, Hq, _ = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    bq = bs.sel_tile_q
    bk, n_sub = _sub_tiles(cfg, bs)
    segs = seg_args(seg)
    (blocks, bcount, _, _), table = tile_lists(idx, T, cfg, bq, seg)
    nfull = full_counts(blocks, bcount, bq, cfg, seg)
    kern = functools.partial(_fwd_kernel, h=Hq // G, bq=bq, l_sel=cfg.sel_block, bk=bk,
                             n_sub=n_sub, scale=scale,
                             prec=dot_precision(q.dtype, interpret, choices), packed=bool(segs))
    return pl.pallas_call(
        kern, grid=(Hq, B, cdiv(T, bq)),
        out_shape=[jax.ShapeDtypeStruct((B, T, Hq, Dv), jnp.float32),
                   jax.ShapeDtypeStruct((B, T, Hq), jnp.float32)],
        compiler_params=compiler_params(bs.num_warps, bs.num_stages),
        interpret=interpret, name="nsa_sel_tiled_fwd",
    )(blocks, bcount, nfull, q, k, v, rows_operand(idx, T, cfg, bq, seg, table, blocks=blocks),
      *segs)


# ---- backward: dQ ------------------------------------------------------------------------------
def _bwd_dq_kernel(blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref, rows_ref, do_ref,
                   gs_ref, lse_ref, delta_ref, *refs, h, bq, l_sel, bk, n_sub, scale, prec,
                   packed=False, with_init=False):
    st_ref = refs[0] if packed else None
    init_ref = refs[-2] if with_init else None   # dQ of the branches before (dq_in)
    dq_ref = refs[-1]
    T, Dk = q_ref.shape[1], q_ref.shape[-1]
    hd, b, qt = _tile_program(T, bq)
    g = idiv(hd, h)
    cdt = q_ref.dtype
    t, ok = _tile_rows(qt, bq, T)
    rows = pl.ds(qt * bq, bq)
    q, do, gs, lse, delta = grad_rows(q_ref, do_ref, gs_ref, lse_ref, delta_ref,
                                      b, rows, hd, ok, cdt)
    rule = _tile_rule(rows_ref, st_ref if packed else None, b, g, qt, bq, l_sel, ok)
    c = scale * LOG2E

    pairs = functools.partial(_pair_sub_tiles, q=q, k_ref=k_ref, v_ref=v_ref, b=b, g=g, t=t, T=T,
                              l_sel=l_sel, bk=bk, n_sub=n_sub, prec=prec)

    def block(u, dq, full):
        j = blocks_ref[b, g, qt, u]
        r = rule(u, j)
        bias = _row_bias(r) if full else None
        for k, v, s, vis in pairs(full, j=j, rule=r):
            ds = dscores(probs(s, vis, lse, c, bias), do, v, gs, delta, prec)
            dq = dq + dot(ds.astype(cdt), k, precision=prec)
        return dq

    dq = jnp.zeros((bq, Dk), jnp.float32)
    if with_init:   # the accumulator's start, unscaled (as in compressed._bwd_dq_kernel)
        t_ld = jnp.where(ok, t, 0)
        dq = load(init_ref.at[b, t_ld[:, None], hd, jnp.arange(Dk)[None, :]],
                  ok[:, None]).astype(jnp.float32) * (1.0 / scale)
    nfull = 0
    if not packed:
        nfull = nfull_ref[b, g, qt]
        dq = lax.fori_loop(0, nfull, functools.partial(block, full=True), dq)
    dq = lax.fori_loop(nfull, bcount_ref[b, g, qt], functools.partial(block, full=False), dq)
    t_st = jnp.where(ok, t, T)
    dk_ = jnp.arange(Dk)
    store(dq_ref.at[b, t_st[:, None], hd, dk_[None, :]], dq * scale, ok[:, None])


# ---- backward: dK/dV ---------------------------------------------------------------------------
def _bwd_dkv_kernel(tiles_ref, tcount_ref, ndiag_ref, q_ref, k_ref, v_ref, rows_ref, do_ref,
                    lse_ref, delta_ref, *refs, h, bq, l_sel, bk, n_sub, scale, prec,
                    packed=False):
    """``rows_ref``: unpacked, the pairs' membership bits (``tiled_index.member_table``, by
    block); packed, the rows' padded ids."""
    if packed:
        st_ref, dk_ref, dv_ref = refs
    else:
        dk_ref, dv_ref = refs
    g, b, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    T, Dk, Dv = q_ref.shape[1], q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    c = scale * LOG2E
    base = j * l_sel
    count = tcount_ref[b, g, j]
    ndiag = count if packed else ndiag_ref[b, g, j]
    dk_, dv_ = jnp.arange(Dk), jnp.arange(Dv)

    for sub in range(n_sub):
        off = sub * bk + jnp.arange(bk)
        kpos = base + off
        kvalid = (off < l_sel) & (kpos < T)
        k = load(k_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kvalid[:, None])
        v = load(v_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kvalid[:, None])

        col_bias = None if _full_keys(l_sel, bk, n_sub) else jnp.where(kvalid, 0.0, NEG_INF)

        def step(it, carry, full, k=k, v=v, kpos=kpos, kvalid=kvalid, col_bias=col_bias):
            # One loop over (tile, head) pairs, not a head loop nested in a tile loop: Triton
            # pipelines only a kernel's innermost loops, so the next pair's q / dO loads are
            # issued while this pair's dots run, across tile boundaries too.
            u = idiv(it, h)
            i = it - u * h
            qt = tiles_ref[b, g, j, u]
            t, ok = _tile_rows(qt, bq, T)
            rows = pl.ds(qt * bq, bq)
            if packed:
                sel = load(rows_ref.at[b, rows, g, :], ok[:, None], other=-1)
                member = None
            else:
                member = _list_members(rows_ref, b, g, j, u, bq)
            dk, dv = carry
            q, do, _, lse, delta = grad_rows(q_ref, do_ref, None, lse_ref, delta_ref, b, rows,
                                             g * h + i, ok, cdt)
            # keys as rows (s^T = K Q^T): P^T and dS^T feed the dK / dV dots as they come
            s_t = dot(k, q, trans_b=True, precision=prec)   # raw; scaled in the exponent
            bias = None
            if full:   # the tile starts at or after the block's last key (module docstring)
                bias, vis_t = _row_bias(member), None
                if col_bias is not None:
                    s_t = s_t + col_bias[:, None]
            else:
                rule = (_block_rule(sel, j, l_sel, _starts(st_ref, b, qt, bq, ok)) if packed
                        else member)
                vis_t = _visible(rule, t, kpos, kvalid, keys_first=True)
            return dkv_accumulate_t(dk, dv, s_t, vis_t, q, do, v, None, lse, delta, prec, cdt,
                                    c, bias)

        carry = (jnp.zeros((bk, Dk), jnp.float32), jnp.zeros((bk, Dv), jnp.float32))
        carry = lax.fori_loop(0, ndiag * h, functools.partial(step, full=False), carry)
        if not packed:
            carry = lax.fori_loop(ndiag * h, count * h, functools.partial(step, full=True), carry)
        dk, dv = carry
        k_st = jnp.where(kvalid, kpos, T)  # masked rows -> out of bounds (dropped)
        store(dk_ref.at[b, k_st[:, None], g, dk_[None, :]], dk * scale, kvalid[:, None])
        store(dv_ref.at[b, k_st[:, None], g, dv_[None, :]], dv, kvalid[:, None])


def _bwd_common(q, k, cfg: NSAConfig, bs: BlockSizes, scale: float, interpret: bool,
                choices=None, seg=None):
    bk, n_sub = _sub_tiles(cfg, bs)
    return dict(h=q.shape[2] // k.shape[2], bq=bs.sel_tile_q, l_sel=cfg.sel_block, bk=bk,
                n_sub=n_sub, scale=scale, prec=dot_precision(q.dtype, interpret, choices),
                packed=seg is not None)


def sel_tiled_bwd_dq(q, k, v, idx, blocks, bcount, do, gs, lse, delta, cfg: NSAConfig,
                     bs: BlockSizes, scale: float, interpret: bool, *, choices=None, seg=None,
                     table=None, dq_in=None, dq_dtype=jnp.float32):
    """dQ [B,T,Hq,Dk] in ``dq_dtype`` (kernel ``nsa_sel_tiled_bwd_dq``) from ``tile_index``'s
    per-tile lists, float32 ``gs`` and ``delta = gs * rowsum(o * do)`` (``seg``: packed rows'
    layout, the one ``tile_index`` was given; ``table``: unpacked rows' ``member_table``, None =
    built here); ``dq_in`` (q's shape, None = 0) is added in float32 before the store, as in
    ``compressed.cmp_backward``. The gate stays a row operand here, unlike the dK/dV kernels'
    fold (``sel_tiled_backward`` says why)."""
    B, T, Hq, Dk = q.shape
    init = () if dq_in is None else (dq_in,)
    return pl.pallas_call(
        functools.partial(_bwd_dq_kernel, with_init=bool(init),
                          **_bwd_common(q, k, cfg, bs, scale, interpret, choices, seg)),
        grid=(Hq, B, cdiv(T, bs.sel_tile_q)),
        out_shape=jax.ShapeDtypeStruct((B, T, Hq, Dk), dq_dtype),
        compiler_params=compiler_params(bs.num_warps, bs.num_stages),
        interpret=interpret, name="nsa_sel_tiled_bwd_dq",
    )(blocks, bcount, full_counts(blocks, bcount, bs.sel_tile_q, cfg, seg), q, k, v,
      rows_operand(idx, T, cfg, bs.sel_tile_q, seg, table, blocks=blocks), do, gs, lse, delta,
      *seg_args(seg), *init)


def sel_tiled_bwd_dkv(q, k, v, idx, tiles, tcount, do, lse, delta, cfg: NSAConfig,
                      bs: BlockSizes, scale: float, interpret: bool, *, choices=None, seg=None,
                      table=None):
    """dK, dV float32 [B,T,G,D] (kernel ``nsa_sel_tiled_bwd_dkv``) from ``tile_index``'s
    per-block tile lists, float32 ``lse`` and ``delta`` with the gate folded in
    (``common.fold_gate``: no gs operand); other arguments as ``sel_tiled_bwd_dq``."""
    B, T, G, Dk = k.shape
    Dv = v.shape[-1]
    return pl.pallas_call(
        functools.partial(_bwd_dkv_kernel, **_bwd_common(q, k, cfg, bs, scale, interpret,
                                                         choices, seg)),
        grid=(G, B, cfg.num_sel_blocks(T)),
        out_shape=[jax.ShapeDtypeStruct((B, T, G, Dk), jnp.float32),
                   jax.ShapeDtypeStruct((B, T, G, Dv), jnp.float32)],
        compiler_params=compiler_params(bs.num_warps, bs.num_stages),
        interpret=interpret, name="nsa_sel_tiled_bwd_dkv",
    )(tiles, tcount, diagonal_counts(tiles, tcount, bs.sel_tile_q, cfg, seg), q, k, v,
      rows_operand(idx, T, cfg, bs.sel_tile_q, seg, table, tiles=tiles), do, lse, delta,
      *seg_args(seg))


def sel_tiled_backward(q, k, v, idx, o, lse, do, gs, cfg: NSAConfig, bs: BlockSizes,
                       scale: float, interpret: bool, *, choices=None, seg=None,
                       dq_kernel=None, dkv_kernel=None, dq_in=None, dq_dtype=jnp.float32):
    """-> dq (``dq_dtype``), dk, dv (input dtypes) for the output cotangent ``gs[..., None] *
    do``; same contract as ``selection.sel_backward`` (``do`` in its own dtype, ``gs`` [B,T,Hq]
    float32 per-row scale, None = 1; ``seg`` as ``sel_tiled_forward``); ``choices.f32_dot`` sets
    float32 dot precision. ``dq_kernel`` / ``dkv_kernel``: other dQ / dK, dV kernels of
    ``mosaic_tiled_dq.sel_tiled_bwd_dq_mosaic``'s signature (None: ``sel_tiled_bwd_dq`` /
    ``sel_tiled_bwd_dkv``); they get the lists built here with their tile height (``lists``),
    so that the two kernels of one backward build the index once when the heights agree.
    ``dq_in`` / ``dq_dtype`` (``sel_tiled_bwd_dq``'s): only with ``dq_kernel`` None; dq is then
    ``dq_in`` + this branch's dQ, in ``dq_dtype``."""
    if dq_kernel is not None and (dq_in is not None or dq_dtype != jnp.float32):
        raise ValueError("sel_tiled_backward: dq_in / dq_dtype need the Triton dQ kernel "
                         "(dq_kernel=None)")
    B, T, Hq, _ = q.shape
    # dK/dV take the gate folded into lse and delta (common.fold_gate: P' = gs P, no gs
    # operand). dQ keeps it as a row operand: on an H200 the folded Triton dQ ran 0.412 -> 0.448
    # ms at 125M 2k / B=16 while the folded Mosaic GPU dK/dV went 0.550 -> 0.530 (bench/NOTES.md,
    # fortieth session).
    lse_f, delta_f = fold_gate(lse, gs, o, do)
    gs = jnp.ones((B, T, Hq), jnp.float32) if gs is None else gs.astype(jnp.float32)
    delta = gs * delta_f   # [B,T,Hq] float32: gs * rowsum(o * do), one row sum for both
    built = tile_lists(idx, T, cfg, bs.sel_tile_q, seg)
    (blocks, bcount, tiles, tcount), table = built
    other = dict(seg=seg, lists=(bs.sel_tile_q, built))   # the dq_kernel / dkv_kernel keywords
    if dq_kernel is None:
        dq = sel_tiled_bwd_dq(q, k, v, idx, blocks, bcount, do, gs, lse, delta, cfg, bs, scale,
                              interpret, choices=choices, seg=seg, table=table, dq_in=dq_in,
                              dq_dtype=dq_dtype)
    else:
        dq = dq_kernel(q, k, v, idx, do, gs, lse, delta, cfg, scale, interpret, **other)
    if dkv_kernel is None:
        dk, dv = sel_tiled_bwd_dkv(q, k, v, idx, tiles, tcount, do, lse_f, delta_f, cfg, bs,
                                   scale, interpret, choices=choices, seg=seg, table=table)
    else:
        dk, dv = dkv_kernel(q, k, v, idx, do, None, lse_f, delta_f, cfg, scale, interpret,
                            **other)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype)
