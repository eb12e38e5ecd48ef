"""The block-sparse index of the tiled selection kernels (``selection_tiled.py``), built in XLA
outside the kernels on each call.

``tile_index`` scatters a selection ``idx`` [B,T,G,n] into a [B,G,n_tiles,Ts] table of "some row
of query tile i selected block j" (restricted to blocks that start at or before the tile's last
query) and sorts it per tile (ascending block ids: the forward and dQ loops) and per block
(ascending tile ids: the dK/dV loop), with counts that bound the kernels' dynamic trip counts.
Packed rows list *aligned* blocks (``_aligned_blocks``; ``selection_tiled`` says why).

The causal split's counts (``full_counts``, ``diagonal_counts``): a (tile, block) pair is full when
the block ends at or before the tile's first query. Because both lists ascend, the full pairs are
a prefix of each tile's block list and a suffix of each block's tile list, so a count per list
tells a kernel where its unmasked loop ends or begins.

Row membership (unpacked rows, ``member_table``): which rows of a (tile, block) pair selected the
block, as bits of ceil(bq / 32) int32 words per pair (two at the default bq = 64), gathered in each
list's order (``words_by_tile``, ``words_by_block``); a kernel tests a row with a shift instead of
comparing the row's n ids with the block (bench/NOTES.md, twenty-fourth session). ``tile_lists``
builds the lists and the table from one scatter; ``rows_operand`` is the kernels' per-row operand
(the words, or packed rows' padded ids). The table and each of its two gathered copies hold
~B*G*T^2 / (32*l') int32 values at bq = 64, twice the union table (0.27 MB at 2k / B=16; 17 MB at
64k, B=1, G=2, for a forced ``sel_impl: tiled``).
"""
from __future__ import annotations

import jax.numpy as jnp

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import cdiv, idiv, next_pow2

WORD_BITS = 32


def _aligned_blocks(jj, start, T: int, l_sel: int, Ts: int):
    """Packed rows: document-relative ids ``jj`` [B,T,G,n] (Ts = unused) -> the aligned blocks
    [B,T,G,2n] (Ts = none) that hold their visible keys. Block j of the query at t covers
    [p, p + l'), p = start(t) + j*l'; it has a key s <= t iff p <= t, in aligned block
    u = floor(p / l'), and its rest lies in u + 1 when p is unaligned and (u + 1)*l' <= t."""
    t = jnp.arange(T, dtype=jnp.int32)[None, :, None, None]
    p = start.astype(jnp.int32)[:, :, None, None] + jj * l_sel  # >= T > t for unused ids
    u = p // l_sel
    return jnp.concatenate([jnp.where(p <= t, u, Ts),
                            jnp.where((u * l_sel != p) & ((u + 1) * l_sel <= t), u + 1, Ts)],
                           axis=-1)


