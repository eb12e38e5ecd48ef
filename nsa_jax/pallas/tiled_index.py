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
"""
from __future__ import annotations

import jax.numpy as jnp

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import cdiv, idiv


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


def tile_index(idx, T: int, cfg: NSAConfig, bq: int, start=None):
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
    """
    B, _, G, n = idx.shape
    Ts = cfg.num_sel_blocks(T)
    nqt = cdiv(T, bq)
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
