"""Pure-JAX reference of NSA attention: the oracle every kernel is tested against.

Everything here is plain ``jax.numpy`` with explicit masks and O(T^2) memory. It favours being
obviously right over being fast. Softmaxes run in float32 whatever the input dtype; outputs are cast
back to ``q.dtype``.

Shapes: ``q [B,T,Hq,Dk]``; compressed keys/values ``k_cmp [B,Tc,G,Dk]``, ``v_cmp [B,Tc,G,Dv]``;
raw keys/values ``[B,T,G,D]``. Query head ``hq`` belongs to KV group ``hq // h`` with ``h = Hq // G``
(consecutive heads share a group, as in ``jax.nn.dot_product_attention``).

Packed documents: every function that takes ``segment_ids`` (int32 [B,T], non-decreasing per
row; or a precomputed :class:`semantics.SegmentLayout`) applies the rules per document
(:mod:`nsa_jax.nsa.semantics`): compressed keys in the per-document slot layout, selected block
ids document-relative, nothing visible across a boundary. ``None`` is one document per row.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig

NEG_INF = semantics.NEG_INF
masked_softmax = semantics.masked_softmax
overlap_weights = semantics.overlap_weights
combine = semantics.combine


def _split_heads(q: jax.Array, G: int) -> jax.Array:
    B, T, Hq, D = q.shape
    if Hq % G:
        raise ValueError(f"query heads Hq={Hq} must be a multiple of KV groups G={G}")
    return q.reshape(B, T, G, Hq // G, D)


def _attend(qg, k, v, mask):
    """qg [B,T,G,h,Dk], k [B,S,G,Dk], v [B,S,G,Dv], mask broadcastable to [B,T,G,h,S]."""
    scale = 1.0 / math.sqrt(qg.shape[-1])
    s = jnp.einsum("btghd,bsgd->btghs", qg.astype(jnp.float32), k.astype(jnp.float32)) * scale
    p = masked_softmax(s, mask)
    return jnp.einsum("btghs,bsgd->btghd", p, v.astype(jnp.float32))


# ---- compressed branch (Eq. 7-8) ----------------------------------------------------------
def cmp_visible(T: int, Tc: int, cfg: NSAConfig) -> jax.Array:
    """[T, Tc] bool: query t sees compressed block i iff i*d + l - 1 <= t (the block is complete).

    Masks are built from iotas inside the graph (no T x T constants in the compiled program)."""
    return semantics.cmp_visible(jnp.arange(T), Tc, cfg)


def layout(segment_ids, cfg: NSAConfig):
    """None, segment ids [B,T] or a SegmentLayout -> None or a SegmentLayout."""
    if segment_ids is None or isinstance(segment_ids, semantics.SegmentLayout):
        return segment_ids
    return semantics.segment_layout(segment_ids, cfg)


def cmp_probs(q, k_cmp, cfg: NSAConfig, segment_ids=None) -> jax.Array:
    """p_cmp [B,T,G,h,Tc] (Eq. 8): float32 softmax of q . k_cmp / sqrt(Dk) over visible blocks
    (over compressed *slots* with ``segment_ids``).

    A query that sees no compressed block yet gets an all-zero row.
    """
    B, T, Hq, Dk = q.shape
    Tc, G = k_cmp.shape[1], k_cmp.shape[2]
    qg = _split_heads(q, G)
    if Tc == 0:
        return jnp.zeros((B, T, G, Hq // G, 0), jnp.float32)
    s = jnp.einsum("btghd,bigd->btghi", qg.astype(jnp.float32), k_cmp.astype(jnp.float32))
    lay = layout(segment_ids, cfg)
    if lay is None:
        mask = jnp.asarray(cmp_visible(T, Tc, cfg))[None, :, None, None, :]
    else:
        mask = semantics.cmp_visible(lay.rel, Tc, cfg, lo=lay.cmp_lo)[:, :, None, None, :]
    return masked_softmax(s / math.sqrt(Dk), mask)


def compressed_attention(q, k_cmp, v_cmp, cfg: NSAConfig, segment_ids=None) -> jax.Array:
    """Attention over compressed tokens (Eq. 8) -> o_cmp [B,T,Hq,Dv] (float32); 0 where no block
    is visible yet."""
    B, T, Hq, _ = q.shape
    p = cmp_probs(q, k_cmp, cfg, segment_ids)
    o = jnp.einsum("btghi,bigd->btghd", p, v_cmp.astype(jnp.float32))
    return o.reshape(B, T, Hq, v_cmp.shape[-1])


# ---- block scoring (Eq. 9-10) and selection -----------------------------------------------
def block_scores(p_cmp: jax.Array, T: int, cfg: NSAConfig, segment_ids=None) -> jax.Array:
    """Group-shared selection-block importance [B,T,G,Ts]: Eq. 9 per head, summed over the
    h heads of a group (Eq. 10). With ``segment_ids`` p_cmp is over slots and the scores are
    over the query's document-relative blocks."""
    lay = layout(segment_ids, cfg)
    if lay is not None:
        p_cmp = semantics.to_document_blocks(p_cmp, lay.cmp_lo[:, :, None, None])
    return semantics.block_scores(p_cmp, cfg.num_sel_blocks(T), cfg).sum(axis=-2)


