"""Top-n block selection with forced blocks (NSA §3.3.2, Eq. 11): a Pallas kernel.

Same result as ``semantics.topn_from_scores`` at t = the row's position: block j is a
candidate for query t iff j*l' <= t; the first ``n_init`` and the ``n_local`` most recent
candidates are forced (they count within n); the remaining slots take the highest scores, ties
to the lower index; ids come out ascending with -1 in unused slots.

One program takes a few (b, t, g) rows of the score tensor. The forced blocks are marked
chosen at once (a row with more than n_init + n_local candidates has exactly that many forced,
one with fewer has all its candidates forced), so only m = k - n_init - n_local picks remain,
over the non-forced candidates (non-candidates at -inf). Rows of at least ``GROUPS`` * 4
columns find the m-th largest score (with multiplicity) in two phases (``_threshold``): each of
``GROUPS`` strided column groups (column j in group j % GROUPS, so neighbouring blocks, which
score alike in a trained model, fall in different groups) gives up its ``PER_GROUP`` largest
values with their counts, and m rounds over those few candidates find the threshold; it is
exact when no group's next value exceeds it, which the kernel checks, falling back to the
rounds below for the whole program otherwise. The picks are then the scores above the
threshold and, among those equal to it, the lowest indices. Narrower rows (and the fallback)
run m rounds of "take the row maximum (lowest index among equals), mask it out" over the whole
row. The chosen set is then written in ascending order through a prefix count (rank of each
chosen block). Unpacked rows are walked in width buckets: the queries
t < w*l' have at most w candidates, so their programs load and reduce only the first w
columns (w = powers of two up to Ts padded; at 64k this is 2/3 of the full-width work). Rows
longer than ``MAX_ROW`` (Ts padded; T > ~1M tokens at l' = 64) do not fit one program and go
through ``semantics.topn_from_scores`` (``lax.top_k``, same result).

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
from nsa_jax.pallas.common import BlockSizes, compiler_params, idiv, load, next_pow2, store

MAX_ROW = 16384  # longest score row (Ts padded) one program holds; longer rows use lax.top_k


MIN_WIDTH = 16  # narrowest bucket (columns) of the unpacked row buckets
GROUPS = 32     # strided column groups of the two-phase threshold (``_threshold``)
PER_GROUP = 4   # values (with their counts) each group gives up to the second phase
NEG = float("-inf")


def _threshold(s, m: int):
    """s [rows, width] (-inf = not eligible) -> (thr [rows], exact [rows]): thr is the m-th
    largest eligible score counting equal scores (-inf where fewer than m are eligible), from
    the ``PER_GROUP`` largest distinct values of each of ``GROUPS`` strided column groups and
    their counts; ``exact`` is False where some group holds a value above thr that it did not
    give up (thr could then be too low)."""
    rows, width = s.shape
    x = s.reshape(rows, width // GROUPS, GROUPS)      # column a*GROUPS + c is in group c
    vals, cnts = [], []
    for _ in range(PER_GROUP):
        mx = jnp.max(x, axis=1)                                     # [rows, GROUPS]
        eq = x == mx[:, None, :]
        cnts.append(jnp.sum((eq & (mx > NEG)[:, None, :]).astype(jnp.int32), axis=1))
        vals.append(mx)
        x = jnp.where(eq, NEG, x)
    rest = jnp.max(jnp.max(x, axis=1), axis=1)                      # each row's highest left

    def take(_, carry):   # the largest candidate value, all its copies at once
        vals, thr, total = carry
        top = functools.reduce(jnp.maximum, [jnp.max(v, axis=1) for v in vals])   # [rows]
        c = sum(jnp.sum(jnp.where(v == top[:, None], n, 0), axis=1) for v, n in zip(vals, cnts))
        more = total < m
        thr = jnp.where(more, top, thr)
        total = total + jnp.where(more, c, 0)
        return [jnp.where(v == top[:, None], NEG, v) for v in vals], thr, total

    _, thr, total = lax.fori_loop(0, m, take, (vals, jnp.full((rows,), NEG, jnp.float32),
                                               jnp.zeros((rows,), jnp.int32)))
    thr = jnp.where(total >= m, thr, NEG)
    return thr, rest <= thr


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
             r_ok[:, None] & (j < Ts)[None, :], NEG)
    t = idiv(r_safe, G) - b * T
    if packed:
        t = load(rel_ref.at[b, t], r_ok)
    cur = idiv(t, l_sel)[:, None]
    cand = j[None, :] <= cur
    forced = cand & ((j[None, :] < n_init) | (j[None, :] > cur - n_local))
    if k >= n_init + n_local:   # every forced block is kept: chosen now, k - n_forced rounds left
        rounds, sel = k - n_init - n_local, forced
        s = jnp.where(cand & ~forced, s, NEG)
    else:                       # k < n_forced: forced blocks compete among themselves (+inf)
        rounds, sel = k, jnp.zeros((rows, width), jnp.bool_)
        s = jnp.where(forced, float("inf"), jnp.where(cand, s, NEG))

    def pick(_, carry):
        s, sel = carry
        m = jnp.max(s, axis=1)
        jm = jnp.min(jnp.where(s == m[:, None], j[None, :], width), axis=1)
        hit = (j[None, :] == jm[:, None]) & (m > NEG)[:, None]
        return jnp.where(hit, NEG, s), sel | hit

    if rounds and k >= n_init + n_local and width >= GROUPS * PER_GROUP:
        thr, exact = _threshold(s, rounds)
        elig = s > NEG
        above = elig & (s > thr[:, None])
        tie = elig & (s == thr[:, None])
        room = rounds - jnp.sum(above.astype(jnp.int32), axis=1)     # ties taken, lowest first
        tie_rank = jnp.cumsum(tie.astype(jnp.int32), axis=1) - 1
        fast = sel | above | (tie & (tie_rank < room[:, None]))
        ok = jnp.min((exact | ~r_ok).astype(jnp.int32))     # 1 iff exact (no reduce_and in Triton)
        _, slow = lax.fori_loop(0, (1 - ok) * rounds, pick, (s, sel))   # a strong int32 bound
        sel = jnp.where(ok > 0, fast, slow)
    elif rounds:
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


def _buckets(T: int, tsp: int, l_sel: int):
    """[(t0, t1, width)]: query ranges whose candidates fit ``width`` columns (packed rows too:
    a document-relative position is at most the row position)."""
    out, t0, w = [], 0, min(MIN_WIDTH, tsp)
    while t0 < T:
        t1 = T if w >= tsp else min(T, w * l_sel)   # t < w*l' <=> floor(t/l') < w
        out.append((t0, t1, w))
        t0, w = t1, w * 2
    return out


def topn_pallas(scores, cfg: NSAConfig, interpret: bool, rel=None, bs: BlockSizes | None = None):
    """scores [B,T,G,Ts] -> int32 [B,T,G,n_sel] (== ``semantics.topn_from_scores``); ``rel``
    int32 [B,T]: packed rows' document-relative positions (None: t). ``bs``: the program's
    tile (``topn_elems`` scores, ``topn_warps``; None = defaults)."""
    bs = bs or BlockSizes()
    B, T, G, Ts = scores.shape
    tsp = next_pow2(Ts)
    if tsp > MAX_ROW:
        pos = jnp.arange(T)[None, :, None] if rel is None else rel[:, :, None]
        return semantics.topn_from_scores(scores, pos, cfg)
    N = B * T * G
    sc = scores.reshape(N, Ts).astype(jnp.float32)
    ids = jnp.zeros((N, cfg.n_sel), jnp.int32)   # every row is written by its bucket
    for t0, t1, width in _buckets(T, tsp, cfg.sel_block):
        rows = max(1, min(64, bs.topn_elems // width))
        n_bucket = (t1 - t0) * G
        kern = functools.partial(
            _topn_kernel, rows=rows, width=width, t0=t0, n_bucket=n_bucket, T=T, G=G,
            k=min(cfg.n_sel, Ts), n_sel=cfg.n_sel, n_init=cfg.n_init, n_local=cfg.n_local,
            l_sel=cfg.sel_block, packed=rel is not None)
        extra = () if rel is None else (rel,)
        ids = pl.pallas_call(
            kern, grid=(pl.cdiv(n_bucket, rows), B),
            out_shape=jax.ShapeDtypeStruct((N, cfg.n_sel), jnp.int32),
            input_output_aliases={1 + len(extra): 0},
            compiler_params=compiler_params(bs.topn_warps, 1), interpret=interpret,
            name="nsa_topn",
        )(sc, *extra, ids)
    return ids.reshape(B, T, G, cfg.n_sel)
