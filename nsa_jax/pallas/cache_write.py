"""Decode-step cache writes as one Pallas kernel (issue #14: the decode step is bound by its kernel
count, and each per-row cache write was its own XLA scatter).

:func:`write_rows_pallas` writes one [G, D] row per batch row into each of several caches
[B, G, S_i, D_i] at its own sequence index idx_i[b], updating the caches in place
(``input_output_aliases``; with the caches donated by the jitted step nothing is copied).
Optionally it also returns, per ring buffer pair, the l-slot compressed-branch ring in token
order *after* the write (the block φ compresses when a compressed block ends at t, Eq. 7):
the ring is read before the write and the new row substituted in registers, so no program reads
what it stores.

The NSA decode step also hands it the new token's RoPE: the selection and window keys are
rotated in registers before they are written, and the group's queries are rotated and returned
(``rope=``, ``q=``), instead of two XLA fusions per layer.

Replaces per layer: NSA 6 scatters + 2 ring gathers + the token's RoPE (one kernel; φ's emission
of the compressed key/value is ``pallas.phi_decode``, or a second call of this kernel with 2
caches where that does not apply), dense 2 scatters (one kernel). The copies are bitwise the same
as :func:`nsa_jax.nsa.decoding.write_rows` / ``gather_rows``; the rotations equal
:func:`nsa_jax.nsa.rope.apply_rope`'s within float rounding.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from nsa_jax.pallas.common import compiler_params, load, next_pow2, rope_halves, store


@dataclasses.dataclass(frozen=True)
class Columns:
    """Columns [offset, offset + prod(shape)) of a 2-D array [B, W], read as [B, *shape]
    (row-major) in place: the decode step's fused projection [q | K/V | gate logits] hands the
    kernel its q and K/V parts this way, so XLA copies no slice of it into an operand."""
    array: jax.Array
    offset: int
    shape: tuple


# a pytree (the array its leaf, offset and shape static), so it passes through jax.jit
jax.tree_util.register_dataclass(Columns, data_fields=["array"], meta_fields=["offset", "shape"])


def flat_columns(x, shape_tail: int):
    """An operand [B, ...] (or :class:`Columns`) -> (2-D array [B, W], column offset, shape)."""
    if isinstance(x, Columns):
        width = math.prod(x.shape)
        if (x.array.ndim != 2 or len(x.shape) != shape_tail or x.offset < 0
                or x.offset + width > x.array.shape[1]):
            raise ValueError(f"Columns of a [B, W] array read as [B, {shape_tail} dims] inside "
                             f"its W columns, got {x.array.shape} read as {x.shape} from column "
                             f"{x.offset}")
        return x.array, int(x.offset), tuple(x.shape)
    return x.reshape(x.shape[0], -1), 0, tuple(x.shape[1:])


def _row_kernel(*refs, n, n_ops, src, offs, ring, rot, has_rope, q_at):
    """refs: idx_0..n-1 [B], the row operands (``n_ops``: [B,G,D] rows, or 2-D [B, W] stacks
    read as [R,G,D] from column ``offs[j]``), [ring start [B]], [cos, sin [B, D/2] with
    ``has_rope``], [queries: 2-D [B, W] read as [H, D] from column ``q_at[0]``, ``q_at =
    (offset, H, D)``], bufs_0..n-1 (aliased; read only by the ring readout), then outputs
    bufs_0..n-1, with ``ring = (i_k, i_v)`` the two token-order blocks, and with queries their
    rotation [B,H,D]. ``src[i] = (operand, stack row or None)`` is where cache i's row comes
    from; the rows of the caches in ``rot`` are rotated at the row's position before they are
    written. One program per (batch row, KV group)."""
    has_q = q_at is not None
    idx_refs, op_refs = refs[:n], refs[n:n + n_ops]
    k = n + n_ops
    start_ref = refs[k] if ring else None
    k += 1 if ring else 0
    cos_ref, sin_ref = (refs[k], refs[k + 1]) if has_rope else (None, None)
    k += 2 if has_rope else 0
    q_ref = refs[k] if has_q else None
    k += 1 if has_q else 0
    bufs_in = refs[k:k + n]
    outs = refs[k + n:k + 2 * n]
    blocks = refs[k + 2 * n:k + 2 * n + (2 if ring else 0)]
    q_out = refs[-1] if has_q else None
    b, g = pl.program_id(0), pl.program_id(1)
    G = bufs_in[0].shape[1]

    def src_at(i, cols):
        """Cache i's new row for (b, g) at columns ``cols`` (an index array) of its operand."""
        j, r = src[i]
        if r is None:
            return op_refs[j].at[b, g, cols]
        return op_refs[j].at[b, offs[j] + (r * G + g) * bufs_in[i].shape[-1] + cols]

    def halves(ref_at, D):
        """Rotate-half operands: ``ref_at(cols, ok)`` at the first and the second D/2 columns
        (padded to a power of two, masked), and cos, sin; -> (x1, x2, cos, sin, cols, ok)."""
        half = D // 2
        dh = jnp.arange(next_pow2(half))
        ok = dh < half
        dc = jnp.where(ok, dh, 0)
        c = load(cos_ref.at[b, dc], ok)
        sn = load(sin_ref.at[b, dc], ok)
        return ref_at(dc, ok), ref_at(dc + half, ok), c, sn, dh, ok

    def row(i, D):
        """Cache i's new row [next_pow2(D)] for (b, g), zero past D."""
        dd = jnp.arange(next_pow2(D))
        return load(src_at(i, jnp.where(dd < D, dd, 0)), dd < D)

    # Every load is issued before any store: the stores may alias the loads' memory for all the
    # compiler knows, so a store between two loads would make each load wait for the one before
    # (one memory round trip per cache; bench/NOTES.md, forty-third session).
    writes = []                                      # (out ref, value, mask), stored last
    rows = {}
    for i in range(n):
        D = bufs_in[i].shape[-1]
        dd = jnp.arange(next_pow2(D))
        if i in rot:                                 # a key: rotated at the row's position
            x1, x2, c, sn, dh, ok = halves(lambda cols, ok, i=i: load(src_at(i, cols), ok), D)
            y1, y2 = (y.astype(outs[i].dtype) for y in rope_halves(x1, x2, c, sn))
            for lo, y in ((0, y1), (D // 2, y2)):    # masked columns: out of bounds, dropped
                writes.append((outs[i].at[b, g, idx_refs[i][b], jnp.where(ok, lo + dh, D)], y,
                               ok))
        else:
            rows[i] = row(i, D)
            writes.append((outs[i].at[b, g, idx_refs[i][b], pl.ds(0, dd.shape[0])], rows[i],
                           dd < D))
    if has_q:                                        # the group's h query heads, rotated
        q_off, H, D = q_at
        h = H // G
        hr = jnp.arange(next_pow2(h))
        okh = hr < h
        heads = g * h + jnp.where(okh, hr, 0)
        x1, x2, c, sn, dh, ok = halves(
            lambda cols, ok: load(q_ref.at[b, q_off + heads[:, None] * D + cols[None, :]],
                                  okh[:, None] & ok[None, :]), D)
        y1, y2 = (y.astype(q_out.dtype) for y in rope_halves(x1, x2, c[None, :], sn[None, :]))
        ho = jnp.where(okh, heads, H)                # masked heads: out of bounds, dropped
        for lo, y in ((0, y1), (D // 2, y2)):
            writes.append((q_out.at[b, ho[:, None], jnp.where(ok, lo + dh, D)[None, :]], y,
                           okh[:, None] & ok[None, :]))
    if ring:
        start = start_ref[b]                       # first token of the block ending at t
        for blk, i in zip(blocks, ring):           # ring caches are never rotated (checked)
            _, _, L, D = bufs_in[i].shape
            Lp, Dp = next_pow2(L), next_pow2(D)
            jj, dd = jnp.arange(Lp), jnp.arange(Dp)
            slot = jnp.mod(start + jj, L)          # ring slots in token order
            ok = (jj < L)[:, None] & (dd < D)[None, :]
            new = slot == idx_refs[i][b]           # the slot this call writes
            old = load(bufs_in[i].at[b, g, slot[:, None], dd[None, :]], ok)
            val = jnp.where(new[:, None], rows[i][None, :].astype(old.dtype), old)
            writes.append((blk.at[b, g, jnp.where(jj < L, jj, L)[:, None], dd[None, :]], val,
                           ok))
    for ref, val, mask in writes:
        store(ref, val, mask)


def write_rows_pallas(bufs, rows, idx, *, ring=None, ring_start=None, rope=None, q=None,
                      interpret: bool):
    """Caches ``bufs`` (tuple of [B,G,S_i,D_i]) with row i written at sequence index ``idx[i]``
    [B] (int32, < S_i) of each batch row -> tuple of updated caches (in place).

    ``rows``: a tuple of [B,G,D_i] rows, one per cache, or ``(stack, picks)``: one [B,R,G,D]
    array (or :class:`Columns` of a [B, W] array read as [R,G,D]) and the stack row of each
    cache (the decode step passes its K/V projection this way, so no slice of it is copied into
    an operand of its own).

    ``rope=(cos, sin, rotated)``: cos, sin [B, D/2] float32 (RoPE at each row's position) and the
    indices of the caches whose rows are keys to rotate before the write; ``q`` [B,H,D] or
    :class:`Columns` read as [H, D] (needs ``rope``): also return the queries rotated the same
    way, [B,H,D] in q's dtype (the decode step's RoPE in this kernel instead of two XLA fusions
    per layer).

    ``ring=(i_k, i_v)`` with ``ring_start`` [B]: also return the blocks [B,G,L,D] of caches i_k
    and i_v (ring buffers of L slots) in token order from position ring_start[b] (slot
    ``(ring_start + j) % L`` for j < L), as they are after this write (the caches' layout, so φ
    reads them without a transpose).
    """
    n = len(bufs)
    B, G = bufs[0].shape[:2]
    if isinstance(rows, tuple) and len(rows) == 2 and isinstance(rows[1], tuple):
        stack, picks = rows
        flat, off, shape = flat_columns(stack, 3)
        dt = {x.dtype for x in bufs}
        if (len(picks) != n or shape[1:] != (G, bufs[0].shape[-1])
                or not all(0 <= p < shape[0] for p in picks)):
            raise ValueError(f"a [B,R,G,D] stack matching the caches with one pick per cache "
                             f"({n}), got [B,{','.join(map(str, shape))}] and {picks}")
        if len(dt) != 1 or len({x.shape[-1] for x in bufs}) != 1:
            raise ValueError("a row stack needs caches of one dtype and head dim, got "
                             f"{[(str(x.dtype), x.shape[-1]) for x in bufs]}")
        ops, offs = (flat.astype(bufs[0].dtype),), (off,)
        src = tuple((0, int(p)) for p in picks)
    else:
        ops = tuple(r.astype(bf.dtype) for r, bf in zip(rows, bufs))
        src, offs = tuple((i, None) for i in range(n)), (0,) * n
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in bufs]
    extra = ()
    if ring is not None:
        out_shape += [jax.ShapeDtypeStruct(bufs[i].shape, bufs[i].dtype) for i in ring]
        extra = (jnp.asarray(ring_start, jnp.int32),)
    rot = ()
    if q is not None and rope is None:
        raise ValueError("rotating the queries needs rope=(cos, sin, rotated)")
    if rope is not None:
        cos, sin, rot = rope
        if ring is not None and set(rot) & set(ring):
            raise ValueError(f"a ring cache's rows are read back un-rotated: rotated {rot}, "
                             f"ring {ring}")
        extra += (cos.astype(jnp.float32), sin.astype(jnp.float32))
    q_at = None
    if q is not None:
        q2, q_off, (H, Dq) = flat_columns(q, 2)
        extra += (q2,)
        q_at = (q_off, H, Dq)
        out_shape.append(jax.ShapeDtypeStruct((B, H, Dq), q2.dtype))
    idx = tuple(jnp.asarray(i, jnp.int32) for i in idx)
    first = n + len(ops) + len(extra)
    res = pl.pallas_call(
        functools.partial(_row_kernel, n=n, n_ops=len(ops), src=src, offs=offs,
                          ring=tuple(ring) if ring else None, rot=tuple(rot),
                          has_rope=rope is not None, q_at=q_at),
        grid=(B, G), out_shape=out_shape,
        input_output_aliases={first + i: i for i in range(n)},
        compiler_params=compiler_params(1, 1), interpret=interpret, name="nsa_cache_write",
    )(*idx, *ops, *extra, *bufs)
    return tuple(res)