def selection_masks(T: int, cfg: NSAConfig):
    """``(candidate, forced)`` [T, Ts] bool masks (:func:`semantics.selection_masks`)."""
    return semantics.selection_masks(jnp.arange(T), cfg.num_sel_blocks(T), cfg)


def topn_from_scores(scores: jax.Array, cfg: NSAConfig, segment_ids=None) -> jax.Array:
    """Top-n selection with forced blocks. scores [B,T,G,Ts] -> int32 [B,T,G,n_sel]
    (:func:`semantics.topn_from_scores` with t = the query's own, document-relative,
    position)."""
    T = scores.shape[1]
    lay = layout(segment_ids, cfg)
    t = jnp.arange(T)[None, :, None] if lay is None else lay.rel[:, :, None]
    return semantics.topn_from_scores(scores, t, cfg)


def select_blocks(q, k_cmp, cfg: NSAConfig, segment_ids=None) -> jax.Array:
    """Selected block ids int32 [B,T,G,n_sel] (ascending, -1 padded; document-relative with
    ``segment_ids``). Not differentiable."""
    q = jax.lax.stop_gradient(q)
    k_cmp = jax.lax.stop_gradient(k_cmp)
    lay = layout(segment_ids, cfg)
    return topn_from_scores(block_scores(cmp_probs(q, k_cmp, cfg, lay), q.shape[1], cfg, lay),
                            cfg, lay)


# ---- selection and window branches -------------------------------------------------------
def selected_token_mask(idx: jax.Array, T: int, cfg: NSAConfig, segment_ids=None) -> jax.Array:
    """[B,T,G,T] bool: key s is attended by query t iff s <= t and s lies in a selected block
    (of t's document, with ``segment_ids``)."""
    lay = layout(segment_ids, cfg)
    start = None if lay is None else lay.start[:, :, None]
    return semantics.selected_keys_mask(idx, jnp.arange(T)[None, :, None], T, cfg, start)


def selection_attention(q, k, v, idx, cfg: NSAConfig, segment_ids=None):
    """Attention over the tokens of the selected blocks (§3.3.2). -> [B,T,Hq,Dv]."""
    B, T, Hq, _ = q.shape
    mask = selected_token_mask(idx, T, cfg, segment_ids)[:, :, :, None, :]
    o = _attend(_split_heads(q, k.shape[2]), k, v, mask)
    return o.reshape(B, T, Hq, v.shape[-1])


def window_mask(T: int, window: int, start=None) -> jax.Array:
    """[T, T] bool (or [B, T, T] given the document starts ``start`` [B, T])."""
    if start is None:
        return semantics.window_visible(jnp.arange(T)[:, None], jnp.arange(T)[None, :], window)
    return semantics.window_visible(jnp.arange(T)[None, :, None], jnp.arange(T)[None, None, :],
                                    window, jnp.asarray(start)[:, :, None])


def window_attention(q, k, v, cfg: NSAConfig, segment_ids=None):
    """Sliding-window attention over keys t - w < s <= t (§3.3.3), inside t's document with
    ``segment_ids``. -> [B,T,Hq,Dv]."""
    B, T, Hq, _ = q.shape
    lay = layout(segment_ids, cfg)
    if lay is None:
        mask = jnp.asarray(window_mask(T, cfg.window))[None, :, None, None, :]
    else:
        mask = window_mask(T, cfg.window, lay.start)[:, :, None, None, :]
    o = _attend(_split_heads(q, k.shape[2]), k, v, mask)
    return o.reshape(B, T, Hq, v.shape[-1])


def nsa_attention_reference(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg: NSAConfig,
                            block_idx=None, segment_ids=None):
    """Full NSA attention, reference path. ``block_idx`` overrides the selection if given;
    ``segment_ids`` [B,T] packs documents (module docstring)."""
    br = cfg.branches
    lay = layout(segment_ids, cfg)
    o_cmp = compressed_attention(q, k_cmp, v_cmp, cfg, lay) if "cmp" in br else None
    o_slc = None
    if "slc" in br:
        idx = select_blocks(q, k_cmp, cfg, lay) if block_idx is None else block_idx
        o_slc = selection_attention(q, k_slc, v_slc, idx, cfg, lay)
    o_win = window_attention(q, k_win, v_win, cfg, lay) if "win" in br else None
    return combine(o_cmp, o_slc, o_win, gates, cfg, q.dtype)
