"""How tokens enter the KV caches of :mod:`nsa_jax.decode`: a prefill fills them, a decode step
appends one token per row (in XLA, or in one Pallas kernel per layer on the Pallas decode path:
:mod:`nsa_jax.pallas.cache_write`), and a continuation chunk of a chunked prefill appends C tokens
per row (:func:`extend_nsa`, :func:`extend_dense`).

Appending token t: its selection K/V go to index t, its window K/V to ring slot ``t % W``, its
un-rotated cmp-branch K/V to ring slot ``t % l``; when t is the last token of compressed block
``i = (t - l + 1) / d`` (Eq. 7), φ runs on the ring (in token order) and the key is rotated at t.
Rows where no block ends at t get the compressed cache's last slot as their block index, a
scratch slot that no position up to ``max_len`` can see (``cache_sizes`` allocates one more than
the blocks ``max_len`` tokens hold): no branch, so one compiled step serves rows at any
positions. The XLA path runs φ for every row and writes those rows' output there; the Pallas
emission (:mod:`nsa_jax.pallas.phi_decode`) skips them, leaving the slot as it was.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from nsa_jax.nsa import NSAConfig
from nsa_jax.nsa.decoding import gather_rows, ring_positions, write_rows
from nsa_jax.nsa.rope import rotate


# ---- how tokens enter the cache -------------------------------------------------------------
def _gsd(x):
    """[B,T,G,D] -> [B,G,T,D]."""
    return jnp.swapaxes(x, 1, 2)


def _set_prefix(buf, x):
    """buf [B,G,S,D] <- x [B,G,P,D] at indices 0..P-1 (P <= S)."""
    return jax.lax.dynamic_update_slice(buf, x.astype(buf.dtype), (0, 0, 0, 0))


def _ring_fill(ring, x, lengths):
    """Ring [B,G,R,D] after the first lengths[b] tokens of x [B,G,P,D]: slot s % R holds s."""
    return gather_rows(x, ring_positions(lengths - 1, ring.shape[2])).astype(ring.dtype)


def fill_dense(kv: dict, k, v) -> dict:
    """Prompt keys/values [B,P,G,D] into a dense layer's cache."""
    return dict(kv, k=_set_prefix(kv["k"], _gsd(k)), v=_set_prefix(kv["v"], _gsd(v)))


def _write(bufs, rows, idx, interpret: bool | None):
    """Caches ``bufs`` with ``rows[i]`` [B,G,D] at sequence index ``idx[i]`` [B]: one XLA scatter
    per cache (``interpret`` None) or all in one Pallas kernel (``pallas.cache_write``)."""
    if interpret is None:
        return tuple(write_rows(b, x, i) for b, x, i in zip(bufs, rows, idx))
    from nsa_jax.pallas.cache_write import write_rows_pallas
    return write_rows_pallas(tuple(bufs), tuple(rows), tuple(idx), interpret=interpret)


def append_dense(kv: dict, t, k, v, interpret: bool | None = None) -> dict:
    """Token t[b] ([B,1,G,D]) into a dense layer's cache. ``interpret`` not None: both writes in
    one Pallas kernel (``pallas.cache_write``; the Pallas decode path), else two XLA scatters."""
    kk, vv = _write((kv["k"], kv["v"]), (k[:, 0], v[:, 0]), (t, t), interpret)
    return dict(kv, k=kk, v=vv)


def append_dense_rows(kv: dict, t, rows, q, rope, interpret: bool):
    """The Pallas decode path's dense write, as :func:`append_nsa`'s: ``rows`` [B,2,G,D] (or a
    ``pallas.cache_write.Columns`` of the step's fused projection) the token's un-rotated key
    and value, ``q`` [B,H,D] (or Columns) its un-rotated queries, ``rope`` = (cos, sin) [B, D/2]
    at t: both writes and the rotations of the key and q in one kernel. -> (caches, q rotated),
    as :func:`append_nsa` returns them."""
    from nsa_jax.pallas.cache_write import write_rows_pallas
    cos, sin = rope
    k, v, q = write_rows_pallas((kv["k"], kv["v"]), (rows, (0, 1)), (t, t), interpret=interpret,
                                rope=(cos, sin, (0,)), q=q)
    return dict(kv, k=k, v=v), q


