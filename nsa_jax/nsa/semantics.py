"""The rules of NSA that every implementation shares: who sees what, how blocks are scored and
chosen, how the branches are mixed (arXiv 2502.11089, §3).

The reference (:mod:`nsa_jax.nsa.reference`), the Pallas kernels (:mod:`nsa_jax.pallas`) and the
decoder (:mod:`nsa_jax.decode`) all take these functions from here, so one rule has one text.
Every mask takes the *query positions* ``t`` (an int array of any shape, traced or not) rather than
a sequence length, so the same function serves a whole sequence (``t = arange(T)``) and one
decoding step (``t`` = the position of each batch row).

Notation: compression block length l (``block_l``), stride d (``stride_d``), selection block length
l' (``sel_block``), n selected blocks (``n_sel``), window w (``window``).

Packed documents (``segment_ids``)
----------------------------------
A row may hold several documents, told apart by ``segment_ids`` int32 [B, T], non-decreasing
along the row, one id per document (any values; only changes matter). **Each document is its own
sequence**: every rule below is applied in *document-relative* coordinates, so a document in a
packed row gets exactly the attention it would get alone. For a token t of the document that
starts at token ``start(t)`` (the first token of the row, or the first one after an id change):

* its relative position is ``r(t) = t - start(t)`` (the model's RoPE positions restart at 0
  there too, unless the caller passes positions);
* compressed block i of a document of length L covers tokens [start + i*d, start + i*d + l),
  i < Tc(L) = max(0, floor((L - l)/d) + 1); the query at t sees block i iff i*d + l - 1 <= r(t);
* selection block j of the document covers [start + j*l', start + (j+1)*l'), candidate iff
  j*l' <= r(t); the forced initial blocks are the document's first ``n_init`` blocks and the
  forced local blocks are floor(r/l'), floor(r/l') - 1, ...; selected block ids are
  *document-relative* j;
* the window is t - w < s <= t and s >= start(t);
* nothing is visible across a boundary, in any branch, in either direction.

Short documents follow from the rules with no special case: a document shorter than l has no
compressed block (o_cmp = 0 for all its queries, and zero block scores, so its selection is the
forced blocks plus the lowest-index candidates: all of its at most n blocks); a document shorter
than l' is one selection block. A row that ends mid-document holds a shorter document (only its
complete compressed blocks exist); a row that starts mid-document starts a document at token 0.

Layout of the compressed keys: ``k_cmp`` keeps its unpacked shape [B, Tc(T), G, D]. Document k's
Tc(L_k) blocks occupy the contiguous *slots* [off_k, off_k + Tc(L_k)), off_k = sum of the
earlier documents' Tc (sum_k Tc(L_k) <= Tc(T) since l is a multiple of d); slots past the last
document's are padding that no query sees. So the compressed keys a query sees are the one
contiguous slot range [off(t), off(t) + Tc(r(t) + 1)). :func:`segment_layout` computes every
per-token and per-slot quantity (O(T), from iotas and cumulative sums; no [T, T] mask).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from nsa_jax.nsa.config import NSAConfig

NEG_INF = -jnp.inf


def masked_softmax(s: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax over the last axis restricted to ``mask``; fully masked rows give all zeros.

    Masked logits are set to -inf *before* the exponential so that neither values nor gradients
    can overflow (no inf * 0 in the backward pass).
    """
    s = jnp.where(mask, s, NEG_INF)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - jax.lax.stop_gradient(m))
    den = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(den > 0, den, 1.0)


# ---- compressed branch (Eq. 7-8) ----------------------------------------------------------
def cmp_visible(t, Tc: int, cfg: NSAConfig, lo=None) -> jax.Array:
    """[..., Tc] bool: the query at position t sees compressed block i (tokens [i*d, i*d + l))
    iff the block is complete, i*d + l - 1 <= t (Eq. 8).

    Packed documents: t is the document-relative position r(t) and ``lo`` (broadcastable to
    t) the document's first compressed slot off(t); slot c is then block i = c - lo of the
    query's own document, visible iff 0 <= i and i*d + l - 1 <= r(t)."""
    t = jnp.asarray(t)[..., None]
    i = jnp.arange(Tc)
    if lo is not None:
        i = i - jnp.asarray(lo)[..., None]
        return (i >= 0) & (i * cfg.stride_d + cfg.block_l - 1 <= t)
    return i * cfg.stride_d + cfg.block_l - 1 <= t


