"""NSA and dense attention of a chunk of C new tokens per batch row over KV caches (pure
jax.numpy): the continuation chunks of a chunked prefill (:meth:`nsa_jax.decode.Decoder.
prefill_rows` with ``chunk``), where a prompt whose parallel prefill does not fit in memory is
taken C tokens at a time.

The chunk's queries sit at positions ``t = start + j`` (j < C) and attend over caches that
already hold the chunk's own tokens (:func:`nsa_jax.cache_update.extend_nsa` writes them first),
by the rules of :mod:`nsa_jax.nsa.semantics`, as :func:`nsa_jax.nsa.decoding.
nsa_decode_attention` applies them to one query:

* compressed (Eq. 8): every cached compressed block, masked by ``cmp_visible(t)``; its
  probabilities give each query's group-summed block scores (Eq. 9-10) and top-n (Eq. 11);
* selection: the n blocks gathered from the selection cache by id, keys past t masked;
* window: the window keys come as a *span* (keys [B,G,S,D] with their positions [S]), the ring
  buffer's last W tokens before the chunk followed by the chunk's own, since a chunk longer than
  the ring overwrites keys its first queries still need.

Queries go in blocks of at most :data:`QUERY_BLOCK` (``lax.map``, one after another), so the
memory a layer holds at once is one block's: the compressed scores [B,G,Qb,h,Tc], the gathered
selection blocks [B,G,Qb,n,l',D], the window scores over its W + Qb keys. Dense attention runs
over key blocks with an online softmax, so its scores are [B,G,Qb,h,kb] and never [.., S].
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig


QUERY_BLOCK = 1024      # queries per block of a chunk (module docstring)


def query_block(C: int, most: int | None = None) -> int:
    """The block length for C queries: C halved until it is at most ``most`` (default
    :data:`QUERY_BLOCK`) or odd."""
    most = QUERY_BLOCK if most is None else most
    qb = C
    while qb > most and qb % 2 == 0:
        qb //= 2
    return qb


def _by_query_blocks(fn, qb: int, *xs):
    """``fn(i, *block's xs)`` over the query blocks i of ``qb`` queries, one after another
    (``lax.map``): xs [B,C,...] (or [C] for positions) -> fn's outputs put back as [B,C,...]."""
    C = xs[0].shape[1]
    if qb >= C:
        return fn(jnp.int32(0), *xs)
    nb = C // qb

    def split(x):
        if x.ndim == 1:
            return x.reshape(nb, qb)
        return jnp.moveaxis(x.reshape(x.shape[0], nb, qb, *x.shape[2:]), 1, 0)

    out = jax.lax.map(lambda a: fn(a[0], *a[1:]), (jnp.arange(nb, dtype=jnp.int32),)
                      + tuple(split(x) for x in xs))
    return jnp.moveaxis(out, 0, 1).reshape(out.shape[1], C, *out.shape[3:])


def _scores(qg, k):
    """qg [B,G,C,h,D] . k [B,G,S,D] -> float32 [B,G,C,h,S], reading k in its own dtype."""
    return jnp.einsum("bgchd,bgsd->bgchs", qg.astype(k.dtype), k,
                      preferred_element_type=jnp.float32)


def _mix(p, v):
    """p [B,G,C,h,S] float32 @ v [B,G,S,Dv] -> float32 (p rounded to v's dtype, as
    :func:`nsa_jax.nsa.decoding._mix`)."""
    return jnp.einsum("bgchs,bgsd->bgchd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32)


def _group(q, G: int):
    """q [B,C,Hq,D] -> [B,G,C,h,D] (head hq in group hq // h)."""
    B, C, Hq, D = q.shape
    return jnp.swapaxes(q.reshape(B, C, G, Hq // G, D), 1, 2)


def _heads(o):
    """[B,G,C,h,Dv] -> [B,C,G*h,Dv]."""
    B, G, C, h, Dv = o.shape
    return jnp.swapaxes(o, 1, 2).reshape(B, C, G * h, Dv)


def nsa_chunk_attention(q, lc: dict, span, t, gates, cfg: NSAConfig,
                        q_block: int | None = None):
    """NSA attention (Eq. 5) of the chunk's queries q [B,C,Hq,Dk] at positions t [C] (int32
    consecutive, the same for every row) over caches holding tokens 0..t.

    ``lc``: the layer's caches (:mod:`nsa_jax.nsa.decoding`'s layout), the chunk written;
    ``span``: ``(k, v, pos)`` window keys/values [B,G,W+C,D] and their positions int32 [W+C]
    (t[0] - W + i; negative: none), or None without the window branch; gates [B,C,Hq,3].
    Queries in blocks of :func:`query_block` (C, ``q_block``). -> [B,C,Hq,Dv] in q.dtype."""
    C = q.shape[1]
    qb = query_block(C, q_block)
    t = jnp.asarray(t, jnp.int32)

    def block(i, q, t, gates):
        sp = None
        if span is not None:         # the block's window keys: W + qb of the span
            W = span[0].shape[2] - C
            sp = (jax.lax.dynamic_slice_in_dim(span[0], i * qb, W + qb, axis=2),
                  jax.lax.dynamic_slice_in_dim(span[1], i * qb, W + qb, axis=2),
                  jax.lax.dynamic_slice_in_dim(span[2], i * qb, W + qb, axis=0))
        return _nsa_block(q, lc, sp, t, gates, cfg)

    return _by_query_blocks(block, qb, q, t, gates)


def _nsa_block(q, lc: dict, span, t, gates, cfg: NSAConfig):
    """:func:`nsa_chunk_attention` of one query block."""
    B, C, Hq, Dk = q.shape
    br = cfg.branches
    keys = [lc[k] for k in ("k_cmp", "k_slc") if k in lc] + ([span[0]] if span else [])
    G = keys[0].shape[1]
    qg = _group(q, G)
    scale = 1.0 / math.sqrt(Dk)
    o_cmp = o_slc = o_win = None

    if "cmp" in br or "slc" in br:
        k_cmp = lc["k_cmp"]
        vis = semantics.cmp_visible(t, k_cmp.shape[2], cfg)[None, None, :, None, :]  # [1,1,C,1,Tc]
        p_cmp = semantics.masked_softmax(_scores(qg, k_cmp) * scale, vis)           # Eq. 8
        if "cmp" in br:
            o_cmp = _mix(p_cmp, lc["v_cmp"])

    if "slc" in br:
        lp = cfg.sel_block
        k_slc, v_slc = lc["k_slc"], lc["v_slc"]
        Ts = k_slc.shape[2] // lp
        scores = semantics.block_scores(p_cmp, Ts, cfg).sum(axis=3)                  # Eq. 9-10
        ids = semantics.topn_from_scores(jax.lax.stop_gradient(scores), t, cfg)
        n = ids.shape[-1]                                                             # [B,G,C,n]
        safe = jnp.maximum(ids, 0)
        bi = jnp.arange(B)[:, None, None, None]
        gi = jnp.arange(G)[None, :, None, None]
        kb = k_slc.reshape(B, G, Ts, lp, -1)[bi, gi, safe].reshape(B, G, C, n * lp, -1)
        vb = v_slc.reshape(B, G, Ts, lp, -1)[bi, gi, safe].reshape(B, G, C, n * lp, -1)
        tok = ids[..., None] * lp + jnp.arange(lp)                                   # [B,G,C,n,l']
        valid = (ids[..., None] >= 0) & (tok <= t[:, None, None])
        s = jnp.einsum("bgchd,bgcsd->bgchs", qg.astype(kb.dtype), kb,
                       preferred_element_type=jnp.float32) * scale
        p = semantics.masked_softmax(s, valid.reshape(B, G, C, 1, n * lp))
        o_slc = jnp.einsum("bgchs,bgcsd->bgchd", p.astype(vb.dtype), vb,
                           preferred_element_type=jnp.float32)

    if "win" in br:
        k_w, v_w, pos = span
        valid = (pos >= 0) & semantics.window_visible(t[:, None], pos[None, :], cfg.window)
        o_win = _mix(semantics.masked_softmax(_scores(qg, k_w) * scale,
                                              valid[None, None, :, None, :]), v_w)

    def flat(o):
        return None if o is None else _heads(o)

    return semantics.combine(flat(o_cmp), flat(o_slc), flat(o_win), gates, cfg, q.dtype)


def dense_chunk_attention(q, k, v, t, key_block: int = 1024, q_block: int | None = None):
    """Causal attention of the chunk's queries q [B,C,Hq,D] at positions t [C] over caches
    k, v [B,G,S,D] holding tokens 0..t -> [B,C,Hq,D] in q.dtype.

    An online softmax over key blocks of ``key_block`` (the cache length is padded to a multiple
    of it with masked keys; blocks past a query block's last position are skipped), queries in
    blocks of :func:`query_block` (C, ``q_block``): the scores held at once are
    [B,G,Qb,h,key_block], not [B,G,C,h,S]."""
    S = k.shape[2]
    kb = min(key_block, S)
    nb = -(-S // kb)
    if nb * kb != S:
        pad = ((0, 0), (0, 0), (0, nb * kb - S), (0, 0))
        k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    return _by_query_blocks(lambda i, q, t: _dense_block(q, k, v, t, kb, nb),
                            query_block(q.shape[1], q_block), q, jnp.asarray(t, jnp.int32))


def _dense_block(q, k, v, t, kb: int, nb: int):
    """:func:`dense_chunk_attention` of one query block over the first of nb key blocks of kb
    that hold a key at or before its last query."""
    B, C, Hq, D = q.shape
    G = k.shape[1]
    qg = _group(q, G)
    scale = 1.0 / math.sqrt(D)
    h = Hq // G
    low = -1e30                    # finite: exp(low - low) = 1 where no key is seen yet
    m0 = jnp.full((B, G, C, h), low, jnp.float32)
    l0 = jnp.zeros((B, G, C, h), jnp.float32)
    o0 = jnp.zeros((B, G, C, h, v.shape[-1]), jnp.float32)

    def body(i, carry):
        m, l, o = carry
        kk = jax.lax.dynamic_slice_in_dim(k, i * kb, kb, axis=2)
        vv = jax.lax.dynamic_slice_in_dim(v, i * kb, kb, axis=2)
        s = _scores(qg, kk) * scale
        vis = (i * kb + jnp.arange(kb))[None, :] <= t[:, None]                       # [C,kb]
        s = jnp.where(vis[None, None, :, None, :], s, low)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(vis[None, None, :, None, :], jnp.exp(s - m_new[..., None]), 0.0)
        a = jnp.exp(m - m_new)
        return m_new, l * a + p.sum(-1), o * a[..., None] + _mix(p, vv)

    last = jnp.minimum(nb, jnp.max(t) // kb + 1)   # key blocks past the last query: all masked
    m, l, o = jax.lax.fori_loop(0, last, body, (m0, l0, o0))
    o = o / jnp.where(l > 0, l, 1.0)[..., None]
    return _heads(o).astype(q.dtype)