def fill_nsa(kv: dict, lengths, k_c, v_c, k_cmp, v_cmp, k_s, v_s, k_w, v_w) -> dict:
    """Caches after prompts of lengths[b] tokens (right-padded to P). Token tensors [B,P,G,D],
    compressed [B,Tc(P),G,D]. Blocks and slots holding padding are never visible to a valid
    position: a block past a row's prompt is rewritten when decoding reaches its last token."""
    kv = dict(kv)
    if "k_cmp" in kv:
        if k_cmp.shape[1]:
            n = min(k_cmp.shape[1], kv["k_cmp"].shape[2])
            kv["k_cmp"] = _set_prefix(kv["k_cmp"], _gsd(k_cmp[:, :n]))
            kv["v_cmp"] = _set_prefix(kv["v_cmp"], _gsd(v_cmp[:, :n]))
        kv["kc_raw"] = _ring_fill(kv["kc_raw"], _gsd(k_c), lengths)
        kv["vc_raw"] = _ring_fill(kv["vc_raw"], _gsd(v_c), lengths)
    if "k_slc" in kv:
        kv["k_slc"] = _set_prefix(kv["k_slc"], _gsd(k_s))
        kv["v_slc"] = _set_prefix(kv["v_slc"], _gsd(v_s))
    if "k_win" in kv:
        kv["k_win"] = _ring_fill(kv["k_win"], _gsd(k_w), lengths)
        kv["v_win"] = _ring_fill(kv["v_win"], _gsd(v_w), lengths)
    return kv


ROWS = ("kc_raw", "vc_raw", "k_slc", "v_slc", "k_win", "v_win")   # the K/V projection's order
ROTATED = ("k_slc", "k_win")      # the caches of rotated keys (RoPE placement: nsa/rope.py)


