"""Top-n block selection with forced blocks (NSA §3.3.2, Eq. 11): Pallas kernels.

Same result as ``semantics.topn_from_scores`` at t = the row's position: block j is a
candidate for query t iff j*l' <= t; the first ``n_init`` and the ``n_local`` most recent
candidates are forced (they count within n); the remaining slots take the highest scores, ties
to the lower index; ids come out ascending with -1 in unused slots.

One program takes a few (b, t, g) rows of the score tensor. The forced blocks are marked
chosen at once (a row with more than n_init + n_local candidates has exactly that many forced,
one with fewer has all its candidates forced), so only k - n_init - n_local rounds of "take the
row maximum (lowest index among equals), mask it out" remain, over the non-forced candidates
(non-candidates at -inf). The chosen set is then written in ascending order through a prefix
count (rank of each chosen block). Unpacked rows are walked in width buckets: the queries
t < w*l' have at most w candidates, so their programs load and reduce only the first w
columns (w = powers of two up to Ts padded; at 64k this is 2/3 of the full-width work). Rows
longer than ``MAX_ROW`` (Ts padded; T > ~1M tokens at l' = 64) do not fit one program and go
through ``semantics.topn_from_scores`` (``lax.top_k``, same result).

Unpacked buckets of ``TOUR_MIN_WIDTH``..``TOUR_MAX_WIDTH`` columns take a second kernel,
``_tour_kernel``: a tournament over 32-column segments whose rounds reload one segment each
instead of reducing the whole row (its docstring). On an H100 at the 125M shape, 64k, the
1024-column bucket 0.550 -> 0.151 ms and the NSA 64k train step 306.8 -> 302.0 ms
(bench/NOTES.md, twenty-fifth session). A chunked prefill's continuation chunks take it too
(``topn_upto``), with the positions from ``rel`` and a first pass bounded on the device.

Packed documents: ``rel`` [B,T] (the document-relative position r(t)) replaces t, so candidates
and forced blocks are the query's own document's blocks and the ids document-relative. Their rows
take the same width buckets: r(t) <= t, so a query t < w*l' has at most w candidates in its
document too.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import (NEG_INF, POS_INF, BlockSizes, compiler_params, idiv, load,
                                   next_pow2, store)

MAX_ROW = 16384  # longest score row (Ts padded) one program holds; longer rows use lax.top_k


MIN_WIDTH = 16  # narrowest bucket (columns) of the unpacked row buckets


def _topn_kernel(sc_ref, *refs, rows, width, t0, n_bucket, T, G, k, n_sel, n_init, n_local,
                 l_sel, packed=False):
    """Rows (b, t, g) with t0*G <= t*G + g < t0*G + n_bucket of batch row b = program_id(1);
    scores of columns [0, width)."""
    if packed:
        rel_ref, _ids_in, ids_ref = refs
    else:
        _ids_in, ids_ref = refs
    N, Ts = sc_ref.shape
    b = pl.program_id(1)
    i = pl.program_id(0) * rows + jnp.arange(rows)
    r_ok = i < n_bucket
    r_safe = b * (T * G) + t0 * G + jnp.where(r_ok, i, 0)
    j = jnp.arange(width)
    s = load(sc_ref.at[r_safe[:, None], jnp.minimum(j, Ts - 1)[None, :]],
             r_ok[:, None] & (j < Ts)[None, :], float("-inf"))
    t = idiv(r_safe, G) - b * T
    if packed:
        t = load(rel_ref.at[b, t], r_ok)
    cur = idiv(t, l_sel)[:, None]
    cand = j[None, :] <= cur
    forced = cand & ((j[None, :] < n_init) | (j[None, :] > cur - n_local))
    if k >= n_init + n_local:   # every forced block is kept: chosen now, k - n_forced rounds left
        rounds, sel = k - n_init - n_local, forced
        s = jnp.where(cand & ~forced, s, float("-inf"))
    else:                       # k < n_forced: forced blocks compete among themselves (+inf)
        rounds, sel = k, jnp.zeros((rows, width), jnp.bool_)
        s = jnp.where(forced, float("inf"), jnp.where(cand, s, float("-inf")))

    def pick(_, carry):
        s, sel = carry
        m = jnp.max(s, axis=1)
        jm = jnp.min(jnp.where(s == m[:, None], j[None, :], width), axis=1)
        hit = (j[None, :] == jm[:, None]) & (m > float("-inf"))[:, None]
        return jnp.where(hit, float("-inf"), s), sel | hit

    if rounds:
        _, sel = lax.fori_loop(0, rounds, pick, (s, sel))
    seli = sel.astype(jnp.int32)
    rank = jnp.cumsum(seli, axis=1) - 1
    count = jnp.sum(seli, axis=1)
    keep = sel & r_ok[:, None]
    store(ids_ref.at[jnp.where(keep, r_safe[:, None], N), jnp.where(keep, rank, 0)],
          jnp.broadcast_to(j[None, :], (rows, width)), keep)
    slot = jnp.arange(next_pow2(n_sel))
    pad = r_ok[:, None] & (slot[None, :] >= count[:, None]) & (slot[None, :] < n_sel)
    store(ids_ref.at[jnp.where(pad, r_safe[:, None], N), jnp.where(pad, slot[None, :], 0)],
          jnp.full((rows, slot.shape[0]), -1, jnp.int32), pad)


SEG = 32              # columns per segment of the tournament top-n
TOUR_MIN_WIDTH = 512  # narrowest unpacked bucket that takes the tournament kernel: on an H100 at
#                       125M 64k the 256-column bucket (4 rows per program) took 0.107 ms with it,
#                       0.050 with the rounds kernel; 512: 0.093 vs 0.167, 1024: 0.151 vs 0.550
#                       (bench/NOTES.md, twenty-fifth session)
TOUR_MAX_WIDTH = 2048  # widest bucket that takes it: its first pass is unrolled over the row's
#                       segments (64 at 2048 columns, T = 128k at l' = 64); wider rows keep the
#                       rounds kernel (neither was timed there)
BIG = 2 ** 30         # id of an empty pick (sorts after every block id)


def _tour_kernel(sc_ref, *refs, rows, width, t0, n_bucket, T, G, n_sel, n_init, n_local, l_sel,
                 upto=False):
    """Top-n of unpacked rows whose forced blocks are all distinct candidates (every row of the
    bucket has cur = t // l' >= n_init + n_local), as a tournament over segments of ``SEG``
    columns. The picks come in the order of ``lax.top_k`` (higher score first, ties to the lower
    index), so after r rounds the picked set is the r largest (score, -index) pairs and the next
    pick is the largest pair below the last one: no mask of picked columns is kept. Each segment
    keeps the maximum of its pairs below the last pick; a round takes the largest segment
    maximum (the lowest segment among equals: segments are ascending column ranges), reloads that
    one segment's ``SEG`` scores (L1 / L2: the program read them in the first pass), picks its
    largest pair below the last pick and recomputes its maximum without it. So a round touches
    n_segments + ``SEG`` values instead of every column of the row (the rounds kernel's max,
    argmin and mask over the whole row). The chosen ids are written ascending through a rank
    count over the n_sel picks (a [n_sel] x [n_sel] comparison, not a prefix scan over the
    row).

    ``upto`` (a continuation chunk's rows, :func:`topn_upto`): the positions come from ``rel``
    [B,T] (``refs`` start with it) and may be any t >= 0; the first pass is a loop over the
    segments that hold a non-forced candidate of the program's rows (its bound read on the
    device, so one ``width`` serves every chunk), and a row with fewer than n_init + n_local
    candidates takes them all (the forced picks that would repeat one are empty)."""
    if upto:
        rel_ref, _ids_in, ids_ref = refs
    else:
        _ids_in, ids_ref = refs
    N, Ts = sc_ref.shape
    b = pl.program_id(1)
    i = pl.program_id(0) * rows + jnp.arange(rows)
    r_ok = i < n_bucket
    r_safe = b * (T * G) + t0 * G + jnp.where(r_ok, i, 0)
    t = idiv(r_safe, G) - b * T
    if upto:
        t = load(rel_ref.at[b, t], r_ok)
    cur = idiv(t, l_sel)                                             # [rows]
    nseg = width // SEG
    kk = jnp.arange(SEG)
    sidx = jnp.arange(nseg)

    def scores(seg):
        """[rows, SEG] scores of segment ``seg`` ([rows]); forced, non-candidate and padding
        columns at -inf."""
        cols = seg[:, None] * SEG + kk[None, :]
        ok = r_ok[:, None] & (cols < Ts)
        v = load(sc_ref.at[r_safe[:, None], jnp.minimum(cols, Ts - 1)], ok, NEG_INF)
        keep = (cols >= n_init) & (cols <= (cur - n_local)[:, None])
        return cols, jnp.where(keep, v, NEG_INF)

    def first(sg, seg_max):
        _, v = scores(jnp.full((rows,), sg, jnp.int32))
        return jnp.where(sidx[None, :] == sg, jnp.max(v, axis=1)[:, None], seg_max)

    seg_max = jnp.full((rows, nseg), NEG_INF, jnp.float32)
    n_f = n_init + n_local
    if upto:    # segments up to the last non-forced candidate column of the program's rows
        hi = jnp.max(jnp.where(r_ok, cur - n_local, -1))
        seg_max = lax.fori_loop(0, jnp.clip(idiv(hi + SEG, SEG), 0, nseg), first, seg_max)
        picks = [jnp.where(cur >= f, f, BIG) for f in range(n_init)]
        picks += [jnp.where(cur - (n_local - 1) + f >= n_init, cur - (n_local - 1) + f, BIG)
                  for f in range(n_local)]
    else:
        for sg in range(nseg):
            seg_max = first(sg, seg_max)
        picks = [jnp.full((rows,), f, jnp.int32) for f in range(n_init)]
        picks += [cur - (n_local - 1) + f for f in range(n_local)]
    m_prev = jnp.full((rows,), POS_INF, jnp.float32)
    j_prev = jnp.full((rows,), -1, jnp.int32)
    for _ in range(n_sel - n_f):
        m = jnp.max(seg_max, axis=1)
        valid = m > NEG_INF
        sw = jnp.min(jnp.where(seg_max == m[:, None], sidx[None, :], nseg), axis=1)
        sw = jnp.where(valid, sw, 0)
        cols, v = scores(sw)
        below = (v < m_prev[:, None]) | ((v == m_prev[:, None]) & (cols > j_prev[:, None]))
        v = jnp.where(below, v, NEG_INF)
        jm = jnp.min(jnp.where(v == m[:, None], cols, BIG), axis=1)
        rest = jnp.max(jnp.where(cols == jm[:, None], NEG_INF, v), axis=1)
        seg_max = jnp.where((sidx[None, :] == sw[:, None]) & valid[:, None], rest[:, None],
                            seg_max)
        picks.append(jnp.where(valid, jm, BIG))
        m_prev, j_prev = m, jm
    for a, pa in enumerate(picks):   # ascending: rank = ids below, ties (empty picks) by slot
        rank = jnp.zeros((rows,), jnp.int32)
        for c, pc in enumerate(picks):
            if c != a:
                rank += ((pc < pa) | ((pc == pa) & (c < a))).astype(jnp.int32)
        ok = r_ok & (rank < n_sel)
        store(ids_ref.at[jnp.where(ok, r_safe, N), jnp.where(ok, rank, 0)],
              jnp.where(pa == BIG, -1, pa), ok)


def _tournament(width: int, t0: int, Ts: int, cfg: NSAConfig, packed: bool) -> bool:
    """The bucket [t0, ...) of ``width`` columns takes ``_tour_kernel``: unpacked, wide, and every
    row's forced blocks distinct candidates with n_sel picks to make."""
    n_f = cfg.n_init + cfg.n_local
    return (not packed and TOUR_MIN_WIDTH <= width <= TOUR_MAX_WIDTH and width % SEG == 0
            and n_f <= cfg.n_sel <= Ts and t0 // cfg.sel_block >= n_f)


def _buckets(T: int, tsp: int, l_sel: int):
    """[(t0, t1, width)]: query ranges whose candidates fit ``width`` columns (packed rows too:
    a document-relative position is at most the row position)."""
    out, t0, w = [], 0, min(MIN_WIDTH, tsp)
    while t0 < T:
        t1 = T if w >= tsp else min(T, w * l_sel)   # t < w*l' <=> floor(t/l') < w
        out.append((t0, t1, w))
        t0, w = t1, w * 2
    return out


def topn_pallas(scores, cfg: NSAConfig, interpret: bool, rel=None, bs: BlockSizes | None = None,
                *, full_width: bool = False):
    """scores [B,T,G,Ts] -> int32 [B,T,G,n_sel] (== ``semantics.topn_from_scores``); ``rel``
    int32 [B,T]: packed rows' document-relative positions (None: t). ``bs``: the program's
    tile (``topn_elems`` scores, ``topn_warps``; None = defaults). ``full_width``: one bucket
    of all Ts columns, for positions ``rel`` past the row index (a continuation chunk,
    ``pallas.chunk``), where the buckets by row index would be too narrow."""
    bs = bs or BlockSizes()
    B, T, G, Ts = scores.shape
    tsp = next_pow2(Ts)
    if tsp > MAX_ROW:
        pos = jnp.arange(T)[None, :, None] if rel is None else rel[:, :, None]
        return semantics.topn_from_scores(scores, pos, cfg)
    N = B * T * G
    sc = scores.reshape(N, Ts).astype(jnp.float32)
    ids = jnp.zeros((N, cfg.n_sel), jnp.int32)   # every row is written by its bucket
    for t0, t1, width in [(0, T, tsp)] if full_width else _buckets(T, tsp, cfg.sel_block):
        rows = max(1, min(64, bs.topn_elems // width))
        n_bucket = (t1 - t0) * G
        if _tournament(width, t0, Ts, cfg, rel is not None):
            rows = bs.topn_tour_rows or rows
            kern = functools.partial(
                _tour_kernel, rows=rows, width=width, t0=t0, n_bucket=n_bucket, T=T, G=G,
                n_sel=cfg.n_sel, n_init=cfg.n_init, n_local=cfg.n_local, l_sel=cfg.sel_block)
        else:
            kern = functools.partial(
                _topn_kernel, rows=rows, width=width, t0=t0, n_bucket=n_bucket, T=T, G=G,
                k=min(cfg.n_sel, Ts), n_sel=cfg.n_sel, n_init=cfg.n_init, n_local=cfg.n_local,
                l_sel=cfg.sel_block, packed=rel is not None)
        ids = _launch(kern, rows, n_bucket, B, sc, () if rel is None else (rel,), ids, bs,
                      interpret, "nsa_topn")
    return ids.reshape(B, T, G, cfg.n_sel)


def _launch(kern, rows: int, n_rows: int, B: int, sc, extra, ids, bs: BlockSizes,
            interpret: bool, name: str):
    """One top-n kernel over ``n_rows`` score rows of each batch row, ``rows`` a program, into
    ``ids`` [N, n_sel] (aliased: the rows it does not write keep their values)."""
    return pl.pallas_call(
        kern, grid=(pl.cdiv(n_rows, rows), B),
        out_shape=jax.ShapeDtypeStruct(ids.shape, jnp.int32),
        input_output_aliases={1 + len(extra): 0},
        compiler_params=compiler_params(bs.topn_warps, 1), interpret=interpret, name=name,
    )(sc, *extra, ids)


def topn_upto(scores, cfg: NSAConfig, interpret: bool, rel, last, min_last: int,
              bs: BlockSizes | None = None):
    """``topn_pallas(scores, ..., rel, full_width=True)`` for rows whose positions ``rel`` are
    at most ``last`` (int32 scalar, traced; >= ``min_last``, static): a continuation chunk's
    scores (``pallas.chunk``) have a column per block of the whole cache, of which a chunk
    ending at ``last`` sees the first floor(last / l') + 1.

    Where the tournament applies (n_init + n_local <= n_sel <= Ts): one launch of
    ``_tour_kernel(upto=True)`` over the padded width, whose first pass walks only the segments
    its rows can see (a loop bound read on the device), so its work follows the chunk's
    position with no host round trip. Else the bucket is the narrowest power of two of columns
    that holds every candidate (floor(last / l') + 1, at least ``min_last``'s), picked on the
    device by ``lax.switch`` among the static widths from ``min_last``'s up to Ts padded: XLA
    reads the switch's index on the host, a round trip per layer and chunk. On an H200 at 64k
    the narrow buckets and the block-major selection forward took a chunked prefill 192.2 ->
    157.0 ms at C = 16,384 and 261.2 -> 250.6 at C = 4,096 (same call; bench/NOTES.md,
    forty-ninth session); the tournament in their place 168.4 -> 147.2 ms at C = 16,384 and
    within the spread at 4,096, with 5% less device time (fiftieth session)."""
    B, T, G, Ts = scores.shape
    tsp = next_pow2(Ts)
    n_f = cfg.n_init + cfg.n_local
    if n_f <= cfg.n_sel <= Ts and tsp <= MAX_ROW:
        bs = bs or BlockSizes()
        width = max(tsp, SEG)
        N = B * T * G
        rows = bs.topn_tour_rows or max(1, min(64, bs.topn_elems // width))
        kern = functools.partial(
            _tour_kernel, rows=rows, width=width, t0=0, n_bucket=T * G, T=T, G=G,
            n_sel=cfg.n_sel, n_init=cfg.n_init, n_local=cfg.n_local, l_sel=cfg.sel_block,
            upto=True)
        ids = _launch(kern, rows, T * G, B, scores.reshape(N, Ts).astype(jnp.float32),
                      (rel.astype(jnp.int32),), jnp.zeros((N, cfg.n_sel), jnp.int32), bs,
                      interpret, "nsa_topn_upto")
        return ids.reshape(B, T, G, cfg.n_sel)
    need0 = min_last // cfg.sel_block + 1
    widths = []
    w = max(next_pow2(need0), next_pow2(cfg.n_sel), MIN_WIDTH)
    while w < tsp:
        widths.append(w)
        w *= 2
    widths.append(tsp)
    if len(widths) == 1 or tsp > MAX_ROW:
        return topn_pallas(scores, cfg, interpret, rel, bs, full_width=True)

    def branch(w):
        return lambda sc: topn_pallas(sc[..., :min(w, Ts)], cfg, interpret, rel, bs,
                                      full_width=True)

    need = jnp.asarray(last, jnp.int32) // cfg.sel_block + 1
    k = jnp.sum((jnp.asarray(widths[:-1], jnp.int32) < need).astype(jnp.int32))
    return lax.switch(k, [branch(w) for w in widths], scores)