def tile_index(idx, T: int, cfg: NSAConfig, bq: int, start=None, table=None):
    """Block-sparse layout of a selection for query tiles of ``bq`` rows.

    idx int32 [B,T,G,n] -> (blocks [B,G,nqt,Ts], bcount [B,G,nqt], tiles [B,G,Ts,nqt],
    tcount [B,G,Ts]), all int32, nqt = ceil(T / bq), Ts = ceil(T / l'). ``blocks[b, g, i, :c]``
    (c = bcount[b, g, i]) are the ascending distinct blocks selected by some row of query tile i
    (ids outside [0, Ts) ignored, and only blocks j with j*l' <= the tile's last query, since no
    row sees a later block); ``tiles[b, g, j, :tcount[b, g, j]]`` are the ascending tiles whose
    list holds block j. Entries past a count are padding (never read by the kernels).

    Packed rows (``start`` [B,T], the document starts; idx document-relative): the lists hold
    *aligned* blocks [u*l', (u+1)*l'), each row contributing the one or two aligned blocks each
    of its selected blocks overlaps at or before the row (``_aligned_blocks``).

    ``table``: unpacked rows' :func:`member_table` of the same idx and bq, when the caller has it:
    the union is read from it (a word is non-zero iff some row selected the block) instead of a
    scatter of its own. Not with ``start`` (packed rows list aligned blocks, which the table does
    not hold).
    """
    if table is not None and start is not None:
        raise ValueError("tile_index: a member_table is for unpacked rows; packed rows (start) "
                         "build their own union")
    B, _, G, n = idx.shape
    Ts = cfg.num_sel_blocks(T)
    nqt = cdiv(T, bq)
    if table is not None:
        has = jnp.any(table[:, :, :, :Ts] != 0, axis=-1)
    else:
        idx = idx.astype(jnp.int32)
        jj = jnp.where((idx >= 0) & (idx < Ts), idx, Ts)
        if start is not None:
            jj = _aligned_blocks(jj, start, T, cfg.sel_block, Ts)
        bi = jnp.arange(B, dtype=jnp.int32)[:, None, None, None]
        ti = idiv(jnp.arange(T, dtype=jnp.int32), bq)[None, :, None, None]
        gi = jnp.arange(G, dtype=jnp.int32)[None, None, :, None]
        has = jnp.zeros((B, G, nqt, Ts + 1), jnp.int32).at[bi, gi, ti, jj].set(1)[..., :Ts] > 0
    last = jnp.minimum((jnp.arange(nqt) + 1) * bq, T) - 1  # last query of each tile
    blk = jnp.arange(Ts, dtype=jnp.int32)
    has = has & (blk[None, :] * cfg.sel_block <= last[:, None])
    blocks = jnp.sort(jnp.where(has, blk, Ts), axis=-1).astype(jnp.int32)
    bcount = jnp.sum(has, axis=-1, dtype=jnp.int32)
    has_t = jnp.swapaxes(has, -1, -2)  # [B,G,Ts,nqt]
    tiles = jnp.sort(jnp.where(has_t, jnp.arange(nqt, dtype=jnp.int32), nqt), axis=-1)
    tcount = jnp.sum(has_t, axis=-1, dtype=jnp.int32)
    return blocks, bcount, tiles.astype(jnp.int32), tcount


def full_blocks(blocks, bcount, bq: int, l_sel: int):
    """[B,G,nqt] int32: how many of each tile's listed blocks end at or before its first query
    (keys j*l' .. (j+1)*l' - 1 <= qt*bq: causally visible to every row). The lists ascend, so
    these are the first ones."""
    first = jnp.arange(blocks.shape[2], dtype=jnp.int32)[:, None] * bq
    listed = jnp.arange(blocks.shape[3], dtype=jnp.int32) < bcount[..., None]
    return jnp.sum(listed & ((blocks + 1) * l_sel - 1 <= first), axis=-1, dtype=jnp.int32)


def diagonal_tiles(tiles, tcount, bq: int, l_sel: int):
    """[B,G,Ts] int32: how many of each block's listed tiles start before the block's last key
    (the tiles for which some key of block j is causally masked: the first ones, as the lists
    ascend; the rest see the whole block)."""
    last = (jnp.arange(tiles.shape[2], dtype=jnp.int32)[:, None] + 1) * l_sel - 1
    listed = jnp.arange(tiles.shape[3], dtype=jnp.int32) < tcount[..., None]
    return jnp.sum(listed & (tiles * bq < last), axis=-1, dtype=jnp.int32)


def full_counts(blocks, bcount, bq: int, cfg: NSAConfig, seg):
    """The forward / dQ kernels' count of full pairs per tile; 0 for packed rows (their masks
    also test document starts: every pair takes the masked loop)."""
    if seg is not None:
        return jnp.zeros(bcount.shape, jnp.int32)
    return full_blocks(blocks, bcount, bq, cfg.sel_block)


def diagonal_counts(tiles, tcount, bq: int, cfg: NSAConfig, seg):
    """The dK/dV kernel's count of masked (diagonal) tiles per block; all of them for packed
    rows."""
    if seg is not None:
        return tcount
    return diagonal_tiles(tiles, tcount, bq, cfg.sel_block)