def append_nsa(kv: dict, t, cfg: NSAConfig, compress, rows, q, rope,
               interpret: bool | None = None, emit=None):
    """Token t[b] into an NSA layer's caches; emits compressed block i = (t - l + 1) / d when a
    block ends at t. -> (caches, q rotated at t).

    ``rows`` [B,6,G,D]: the token's K/V projection in :data:`ROWS` order (one array), un-rotated;
    ``q`` [B,H,D] its un-rotated queries (on the Pallas path either may be a
    ``pallas.cache_write.Columns`` of the step's fused projection, read in place); ``rope`` = (cos, sin) [B, D/2] at t, with which q and
    the :data:`ROTATED` rows are rotated before use. ``compress(kb, vb, offset)`` is the layer's
    φ + RoPE over un-rotated blocks [B,G,l,D] starting at positions offset [B].

    ``interpret`` not None (the Pallas decode path): the rotations, the token writes and the ring
    readout in one Pallas kernel that reads ``rows`` whole (``pallas.cache_write``), and the
    emission either by ``emit(k_cmp, v_cmp, kb, vb, offset, idx, interpret)`` -> (k_cmp, v_cmp)
    (φ, RoPE and the write: ``pallas.phi_decode``; with ``sync=kv["sync"]`` where the cache has
    the completion counters, one launch, -> (k_cmp, v_cmp, sync)) or by ``compress`` and a
    second write kernel;
    else XLA. Same values up to float rounding."""
    kv = dict(kv)
    l, d = cfg.block_l, cfg.stride_d
    cmp = "k_cmp" in kv
    at = {"k_slc": t, "v_slc": t, "kc_raw": t % l, "vc_raw": t % l}
    if "k_win" in kv:
        at["k_win"] = at["v_win"] = t % kv["k_win"].shape[2]
    # write order: selection, window, then the ring pair (the ring readout's indices below)
    names = [n for n in ("k_slc", "v_slc", "k_win", "v_win", "kc_raw", "vc_raw") if n in kv]
    picks = tuple(ROWS.index(n) for n in names)
    idx = [at[n] for n in names]
    start = t - (l - 1)                       # first token of the block ending at t
    cos, sin = rope
    if interpret is None:
        q = rotate(q, cos[:, None], sin[:, None])
        new = [rotate(rows[:, p], cos[:, None], sin[:, None]) if n in ROTATED else rows[:, p]
               for n, p in zip(names, picks)]
        kv.update(zip(names, _write([kv[n] for n in names], new, idx, None)))
        if cmp:
            slots = jnp.mod(start[:, None] + jnp.arange(l), l)   # ring slots in token order
            kb = gather_rows(kv["kc_raw"], slots)                # [B,G,l,D], un-rotated
            vb = gather_rows(kv["vc_raw"], slots)
    else:
        from nsa_jax.pallas.cache_write import write_rows_pallas
        out = write_rows_pallas(tuple(kv[n] for n in names), (rows, picks), tuple(idx),
                                ring=(len(names) - 2, len(names) - 1) if cmp else None,
                                ring_start=start if cmp else None, interpret=interpret,
                                rope=(cos, sin, tuple(i for i, n in enumerate(names)
                                                      if n in ROTATED)), q=q)
        kv.update(zip(names, out[:len(names)]))
        q = out[-1]
        if cmp:
            kb, vb = out[len(names):len(names) + 2]              # [B,G,l,D], token order
    if cmp:
        ends = (start >= 0) & (jnp.mod(start, d) == 0)              # a block ends at t
        scratch = kv["k_cmp"].shape[2] - 1        # never visible: see cache_sizes
        i = jnp.where(ends, jnp.maximum(start, 0) // d, scratch)
        if emit is not None and "sync" in kv:     # the counters of the one-launch φ kernel
            kv["k_cmp"], kv["v_cmp"], kv["sync"] = emit(kv["k_cmp"], kv["v_cmp"], kb, vb,
                                                        jnp.maximum(start, 0), i, interpret,
                                                        sync=kv["sync"])
        elif emit is not None:                    # the model gives one only with interpret set
            kv["k_cmp"], kv["v_cmp"] = emit(kv["k_cmp"], kv["v_cmp"], kb, vb,
                                            jnp.maximum(start, 0), i, interpret)
        else:
            kc, vc = compress(kb, vb, jnp.maximum(start, 0))      # [B,1,G,D]
            kv["k_cmp"], kv["v_cmp"] = _write((kv["k_cmp"], kv["v_cmp"]), (kc[:, 0], vc[:, 0]),
                                              (i, i), interpret)
    return kv, q


# ---- a chunk of C tokens per row (chunked prefill) ------------------------------------------
def _put_valid(buf, x, idx, ok):
    """buf [B,G,S,D] <- x [B,C,G,D] at sequence indices idx (broadcastable to [B,C]) where ok
    [B,C]; the rest (padding, indices past S) is dropped, so a row's cache past its own tokens
    stays as it was."""
    B, S = buf.shape[0], buf.shape[2]
    i = jnp.where(ok, idx, S)
    return buf.at[jnp.arange(B)[:, None], :, i].set(x.astype(buf.dtype), mode="drop")


def _ring_tokens(ring, start):
    """A ring of R slots holding positions start-R .. start-1, in token order -> [B,G,R,D]."""
    R = ring.shape[2]
    return jnp.take(ring, jnp.mod(start - R + jnp.arange(R), R), axis=2)


def _ring_after(span, span_start, end, R: int):
    """The ring of R slots after position end[b] - 1, from span [B,G,S,D] holding positions
    span_start .. span_start + S - 1. A row with end == span_start + R (no token of the chunk)
    gets its ring back unchanged, whatever positions it held."""
    return gather_rows(span, ring_positions(end - 1, R) - span_start)


def extend_dense(kv: dict, start, n, k, v) -> dict:
    """A chunk's keys/values [B,C,G,D] at positions start.. into a dense layer's cache; row b
    takes its first n[b] tokens (the rest is padding)."""
    C = k.shape[1]
    idx = start + jnp.arange(C)
    ok = jnp.arange(C)[None, :] < n[:, None]
    return dict(kv, k=_put_valid(kv["k"], k, idx, ok), v=_put_valid(kv["v"], v, idx, ok))


def extend_nsa(kv: dict, start, n, cfg: NSAConfig, compress, k_c, v_c, k_s, v_s, k_w, v_w):
    """A chunk of C tokens per row at positions start .. start+C-1 into an NSA layer's caches.
    -> (caches, window span).

    ``start`` (int32 scalar, the same for every row) is a multiple of l' and >= l, the caches
    hold each row's tokens before it (a row already past its prompt has n[b] = 0 and keeps its
    caches); row b takes its first n[b] tokens. Token tensors [B,C,G,D] as ``project_raw``
    gives them (k_s, k_w rotated); ``compress(k, v, offset)`` is the layer's φ + RoPE
    (``compress_kv``) over un-rotated tokens [B,T,G,D] from position ``offset``.

    * selection: the tokens at their positions;
    * compressed (Eq. 7): φ over the ring's last l tokens followed by the chunk (offset
      start - l, a multiple of d), whose blocks 1.. end inside the chunk; those ending before a
      row's end are written (blocks ending later are never visible and are rewritten when
      decoding reaches their last token, as after a prefill);
    * the rings (cmp-branch raw tokens, window): the last tokens up to each row's end.

    The window span is ``(k, v, pos)``: the ring's last W tokens before the chunk and the chunk's
    own, [B,G,W+C,D] with positions start - W + i (negative: none), for the chunk's window
    attention (:func:`nsa_jax.nsa.chunked.nsa_chunk_attention`); None without the window."""
    kv = dict(kv)
    C = k_s.shape[1]
    end = start + n
    j = jnp.arange(C)[None, :]
    span = None
    if "k_slc" in kv:
        ok = j < n[:, None]
        kv["k_slc"] = _put_valid(kv["k_slc"], k_s, start + j, ok)
        kv["v_slc"] = _put_valid(kv["v_slc"], v_s, start + j, ok)
    if "k_cmp" in kv:
        l, d = cfg.block_l, cfg.stride_d
        raw_k = jnp.concatenate([_ring_tokens(kv["kc_raw"], start),
                                 _gsd(k_c).astype(kv["kc_raw"].dtype)], axis=2)
        raw_v = jnp.concatenate([_ring_tokens(kv["vc_raw"], start),
                                 _gsd(v_c).astype(kv["vc_raw"].dtype)], axis=2)
        kc, vc = compress(_gsd(raw_k), _gsd(raw_v), start - l)     # [B, C/d + 1, G, D]
        i = jnp.arange(1, kc.shape[1])[None, :]                     # block 0 ends at start - 1
        first = (start - l) // d
        ok = start - l + i * d + l - 1 < end[:, None]               # the block ends in the row
        kv["k_cmp"] = _put_valid(kv["k_cmp"], kc[:, 1:], first + i, ok)
        kv["v_cmp"] = _put_valid(kv["v_cmp"], vc[:, 1:], first + i, ok)
        kv["kc_raw"] = _ring_after(raw_k, start - l, end, l)
        kv["vc_raw"] = _ring_after(raw_v, start - l, end, l)
    if "k_win" in kv:
        W = kv["k_win"].shape[2]
        sk = jnp.concatenate([_ring_tokens(kv["k_win"], start), _gsd(k_w).astype(
            kv["k_win"].dtype)], axis=2)
        sv = jnp.concatenate([_ring_tokens(kv["v_win"], start), _gsd(v_w).astype(
            kv["v_win"].dtype)], axis=2)
        span = (sk, sv, start - W + jnp.arange(W + C))
        kv["k_win"] = _ring_after(sk, start - W, end, W)
        kv["v_win"] = _ring_after(sv, start - W, end, W)
    return kv, span
