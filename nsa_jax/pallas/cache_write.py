"""Decode-step cache writes as one Pallas kernel (issue #14: the decode step is bound by its kernel
count, and each per-row cache write was its own XLA scatter).

:func:`write_rows_pallas` writes one [G, D] row per batch row into each of several caches
[B, G, S_i, D_i] at its own sequence index idx_i[b], updating the caches in place
(``input_output_aliases``; with the caches donated by the jitted step nothing is copied).
Optionally it also returns, per ring buffer pair, the l-slot compressed-branch ring in token
order *after* the write (the block φ compresses when a compressed block ends at t, Eq. 7):
the ring is read before the write and the new row substituted in registers, so no program reads
what it stores.

Replaces per layer: NSA 6 scatters + 2 ring gathers (one kernel; φ's emission of the compressed
key/value is a second call with 2 caches), dense 2 scatters (one kernel). Results are bitwise the
same as :func:`nsa_jax.nsa.decoding.write_rows` / ``gather_rows`` (pure copies).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from nsa_jax.pallas.common import compiler_params, load, next_pow2, store


def _row_kernel(*refs, n, ring):
    """refs: idx_0..n-1 [B], rows_0..n-1 [B,G,D], bufs_0..n-1 (aliased, unread), then outputs
    bufs_0..n-1 and, with ``ring = (i_k, i_v, start_ref_pos)``, the two token-order blocks.
    One program per (batch row, KV group)."""
    idx_refs, row_refs = refs[:n], refs[n:2 * n]
    k = 2 * n + (1 if ring else 0)
    start_ref = refs[2 * n] if ring else None
    bufs_in = refs[k:k + n]
    outs = refs[k + n:k + 2 * n]
    blocks = refs[k + 2 * n:]
    b, g = pl.program_id(0), pl.program_id(1)
    for i in range(n):
        D = row_refs[i].shape[-1]
        Dp = next_pow2(D)
        dd = jnp.arange(Dp)
        j = idx_refs[i][b]
        x = load(row_refs[i].at[b, g, pl.ds(0, Dp)], dd < D)
        store(outs[i].at[b, g, j, pl.ds(0, Dp)], x, dd < D)
    if ring:
        start = start_ref[b]                       # first token of the block ending at t
        for blk, i in zip(blocks, ring):
            _, _, L, D = bufs_in[i].shape
            Lp, Dp = next_pow2(L), next_pow2(D)
            jj, dd = jnp.arange(Lp), jnp.arange(Dp)
            slot = jnp.mod(start + jj, L)          # ring slots in token order
            ok = (jj < L)[:, None] & (dd < D)[None, :]
            new = slot == idx_refs[i][b]           # the slot this call writes
            old = load(bufs_in[i].at[b, g, slot[:, None], dd[None, :]], ok)
            x = load(row_refs[i].at[b, g, pl.ds(0, Dp)], dd < D)
            val = jnp.where(new[:, None], x[None, :].astype(old.dtype), old)
            store(blk.at[b, jnp.where(jj < L, jj, L)[:, None], g, dd[None, :]], val, ok)


def write_rows_pallas(bufs, rows, idx, *, ring=None, ring_start=None, interpret: bool):
    """Caches ``bufs`` (tuple of [B,G,S_i,D_i]) with ``rows[i]`` [B,G,D_i] written at sequence
    index ``idx[i]`` [B] (int32, < S_i) of each batch row -> tuple of updated caches (in place).

    ``ring=(i_k, i_v)`` with ``ring_start`` [B]: also return the blocks [B,L,G,D] of caches i_k
    and i_v (ring buffers of L slots) in token order from position ring_start[b] (slot
    ``(ring_start + j) % L`` for j < L), as they are after this write.
    """
    n = len(bufs)
    B, G = bufs[0].shape[:2]
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in bufs]
    extra = ()
    if ring is not None:
        out_shape += [jax.ShapeDtypeStruct((B, bufs[i].shape[2], G, bufs[i].shape[3]),
                                           bufs[i].dtype) for i in ring]
        extra = (jnp.asarray(ring_start, jnp.int32),)
    idx = tuple(jnp.asarray(i, jnp.int32) for i in idx)
    rows = tuple(r.astype(bf.dtype) for r, bf in zip(rows, bufs))
    first = 2 * n + len(extra)
    res = pl.pallas_call(
        functools.partial(_row_kernel, n=n, ring=tuple(ring) if ring else None),
        grid=(B, G), out_shape=out_shape,
        input_output_aliases={first + i: i for i in range(n)},
        compiler_params=compiler_params(1, 1), interpret=interpret, name="nsa_cache_write",
    )(*idx, *rows, *extra, *bufs)
    return tuple(res)
