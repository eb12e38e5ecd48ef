"""Fused selection-block scoring (NSA Eq. 8-10): a Pallas kernel.

A second pass over the compressed keys after the compressed forward (``compressed.py``), which
returns the base-2 log-sum-exp it needs: it recomputes p_cmp = exp2(s - lse) tile by tile,
weights it by the overlap W[i, j] = |[i*d, i*d+l) ∩ [j*l', (j+1)*l')| / d (Eq. 9, from iotas)
and sums the h heads of each query of a KV group (Eq. 10). It walks the compressed keys in steps
of S*l'/d, which finishes S selection blocks per step; the block a step's last compressed keys
spill into is carried to the next step. Output: scores [B,T,G,Ts] float32 -- no [B,T,Hq,Tc]
probability tensor ever reaches memory.

Two tile layouts (``KernelChoices.score_heads``):

* "rows": a tile's rows are (head, query) pairs, head-major, h padded to a power of two hs, so
  the group's heads share one K load and one dot per step. When l'/d is a power of two (the
  fast path) the step's logits are formed transposed, s^T = K Q^T [keys, (head, query)]: a
  query's hs heads are then registers of one thread in the MMA layout, summed without shuffles
  or shared memory, and each selection block's r = l'/d compressed blocks are rows, summed by
  reshape; the part of a compressed block that spills into the next selection block is rotated
  one row by a [S, S, bq] 0/1 contraction, and the rotated tile is the loop carry (its row 0 is
  owed to the next step's first block). On an H200 at the bench shape (64k) the kernel went
  10.1 -> 7.8 ms with the head-major rows and the weights formed once, then -> 7.2 ms
  transposed, 7.1 with the rotated carry (bench/NOTES.md, thirty-eighth session). Otherwise
  (general path) two float32 dots, p @ W and a 0/1 head-sum matrix, on untransposed tiles.
* "loop": a tile's rows are ``BlockSizes.score_q`` queries of one head, and the h heads are a
  loop inside each key step (one K load, h dots): p of every head lands in the same [queries,
  keys] layout and is summed there. No padded head slots (h = 6 runs 6 of 8 in "rows") and no
  head reshape; the block sums are the same as the rows layout's, on one row per query.

Key-range splits (``BlockSizes.score_splits``; None: :func:`score_splits`): the score columns
are cut into ``splits`` ranges of whole steps, each its own program, where too few query tiles
would leave the GPU idle (a continuation chunk of a chunked prefill: at C = 4,096 the loop layout
made 128 programs, each walking ~60 steps in turn, and a chunk of 1,024 queries took as long;
bench/NOTES.md, fifty-first session). A range's first block is owed the spill of the step before
it, which the range recomputes (a step's carry out does not depend on the carry it is given).

Packed documents (``seg``): one pass per document of a query tile, each the unpacked
computation in that document's coordinates (slot lo + i is its block i, the query's position is
r(t), selection block (i - lo)*d // l') over the rows of that document only.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas.common import (LOG2E, MIN_DOT, NEG_INF, POS_INF, BlockSizes, cdiv,
                                   choices_or_default, compiler_params, dot, dot_precision, idiv,
                                   load, next_pow2, probs, score_precision, store)
from nsa_jax.pallas.compressed import _load_rows, _num_visible, _rows, _tile_rows


BIG_POS = 2 ** 30  # past every position (a masked query row's position in a minimum)
SPLIT_MIN_PROGRAMS = 512  # score_splits: split the key range until the grid has this many
SPLIT_MAX = 8


def _overlap(i, j, d: int, l: int, l_sel: int):
    """|[i*d, i*d+l) ∩ [j*l', (j+1)*l')| / d, broadcasting int arrays i and j (Eq. 9)."""
    lo = jnp.maximum(i * d, j * l_sel)
    hi = jnp.minimum(i * d + l, (j + 1) * l_sel)
    return jnp.maximum(hi - lo, 0).astype(jnp.float32) / d


def score_layout(h: int, Dk: int, itemsize: int, choices: KernelChoices | None,
                 score_q: int) -> str:
    """``KernelChoices.score_heads`` resolved: "auto" -> "loop" when h is not a power of two
    (the rows layout pads it) and the h query tiles a program keeps (``score_q`` queries x Dk
    each) fit 48 KB, else "rows"."""
    c = choices_or_default(choices).score_heads
    if c != "auto":
        return c
    fits = h * score_q * Dk * itemsize <= 48 * 1024
    return "loop" if h & (h - 1) and fits else "rows"


def score_splits(programs: int, n_tiles: int) -> int:
    """Key-range splits of the scoring kernel when ``BlockSizes.score_splits`` is None: the
    fewest (a power of two, <= ``SPLIT_MAX``) that give ``programs`` x splits >=
    ``SPLIT_MIN_PROGRAMS``, with at least one step of columns each (n_tiles: score column tiles).
    The 125M training points measured (2k / B=16, 8k / B=4, 64k / B=1) have >= 1,024 programs,
    so one split; short rows at a small batch get more. Measured on an H200 (bench/NOTES.md,
    fifty-first session): past ~512 programs more splits cost (8 splits of a 4,096-query chunk
    +52% against 4)."""
    n = 1
    while n < SPLIT_MAX and programs * n < SPLIT_MIN_PROGRAMS and 2 * n <= n_tiles:
        n *= 2
    return n


def _score_kernel(q_ref, k_ref, lse_ref, *refs, h, hs, rows, S, r, step, bks, d, l, l_sel,
                  scale, prec, sprec, fast, loop, splits=1, packed=False):
    """Eq. 8-10 for one tile of queries x the h heads of group g (module docstring).

    Rows layout: query qi = row // hs, head = row % hs. Loop layout (``loop``): row = query,
    hs = 1, and the h heads are loaded as h query tiles. A step's spill into the next step's
    first block is carried as a vector.

    Packed (refs start with cmp_lo, rel, start [B,T]): one pass per document of the tile, each
    the unpacked computation in that document's coordinates over the rows of that document
    only; each pass writes every score column of its rows.

    ``splits`` > 1: the third grid axis is (row, split), and this program writes the score
    columns of its split's range of steps only (module docstring).
    """
    if packed:
        lo_ref, rel_ref, st_ref, sc_ref = refs
    else:
        (sc_ref,) = refs
    qt, g, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    T, Tc, Dk = q_ref.shape[1], k_ref.shape[1], q_ref.shape[-1]
    Ts = sc_ref.shape[-1]
    n_tiles = cdiv(Ts, S)
    t_lo, t_hi = 0, n_tiles                      # this program's score column tiles
    if splits > 1:
        per = cdiv(n_tiles, splits)
        b, sp = b // splits, b % splits
        t_lo = sp * per
        t_hi = jnp.minimum(t_lo + per, n_tiles)
    bq = rows // hs
    nq = bq if fast or loop else max(MIN_DOT, next_pow2(bq))  # query rows of a score tile
    # loop: hs = 1, one row per query; rows: head-major, so that a query's head sum (Eq. 10)
    # adds registers of one thread (fast path, transposed) or registers and warps, not lanes
    qi, head, t, ok = _rows(qt, g, h, rows, T, hs, head_major=not loop)
    if loop:   # h tiles of one head each (head = g*h here): the group's heads g*h + e
        heads = [(_load_rows(q_ref, b, t, head + e, ok, Dk),
                  load(lse_ref.at[b, t, head + e], ok, POS_INF)) for e in range(h)]
    else:
        q = _load_rows(q_ref, b, t, head, ok, Dk)
        lse = load(lse_ref.at[b, t, head], ok, POS_INF)
    u = jnp.arange(nq)
    tq = qt * bq + u
    q_ok = (u < bq) & (tq < T)
    tq_st = jnp.where(q_ok, tq, T)
    col = jnp.arange(S)
    if not packed:
        n_vis = _num_visible(jnp.minimum(qt * bq + bq - 1, T - 1), d, l, Tc)
    c = scale * LOG2E
    if not (fast or loop):
        # A[u, row] = 1 iff the row belongs to query u of the tile: the head sum (Eq. 10).
        A = ((u[:, None] == qi[None, :]) & ok[None, :]).astype(jnp.float32)
    # The Eq. 9 weights of a step's compressed block kt*step + a in selection blocks kt*S + j
    # do not depend on kt (step*d = S*l'), and on the fast path only on a mod r, the compressed
    # block's place in the selection block it starts in: [r] vectors, formed once (per-column
    # weights of the step held across the loop cost ~36 registers in the sm_90 proxy)
    transposed = fast and not loop   # the rows layout's fast path: score_step_t
    if fast:
        w_main = _overlap(jnp.arange(r), 0, d, l, l_sel)   # in the block it starts in
        w_next = _overlap(jnp.arange(r), 1, d, l, l_sel)   # spilled into the next block
        # [S, S] 0/1: block c's spill to c + 1 (transposed: and S-1 -> 0, the carry's row)
        to = (col[:, None] + 1) % S if transposed else col[:, None] + 1
        shift = (to == col[None, :]).astype(jnp.float32)
    else:
        a = jnp.arange(bks)
        W = _overlap(a[:, None], col[None, :], d, l, l_sel)  # [bks, S]
        w_spill = _overlap(a, S, d, l, l_sel)  # into the next step's first block

    def scores(rmask, qmask, tv, lo, n_vis, n_full):
        """Every score column of the rows ``rmask`` (queries ``qmask``) at positions ``tv``,
        over slots lo + i, i < n_vis (lo = None: slot i). The first ``n_full`` steps are
        visible to every row of ``rmask`` (their slots end before the first row's position):
        they skip the causal mask (Eq. 8), and unpacked they skip the row mask too, since a
        masked row's lse is +inf and its p is 0 anyway."""
        kbase = (lambda kt: kt * step) if lo is None else (lambda kt: lo + kt * step)

        def put(kt, sc):
            jj = kt * S + col
            jj_ok = jj < Ts
            store(sc_ref.at[b, tq_st[:, None], g, jnp.where(jj_ok, jj, Ts)[None, :]], sc,
                  qmask[:, None] & jj_ok[None, :])

        def put_t(kt, sc_t):   # put for a [S, nq] (block, query) tile
            jj = kt * S + col
            jj_ok = jj < Ts
            store(sc_ref.at[b, tq_st[None, :], g, jnp.where(jj_ok, jj, Ts)[:, None]], sc_t,
                  jj_ok[:, None] & qmask[None, :])

        def score_step_t(kt, carry, causal=True, write=True):
            """The rows layout on the fast path, transposed: s^T = K Q^T is [keys, (head,
            query)], so a query's head sum (Eq. 10) adds registers of one thread (the MMA
            layout's columns), and a selection block's r compressed blocks (Eq. 9) are rows."""
            ii = kt * step + jnp.arange(bks)
            imask = (jnp.arange(bks) < step) & (ii < n_vis)
            k = load(k_ref.at[b, pl.ds(kbase(kt), bks), g, :], imask[:, None])
            x = dot(k, q, trans_b=True, precision=prec) * c - lse[None, :]   # Eq. 8, [bks, rows]
            if causal:
                x = jnp.where(imask[:, None] & rmask[None, :]
                              & (ii[:, None] * d + (l - 1) <= tv[None, :]), x, NEG_INF)
            elif packed:
                x = jnp.where(imask[:, None] & rmask[None, :], x, NEG_INF)
            elif bks != step:
                x = jnp.where(imask[:, None], x, NEG_INF)
            pg = jnp.sum(jnp.exp2(x).reshape(bks, hs, bq), axis=1).reshape(S, r, bq)
            main = jnp.sum(pg * w_main[None, :, None], axis=1)   # [S, bq]
            nxt = jnp.sum(pg * w_next[None, :, None], axis=1)    # owed to block row + 1
            # rotated one row: row c + 1 gets nxt[c], and row 0 gets the last row's spill, owed
            # to the next step's first block. The carry is the previous step's rotation, whose
            # row 0 sits where it is added: no reduction across rows (warps) for it
            rot = jnp.sum(shift[:, :, None] * nxt[:, None, :], axis=0)
            if write:
                put_t(kt, main + jnp.where(col[:, None] == 0, carry, rot))
            return rot

        def score_step(kt, carry, causal=True, write=True):
            ii = kt * step + jnp.arange(bks)
            imask = (jnp.arange(bks) < step) & (ii < n_vis)
            k = load(k_ref.at[b, pl.ds(kbase(kt), bks), g, :], imask[:, None])
            if causal:
                vis = rmask[:, None] & imask[None, :] & (ii[None, :] * d + (l - 1) <= tv[:, None])
            elif packed:
                vis = rmask[:, None] & imask[None, :] if bks != step else rmask[:, None]
            else:
                vis = imask[None, :] if bks != step else True
            if loop:   # p_cmp (Eq. 8) of each head, summed over the group in place (Eq. 10)
                p = sum(probs(dot(qh, k, trans_b=True, precision=prec), vis, lh, c)
                        for qh, lh in heads)
            else:
                p = probs(dot(q, k, trans_b=True, precision=prec), vis, lse, c)  # Eq. 8
            first = jnp.where(col[None, :] == 0, carry[:, None], 0.0)
            if fast:   # the loop layout (the rows layout takes score_step_t)
                pg = p.reshape(bq, S, r)
                main = jnp.sum(pg * w_main[None, None, :], axis=2)
                nxt = jnp.sum(pg * w_next[None, None, :], axis=2)  # owed to col + 1
                moved = jnp.sum(nxt[:, :, None] * shift[None, :, :], axis=1)
                if write:
                    put(kt, main + moved + first)
                return jnp.sum(jnp.where(col[None, :] == S - 1, nxt, 0.0), axis=1)
            if write:
                pw = dot(p, W, precision=sprec) + first   # Eq. 9
                put(kt, pw if loop else dot(A, pw, precision=sprec))
            return jnp.sum(p * w_spill[None, :], axis=1)

        n_steps = idiv(n_vis + (step - 1), step)
        n_full = jnp.minimum(n_full, n_steps)
        step_fn = score_step_t if transposed else score_step
        carry = jnp.zeros((S, nq) if transposed else (nq if fast or loop else rows,),
                          jnp.float32)
        if splits > 1:   # the spill of the step before the range into its first block
            # (at most one step, with the mask the unsplit kernel gives it: the same rounding)
            p_lo, p_hi = jnp.maximum(t_lo - 1, 0), jnp.minimum(t_lo, n_steps)
            p_mid = jnp.clip(n_full, p_lo, p_hi)
            carry = lax.fori_loop(p_lo, p_mid, functools.partial(
                step_fn, causal=False, write=False), carry)
            carry = lax.fori_loop(p_mid, p_hi, functools.partial(step_fn, write=False), carry)
        e_full = jnp.clip(n_full, t_lo, t_hi) if splits > 1 else n_full
        carry = lax.fori_loop(t_lo, e_full, functools.partial(step_fn, causal=False), carry)
        carry = lax.fori_loop(e_full, jnp.minimum(t_hi, n_steps) if splits > 1 else n_steps,
                              step_fn, carry)

        # the block the last visible step spills into
        @pl.when((n_steps < n_tiles) & (t_lo <= n_steps) & (n_steps < t_hi) if splits > 1
                 else n_steps < n_tiles)
        def _():
            if transposed:
                put_t(n_steps, jnp.where(col[:, None] == 0, carry, 0.0))
                return
            first = jnp.where(col[None, :] == 0, carry[:, None], 0.0)
            put(n_steps, first if fast or loop else dot(A, first, precision=sprec))

        def zeros(kt, _):  # blocks no query of the tile can see yet
            put(kt, jnp.zeros((nq, S), jnp.float32))

        lax.fori_loop(jnp.maximum(n_steps + 1, t_lo), t_hi, zeros, None)

    if not packed:
        n_full = idiv(_num_visible(jnp.minimum(qt * bq, T - 1), d, l, Tc), step)
        scores(ok, q_ok, t, None, n_vis, n_full)
        return
    rel = load(rel_ref.at[b, t], ok)
    st_r = load(st_ref.at[b, t], ok, -1)
    tq_ld = jnp.where(q_ok, tq, 0)
    st_q = load(st_ref.at[b, tq_ld], q_ok, T)
    rel_q = load(rel_ref.at[b, tq_ld], q_ok, -1)
    lo_q = load(lo_ref.at[b, tq_ld], q_ok, Tc)
    n_docs = 1 + jnp.sum((q_ok & (rel_q == 0) & (u > 0)).astype(jnp.int32))

    def doc(_, cur):  # cur: first token of this pass's document
        qmask = q_ok & (st_q == cur)
        lo = jnp.min(jnp.where(qmask, lo_q, Tc))
        n_vis = _num_visible(jnp.max(jnp.where(qmask, rel_q, -1)), d, l, Tc)
        # (the sentinel exceeds every position: a continuation chunk's rel exceeds T)
        n_full = idiv(_num_visible(jnp.min(jnp.where(qmask, rel_q, BIG_POS)), d, l, Tc), step)
        scores(ok & (st_r == cur), qmask, rel, lo, n_vis, n_full)
        return jnp.min(jnp.where(q_ok & (st_q > cur), st_q, T))

    lax.fori_loop(0, n_docs, doc, st_ref[b, qt * bq])


def cmp_block_scores(q, kc, lse, cfg: NSAConfig, bs: BlockSizes, scale: float, interpret: bool,
                     *, choices: KernelChoices | None = None, seg=None, Ts: int | None = None):
    """Group-shared selection-block importance [B,T,G,Ts] (Eq. 9-10) from the compressed
    attention's lse; equals ``reference.block_scores(reference.cmp_probs(q, kc))``. The tile
    layout follows ``choices.score_heads`` (``score_layout``); the general path's float32 dots
    use ``choices.score_dot``. ``seg``: packed rows (``compressed.cmp_forward``); the scores
    are then over each query's document-relative blocks. ``Ts``: score columns (default
    ``cfg.num_sel_blocks(T)``; a continuation chunk, whose ``seg.rel`` places its queries past
    T, scores every block of the cache: ``pallas.chunk``)."""
    B, T, Hq, Dk = q.shape
    Tc, G = kc.shape[1], kc.shape[2]
    Ts = cfg.num_sel_blocks(T) if Ts is None else Ts
    h = Hq // G
    if Tc == 0:
        return jnp.zeros((B, T, G, Ts), jnp.float32)
    S = bs.score_sel
    r = cfg.sel_block // cfg.stride_d
    step = S * r
    fast = r & (r - 1) == 0
    loop = score_layout(h, Dk, jnp.dtype(q.dtype).itemsize, choices, bs.score_q) == "loop"
    if loop:
        hs, rows = 1, bs.score_q
    elif fast:
        hs = next_pow2(h)
        rows = max(min(_tile_rows(h, bs), MIN_DOT * hs), MIN_DOT)  # <= 16 queries per tile
    else:
        hs, rows = h, _tile_rows(h, bs)
    n_q = cdiv(T, rows // hs)
    splits = bs.score_splits or score_splits(n_q * G * B, cdiv(Ts, S))
    kern = functools.partial(
        _score_kernel, h=h, hs=hs, rows=rows, S=S, r=r, step=step, splits=splits,
        bks=max(MIN_DOT, next_pow2(step)), d=cfg.stride_d, l=cfg.block_l, l_sel=cfg.sel_block,
        scale=scale, prec=dot_precision(q.dtype, interpret, choices),
        sprec=score_precision(choices_or_default(choices).score_dot, interpret), fast=fast,
        loop=loop, packed=seg is not None)
    return pl.pallas_call(
        kern, grid=(n_q, G, B * splits),
        out_shape=jax.ShapeDtypeStruct((B, T, G, Ts), jnp.float32),
        compiler_params=compiler_params(bs.score_warps, bs.num_stages),
        interpret=interpret, name="nsa_cmp_scores",
    )(q, kc, lse, *(() if seg is None else (seg.cmp_lo, seg.rel, seg.start)))