def member_table(idx, T: int, cfg: NSAConfig, bq: int):
    """Which rows of each query tile selected each block, as bits (unpacked rows; the tiled
    kernels' membership test without a [bq, n] compare of each row's ids per pair).

    idx int32 [B,T,G,n] -> int32 [B,G,nqt,Ts+1,nw], nw = ceil(bq / 32): bit r % 32 of word r // 32
    of [b, g, i, j] is set iff row r of tile i (query i*bq + r) has block j among its ids. Ids
    outside [0, Ts) select nothing (they land in the extra column Ts, which no list names), and an
    id a row lists twice counts once (the words are sums of distinct bits)."""
    B, _, G, n = idx.shape
    Ts = cfg.num_sel_blocks(T)
    nqt = cdiv(T, bq)
    nw = cdiv(bq, WORD_BITS)
    idx = idx.astype(jnp.int32)
    jj = jnp.where((idx >= 0) & (idx < Ts), idx, Ts)
    earlier = jnp.tril(jnp.ones((n, n), bool), -1)   # [slot, other]: other < slot
    dup = jnp.any((jj[..., :, None] == jj[..., None, :]) & earlier, axis=-1)
    jj = jnp.where(dup, Ts, jj)
    r = jnp.arange(T, dtype=jnp.int32) % bq
    bit = jnp.left_shift(jnp.int32(1), r % WORD_BITS)[None, :, None, None]
    bi = jnp.arange(B, dtype=jnp.int32)[:, None, None, None]
    gi = jnp.arange(G, dtype=jnp.int32)[None, None, :, None]
    ti = idiv(jnp.arange(T, dtype=jnp.int32), bq)[None, :, None, None]
    wi = idiv(r, WORD_BITS)[None, :, None, None]
    return jnp.zeros((B, G, nqt, Ts + 1, nw), jnp.int32).at[bi, gi, ti, jj, wi].add(
        jnp.broadcast_to(bit, jj.shape))


def words_by_tile(table, blocks):
    """:func:`member_table` in the order of each tile's block list (``tile_index``'s blocks):
    [B,G,nqt,Ts,nw], entry [b, g, i, u] for block blocks[b, g, i, u]."""
    return jnp.take_along_axis(table, blocks[..., None], axis=3)


def words_by_block(table, tiles):
    """:func:`member_table` in the order of each block's tile list (``tile_index``'s tiles):
    [B,G,Ts,nqt,nw], entry [b, g, j, u] for tile tiles[b, g, j, u] (padding entries clamped)."""
    nqt = table.shape[2]
    by_block = jnp.swapaxes(table[:, :, :, :-1], 2, 3)   # [B,G,Ts,nqt,nw]
    return jnp.take_along_axis(by_block, jnp.minimum(tiles, nqt - 1)[..., None], axis=3)


def padded_idx(idx):
    """Selection slots padded with -1 to a power of two (a loadable tile width): the packed rows'
    per-row operand of the tiled kernels."""
    n = idx.shape[-1]
    n_p = next_pow2(max(n, 1))
    idx = idx.astype(jnp.int32)
    if n_p == n:
        return idx
    return jnp.pad(idx, [(0, 0)] * 3 + [(0, n_p - n)], constant_values=-1)


def seg_args(seg):
    """Extra operands of packed rows (the document starts) for ``tile_index`` and the tiled
    kernels; none unpacked."""
    return () if seg is None else (seg.start,)


def tile_lists(idx, T: int, cfg: NSAConfig, bq: int, seg):
    """-> (:func:`tile_index`'s four lists, the unpacked rows' :func:`member_table` or None) for
    the tiled kernels (``seg``: packed rows' ``semantics.SegmentLayout`` or None): one scatter of
    the selection for both (packed rows: ``tile_index``'s own)."""
    table = None if seg is not None else member_table(idx, T, cfg, bq)
    return tile_index(idx, T, cfg, bq, *seg_args(seg), table=table), table


def rows_operand(idx, T: int, cfg: NSAConfig, bq: int, seg, table=None, *, blocks=None,
                 tiles=None):
    """The kernels' per-row operand: unpacked, the pairs' membership bits in the order of
    ``blocks`` (forward / dQ) or ``tiles`` (dK/dV), from ``table`` (None: built here); packed
    (``seg``), the rows' padded ids."""
    if seg is not None:
        return padded_idx(idx)
    if table is None:
        table = member_table(idx, T, cfg, bq)
    return words_by_tile(table, blocks) if tiles is None else words_by_block(table, tiles)