def num_cmp_blocks(L, cfg: NSAConfig):
    """Tc(L) = max(0, floor((L - l)/d) + 1) for an int array of lengths L (traceable)."""
    L = jnp.asarray(L)
    return jnp.maximum(0, (L - cfg.block_l) // cfg.stride_d + 1)


# ---- packed documents -----------------------------------------------------------------------
class SegmentLayout(NamedTuple):
    """Where each token's document starts and where its compressed blocks sit (module docstring).

    start   int32 [B,T]: first token of t's document;
    rel     int32 [B,T]: r(t) = t - start(t);
    cmp_lo  int32 [B,T]: off(t), the first compressed slot of t's document;
    cmp_src int32 [B,Tc]: first token start + i*d of the block in slot c (0 for padding slots);
    cmp_ok  bool  [B,Tc]: slot c holds a block (False for the padding slots at the end).
    """
    start: jax.Array
    rel: jax.Array
    cmp_lo: jax.Array
    cmp_src: jax.Array
    cmp_ok: jax.Array


def check_segment_ids(segment_ids, shape, name: str = "segment_ids") -> None:
    """One ``ValueError`` naming ``name`` unless segment_ids is an integer array of ``shape``
    ([B, T]) that does not decrease along any row. Values are checked only when concrete
    (not under ``jit``): the data loader and the model's eager callers check them there."""
    a = segment_ids
    if tuple(np.shape(a)) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (one id per token), got "
                         f"{tuple(np.shape(a))}")
    if not jnp.issubdtype(jnp.asarray(a).dtype if not isinstance(a, jax.core.Tracer)
                          else a.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {a.dtype}")
    if isinstance(a, jax.core.Tracer):
        return
    a = np.asarray(a)
    bad = np.nonzero(np.any(np.diff(a, axis=-1) < 0, axis=-1))[0] if a.shape[-1] > 1 else []
    if len(bad):
        b = int(bad[0])
        t = int(np.nonzero(np.diff(a[b]) < 0)[0][0]) + 1
        raise ValueError(f"{name} must be non-decreasing along each row (one id per document); "
                         f"row {b} goes from {a[b, t - 1]} to {a[b, t]} at token {t}")


def document_starts(segment_ids) -> jax.Array:
    """int32 [B,T]: the first token of each token's document (segment ids [B,T])."""
    seg = jnp.asarray(segment_ids)
    B, T = seg.shape
    t = jnp.arange(T, dtype=jnp.int32)
    first = jnp.concatenate([jnp.ones((B, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    return jax.lax.cummax(jnp.where(first, t, 0), axis=1)


def document_positions(segment_ids) -> jax.Array:
    """int32 [B,T]: positions restarting at 0 at each document's first token."""
    T = jnp.shape(segment_ids)[-1]
    return jnp.arange(T, dtype=jnp.int32) - document_starts(segment_ids)


def segment_layout(segment_ids, cfg: NSAConfig) -> SegmentLayout:
    """The :class:`SegmentLayout` of segment_ids int [B,T] (non-decreasing per row)."""
    seg = jnp.asarray(segment_ids)
    B, T = seg.shape
    Tc = cfg.num_cmp_blocks(T)
    t = jnp.arange(T, dtype=jnp.int32)
    first = jnp.concatenate([jnp.ones((B, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    start = document_starts(seg)
    last = jnp.concatenate([seg[:, 1:] != seg[:, :-1], jnp.ones((B, 1), bool)], axis=1)
    end = jax.lax.cummin(jnp.where(last, t + 1, T), axis=1, reverse=True)  # one past the doc
    n_doc = num_cmp_blocks(end - start, cfg).astype(jnp.int32)              # Tc(L) per token
    cmp_hi = jnp.cumsum(jnp.where(first, n_doc, 0), axis=1)                 # off + Tc(L)
    cmp_lo = cmp_hi - n_doc
    c = jnp.arange(Tc, dtype=jnp.int32)
    # slot c belongs to the first token whose document ends past c: that document's first token
    owner = jax.vmap(lambda hi: jnp.searchsorted(hi, c, side="right"))(cmp_hi)
    owner = jnp.minimum(owner, T - 1).astype(jnp.int32)
    lo_c = jnp.take_along_axis(cmp_lo, owner, axis=1)
    cmp_ok = c < cmp_hi[:, -1:]
    cmp_src = jnp.where(cmp_ok, owner + (c - lo_c) * cfg.stride_d, 0)
    return SegmentLayout(start.astype(jnp.int32), (t - start).astype(jnp.int32),
                         cmp_lo.astype(jnp.int32), cmp_src.astype(jnp.int32), cmp_ok)


def to_document_blocks(p_slots: jax.Array, lo) -> jax.Array:
    """p over compressed slots [..., Tc] -> over the query's document blocks [..., Tc]:
    out[..., i] = p[..., lo + i] (0 past the end). ``lo`` broadcastable to p.shape[:-1]."""
    Tc = p_slots.shape[-1]
    i = jnp.asarray(lo)[..., None] + jnp.arange(Tc)
    i = jnp.broadcast_to(i, p_slots.shape)
    g = jnp.take_along_axis(p_slots, jnp.minimum(i, Tc - 1), axis=-1)
    return jnp.where(i < Tc, g, 0)


# ---- block scoring (Eq. 9-10) ---------------------------------------------------------------
def overlap_weights(Tc: int, Ts: int, cfg: NSAConfig) -> np.ndarray:
    """[Tc, Ts] float32: |[i*d, i*d+l) ∩ [j*l', (j+1)*l')| / d  — Eq. 9 read as overlap.

    For l=32, d=16, l'=64 row weights are 1,2,2,2,1 on compressed blocks 4j-1 .. 4j+3.
    :func:`block_scores` computes ``p @ overlap_weights`` without this matrix.
    """
    i = np.arange(Tc)[:, None]
    j = np.arange(Ts)[None, :]
    lo = np.maximum(i * cfg.stride_d, j * cfg.sel_block)
    hi = np.minimum(i * cfg.stride_d + cfg.block_l, (j + 1) * cfg.sel_block)
    return (np.maximum(hi - lo, 0) / cfg.stride_d).astype(np.float32)


def block_scores(p_cmp: jax.Array, Ts: int, cfg: NSAConfig) -> jax.Array:
    """Selection-block importance (Eq. 9): p_cmp [..., Tc] -> float32 [..., Ts].

    The same quantity as ``p_cmp @ overlap_weights(Tc, Ts)`` in O(Tc) memory: with r = l/d and
    m = l'/d, compressed block i covers stride chunks i .. i+r-1, so chunk c collects
    sum_{u<r} p_{c-u} and selection block j sums chunks j*m .. j*m+m-1. Summing the result over
    the h heads of a KV group gives Eq. 10's shared score.
    """
    r = cfg.block_l // cfg.stride_d
    m = cfg.sel_block // cfg.stride_d
    Tc = p_cmp.shape[-1]
    lead = p_cmp.shape[:-1]
    p = p_cmp.astype(jnp.float32)
    C = Ts * m
    n = max(C, Tc + r - 1)
    padded = jnp.concatenate([p, jnp.zeros(lead + (n - Tc,), jnp.float32)], axis=-1)
    chunk = padded
    for u in range(1, r):   # chunk c = sum_{u<r} p_{c-u}
        chunk = chunk + jnp.concatenate([jnp.zeros(lead + (u,), jnp.float32),
                                         padded[..., :n - u]], axis=-1)
    return chunk[..., :C].reshape(lead + (Ts, m)).sum(-1)


# ---- selection (§3.3.2) ---------------------------------------------------------------------
def selection_masks(t, Ts: int, cfg: NSAConfig):
    """``(candidate, forced)`` [..., Ts] bool masks for queries at positions t.

    Block j is a candidate iff j*l' <= t. The first ``n_init`` blocks and the ``n_local`` most
    recent blocks (floor(t/l'), floor(t/l')-1, ...) are forced, among candidates.
    """
    cur = (jnp.asarray(t) // cfg.sel_block)[..., None]
    j = jnp.arange(Ts)
    cand = j <= cur
    forced = cand & ((j < cfg.n_init) | (j > cur - cfg.n_local))
    return cand, forced


def topn_from_scores(scores: jax.Array, t, cfg: NSAConfig) -> jax.Array:
    """Top-n selection with forced blocks (Eq. 11). scores [..., Ts], t broadcastable to
    scores.shape[:-1] -> int32 [..., n_sel].

    Forced blocks are always kept (they count within n); remaining slots take the highest
    scores among candidates, ties to the lower index. Ids come out ascending, with -1 for
    unused slots at the end.
    """
    Ts = scores.shape[-1]
    cand, forced = selection_masks(t, Ts, cfg)
    s = jnp.where(forced, jnp.inf, jnp.where(cand, scores.astype(jnp.float32), -jnp.inf))
    k = min(cfg.n_sel, Ts)
    vals, ids = jax.lax.top_k(s, k)  # stable: equal values keep the lower index first
    ids = jnp.where(vals > -jnp.inf, ids, Ts)
    ids = jnp.sort(ids, axis=-1)
    ids = jnp.where(ids == Ts, -1, ids).astype(jnp.int32)
    if k < cfg.n_sel:
        pad = jnp.full(ids.shape[:-1] + (cfg.n_sel - k,), -1, jnp.int32)
        ids = jnp.concatenate([ids, pad], axis=-1)
    return ids


def distinct_ids(idx: jax.Array) -> jax.Array:
    """Block ids [..., n] with each later repeat of an id in a row set to -1 (unused). Eq. 10
    attends the *union* of the selected blocks (``selected_keys_mask``), so a repeated id
    selects nothing more; kernels that take one partial per slot need each id once. Top-n
    (``topn_from_scores``) never repeats one; a caller's ``block_idx`` may."""
    n = idx.shape[-1]
    earlier = jnp.tril(jnp.ones((n, n), bool), -1)                     # [i, j]: j < i
    repeat = jnp.any((idx[..., :, None] == idx[..., None, :]) & earlier, axis=-1)
    return jnp.where(repeat & (idx >= 0), -1, idx).astype(idx.dtype)


def selected_keys_mask(idx: jax.Array, t, S: int, cfg: NSAConfig, start=None) -> jax.Array:
    """[..., S] bool: key s is attended by the query at t iff s <= t and s lies in one of the
    selected blocks ``idx [..., n_sel]`` (-1 = unused slot).

    Packed documents: t stays the absolute query position and ``start`` (broadcastable to t) is
    its document's first token; block j is then [start + j*l', start + (j+1)*l') and keys before
    ``start`` are never attended."""
    Ts = cfg.num_sel_blocks(S)
    blk = jnp.any(idx[..., :, None] == jnp.arange(Ts), axis=-2)       # [..., Ts]
    s = jnp.arange(S)
    t = jnp.asarray(t)[..., None]
    if start is None:
        return blk[..., s // cfg.sel_block] & (s <= t)
    rs = s - jnp.asarray(start)[..., None]                           # [..., S]
    j = jnp.clip(rs // cfg.sel_block, 0, Ts - 1)
    return jnp.take_along_axis(blk, j, axis=-1) & (rs >= 0) & (s <= t)


# ---- window (§3.3.3) ------------------------------------------------------------------------
def window_visible(t, s, window: int, start=None) -> jax.Array:
    """Key position(s) s are inside the sliding window of the query at t: t - w < s <= t
    (and s >= start, the first token of t's document, when ``start`` is given)."""
    t = jnp.asarray(t)
    vis = (s <= t) & (s > t - window)
    if start is not None:
        vis = vis & (s >= jnp.asarray(start))
    return vis


def packed_segments(rel) -> tuple[jax.Array, jax.Array]:
    """cuDNN's packed (THD) description of packed rows from their document-relative positions
    ``rel`` [B,T] (:func:`document_positions`): (lengths [B,T], offsets [B,T+1]) int32, one
    entry per document in row order (its length; its first token, then T after the last
    document), -1 padded; T bounds the documents of a row. O(T), no [T, T] mask."""
    rel = jnp.asarray(rel)
    B, T = rel.shape
    t = jnp.arange(T, dtype=jnp.int32)
    first = rel == 0
    rank = jnp.cumsum(first, axis=1) - 1                                        # doc index
    n_docs = rank[:, -1] + 1
    starts = jnp.full((B, T + 1), -1, jnp.int32).at[
        jnp.arange(B)[:, None], jnp.where(first, rank, T + 1)].set(t, mode="drop")
    starts = starts.at[jnp.arange(B), n_docs].set(T)                            # end marker
    m = jnp.arange(T)[None, :]
    lengths = jnp.where(m < n_docs[:, None], starts[:, 1:] - starts[:, :-1], -1)
    offsets = jnp.where(jnp.arange(T + 1)[None, :] <= n_docs[:, None], starts, -1)
    return lengths.astype(jnp.int32), offsets.astype(jnp.int32)


def same_document(seg_q, seg_k) -> jax.Array:
    """[..., Tq, Tk] bool from segment ids [..., Tq] and [..., Tk] (the dense path's mask)."""
    return jnp.asarray(seg_q)[..., :, None] == jnp.asarray(seg_k)[..., None, :]


# ---- gated output (Eq. 5) -------------------------------------------------------------------
def combine(o_cmp, o_slc, o_win, gates, cfg: NSAConfig, dtype):
    """Gated sum over branches (Eq. 5): o = sum_c g_c * o_c, with ablated branches (None)
    dropped. gates [..., 3] ordered (cmp, slc, win); o_c [..., Dv]."""
    g = gates.astype(jnp.float32)
    out = 0.0
    for c, o in enumerate((o_cmp, o_slc, o_win)):
        if o is not None:
            out = out + g[..., c:c + 1] * o
    return jnp.asarray(out).astype(dtype)
