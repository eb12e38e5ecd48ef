"""The rules of NSA that every implementation shares: who sees what, how blocks are scored and
chosen, how the branches are mixed (arXiv 2502.11089, §3).

The reference (:mod:`nsa_jax.nsa.reference`), the Pallas kernels (:mod:`nsa_jax.pallas`) and the
decoder (:mod:`nsa_jax.decode`) all take these functions from here, so one rule has one text.
Every mask takes the *query positions* ``t`` (an int array of any shape, traced or not) rather than
a sequence length, so the same function serves a whole sequence (``t = arange(T)``) and one
decoding step (``t`` = the position of each batch row).

Notation: compression block length l (``block_l``), stride d (``stride_d``), selection block length
l' (``sel_block``), n selected blocks (``n_sel``), window w (``window``).
"""
from __future__ import annotations

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
def cmp_visible(t, Tc: int, cfg: NSAConfig) -> jax.Array:
    """[..., Tc] bool: the query at position t sees compressed block i (tokens [i*d, i*d + l))
    iff the block is complete, i*d + l - 1 <= t (Eq. 8)."""
    i = jnp.arange(Tc)
    return i * cfg.stride_d + cfg.block_l - 1 <= jnp.asarray(t)[..., None]


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


def selected_keys_mask(idx: jax.Array, t, S: int, cfg: NSAConfig) -> jax.Array:
    """[..., S] bool: key s is attended by the query at t iff s <= t and s lies in one of the
    selected blocks ``idx [..., n_sel]`` (-1 = unused slot)."""
    Ts = cfg.num_sel_blocks(S)
    blk = jnp.any(idx[..., :, None] == jnp.arange(Ts), axis=-2)       # [..., Ts]
    s = jnp.arange(S)
    return blk[..., s // cfg.sel_block] & (s <= jnp.asarray(t)[..., None])


# ---- window (§3.3.3) ------------------------------------------------------------------------
def window_visible(t, s, window: int) -> jax.Array:
    """Key position(s) s are inside the sliding window of the query at t: t - w < s <= t."""
    t = jnp.asarray(t)
    return (s <= t) & (s > t - window)


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
