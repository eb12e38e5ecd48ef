"""Incremental decoding with NSA KV caches: prefill, one-token decode step, read counters.

Caches are fixed-shape (``max_len`` given up front) so one jitted step serves every position.
Per NSA layer, in layout ``[B, G, S, D]`` (the sequence axis next to D, so selection blocks are a
free reshape):

* ``k_slc, v_slc`` [B,G,Ts*l',D]: raw (RoPE-rotated) selection-branch keys/values of every token;
* ``k_win, v_win`` [B,G,W,D]: a ring buffer of the last ``W = min(w, max_len)`` window-branch
  keys/values (position s lives in slot ``s % W``);
* ``k_cmp, v_cmp`` [B,G,Tc_max,D]: compressed keys/values (Eq. 7). Block i (tokens
  ``[i*d, i*d+l)``) is emitted when its last token ``t = i*d + l - 1`` arrives: φ runs on the
  block's *un-rotated* cmp-branch keys/values, then the key is rotated at position t
  (:mod:`nsa_jax.nsa.rope`);
* ``kc_raw, vc_raw`` [B,G,l,D]: ring buffer of the last l un-rotated cmp-branch keys/values, the
  inputs of the next block's φ.

Caches of ablated branches are not allocated (the compressed cache is kept while ``slc`` is on,
since selection scores come from it). Dense layers hold a plain ``k, v`` [B,G,max_len,D] cache.

The decode step applies exactly the reference semantics of :mod:`nsa_jax.nsa.reference` to the
new token t: compressed attention over the visible blocks (Eq. 8), group-shared block scores with
the overlap weights (Eq. 9-10), forced blocks + top-n with ties to the lower index, selection
attention over ``s <= t`` inside the selected blocks, the window ``t-w < s <= t``, and the gates
(Eq. 5). The prompt is prefilled with the parallel path (the training forward).
"""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nsa_jax.nsa import NSAConfig, nsa_attention
from nsa_jax.nsa.reference import combine, masked_softmax

Cache = dict[str, Any]


class DecodeError(ValueError):
    """Invalid decode request (prompt too long, cache full, ...); the message says which."""


# ---- cache layout ---------------------------------------------------------------------------
def _nsa_needs(cfg: NSAConfig) -> tuple[bool, bool, bool]:
    """(compressed cache, selection cache, window cache) needed for the enabled branches."""
    br = cfg.branches
    return ("cmp" in br or "slc" in br), "slc" in br, "win" in br


def cache_sizes(cfg: NSAConfig, max_len: int) -> dict[str, int]:
    """Sequence lengths of the NSA caches for ``max_len`` tokens."""
    return {
        "cmp": max(1, cfg.num_cmp_blocks(max_len)),     # >= 1 keeps shapes non-empty (masked)
        "slc": cfg.num_sel_blocks(max_len) * cfg.sel_block,
        "win": min(cfg.window, max_len),
        "raw": cfg.block_l,
    }


def init_cache(model, batch: int, max_len: int) -> Cache:
    """Empty caches for ``batch`` sequences of up to ``max_len`` tokens (prompt + generation)."""
    if batch < 1:
        raise DecodeError(f"batch must be >= 1, got {batch}")
    if max_len < 1:
        raise DecodeError(f"max_len must be >= 1, got {max_len}")
    m, cfg = model.mcfg, model.ncfg
    G, D = m.n_kv_groups, m.head_dim
    dt = model.dtype

    def z(S):
        return jnp.zeros((batch, G, S, D), dt)

    layers = []
    for _ in range(m.n_layers):
        if m.attention == "dense":
            layers.append({"k": z(max_len), "v": z(max_len)})
            continue
        need_cmp, need_slc, need_win = _nsa_needs(cfg)
        sz = cache_sizes(cfg, max_len)
        lc = {}
        if need_cmp:
            lc.update(k_cmp=z(sz["cmp"]), v_cmp=z(sz["cmp"]), kc_raw=z(sz["raw"]),
                      vc_raw=z(sz["raw"]))
        if need_slc:
            lc.update(k_slc=z(sz["slc"]), v_slc=z(sz["slc"]))
        if need_win:
            lc.update(k_win=z(sz["win"]), v_win=z(sz["win"]))
        layers.append(lc)
    return {"pos": jnp.zeros((), jnp.int32), "layers": layers}


def _gsd(x):
    """[B,T,G,D] -> [B,G,T,D]."""
    return jnp.swapaxes(x, 1, 2)


def _ring_write_prefix(ring, x, P: int):
    """Write positions max(0, P-R) .. P-1 of x [B,G,P,D] into ring [B,G,R,D] at slot s % R."""
    R = ring.shape[2]
    pos = np.arange(max(0, P - R), P)
    return ring.at[:, :, pos % R].set(x[:, :, pos].astype(ring.dtype))


def _fill_nsa_layer(lc: Cache, P: int, k_c, v_c, k_cmp, v_cmp, k_s, v_s, k_w, v_w) -> Cache:
    """Caches after a prompt of P tokens. Token tensors [B,P,G,D], compressed [B,Tc(P),G,D]."""
    lc = dict(lc)
    if "k_cmp" in lc:
        Tc = k_cmp.shape[1]
        if Tc:
            lc["k_cmp"] = lc["k_cmp"].at[:, :, :Tc].set(_gsd(k_cmp).astype(lc["k_cmp"].dtype))
            lc["v_cmp"] = lc["v_cmp"].at[:, :, :Tc].set(_gsd(v_cmp).astype(lc["v_cmp"].dtype))
        lc["kc_raw"] = _ring_write_prefix(lc["kc_raw"], _gsd(k_c), P)
        lc["vc_raw"] = _ring_write_prefix(lc["vc_raw"], _gsd(v_c), P)
    if "k_slc" in lc:
        lc["k_slc"] = lc["k_slc"].at[:, :, :P].set(_gsd(k_s).astype(lc["k_slc"].dtype))
        lc["v_slc"] = lc["v_slc"].at[:, :, :P].set(_gsd(v_s).astype(lc["v_slc"].dtype))
    if "k_win" in lc:
        lc["k_win"] = _ring_write_prefix(lc["k_win"], _gsd(k_w), P)
        lc["v_win"] = _ring_write_prefix(lc["v_win"], _gsd(v_w), P)
    return lc


def _set_token(buf, x, idx):
    """buf [B,G,S,D] <- x [B,1,G,D] at sequence index idx (traced)."""
    return jax.lax.dynamic_update_slice(buf, _gsd(x).astype(buf.dtype), (0, 0, idx, 0))


# ---- per-position NSA pieces ----------------------------------------------------------------
def block_scores_decode(p_cmp, cfg: NSAConfig, n_blocks: int):
    """Selection-block scores (Eq. 9-10) for one query: p_cmp [..., Tc] -> [..., n_blocks].

    Same quantity as ``p_cmp @ overlap_weights(Tc, n_blocks)`` without the [Tc, Ts] matrix: with
    r = l/d and m = l'/d, compressed block i covers stride-chunks i .. i+r-1, and overlap/d counts
    the chunks of block i inside selection block j. So chunk c collects sum_{i=c-r+1..c} p_i and
    block j sums chunks j*m .. j*m+m-1.
    """
    r = cfg.block_l // cfg.stride_d
    m = cfg.sel_block // cfg.stride_d
    Tc = p_cmp.shape[-1]
    lead = p_cmp.shape[:-1]
    p = p_cmp.astype(jnp.float32)
    padded = jnp.concatenate([p, jnp.zeros(lead + (r - 1,), jnp.float32)], axis=-1)
    chunk = padded
    for s in range(1, r):   # chunk c = sum_{u<r} p_{c-u}
        chunk = chunk + jnp.concatenate(
            [jnp.zeros(lead + (s,), jnp.float32), padded[..., :Tc + r - 1 - s]], axis=-1)
    C = n_blocks * m
    if chunk.shape[-1] < C:
        chunk = jnp.concatenate([chunk, jnp.zeros(lead + (C - chunk.shape[-1],), jnp.float32)],
                                axis=-1)
    return chunk[..., :C].reshape(lead + (n_blocks, m)).sum(-1)


def topn_decode(scores, t, cfg: NSAConfig):
    """Top-n selection for one query at position t (traced ok): scores [..., Ts] -> int32
    [..., n_sel], ascending ids, -1 for unused slots.

    Per-position twin of :func:`nsa_jax.nsa.reference.topn_from_scores`: candidates j*l' <= t;
    the first ``n_init`` blocks and the ``n_local`` most recent ones are forced; the remaining
    slots take the highest scores, ties to the lower index.
    """
    Ts = scores.shape[-1]
    j = jnp.arange(Ts)
    cur = t // cfg.sel_block
    cand = j <= cur
    forced = cand & ((j < cfg.n_init) | (j > cur - cfg.n_local))
    s = jnp.where(forced, jnp.inf, jnp.where(cand, scores.astype(jnp.float32), -jnp.inf))
    k = min(cfg.n_sel, Ts)
    vals, ids = jax.lax.top_k(s, k)  # stable: equal values keep the lower index first
    ids = jnp.sort(jnp.where(vals > -jnp.inf, ids, Ts), axis=-1)
    ids = jnp.where(ids == Ts, -1, ids).astype(jnp.int32)
    if k < cfg.n_sel:
        pad = jnp.full(ids.shape[:-1] + (cfg.n_sel - k,), -1, jnp.int32)
        ids = jnp.concatenate([ids, pad], axis=-1)
    return ids


def _scores(qg, k):
    """q . k with float32 accumulation, reading the cache in its own dtype (no float32 copy)."""
    return jnp.einsum("bghd,bgsd->bghs", qg.astype(k.dtype), k,
                      preferred_element_type=jnp.float32)


def _mix(p, v):
    """p [B,G,h,S] (float32) @ v [B,G,S,Dv] -> float32. Exact float32 for float32 caches; for
    bfloat16 caches p is rounded to bfloat16 like the flash kernels do (accumulation float32)."""
    return jnp.einsum("bghs,bgsd->bghd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32)


def _attend_one(qg, k, v, mask):
    """qg [B,G,h,D], k [B,G,S,D], v [B,G,S,Dv], mask broadcastable to [B,G,h,S]
    -> float32 [B,G,h,Dv]."""
    scale = 1.0 / math.sqrt(qg.shape[-1])
    return _mix(masked_softmax(_scores(qg, k) * scale, mask), v)


def nsa_decode_attention(q, lc: Cache, t, gates, cfg: NSAConfig, return_info: bool = False):
    """NSA attention (Eq. 5) of the query at position t over caches holding tokens 0..t.

    q [B,Hq,Dk]; gates [B,Hq,3]; t int32 scalar (traced ok). -> [B,Hq,Dv] in q.dtype. With
    ``return_info`` also a dict with the selected block ids [B,G,n] and the number of keys each
    branch attended to (batch row 0, group 0), for tests and counters.
    """
    B, Hq, Dk = q.shape
    br = cfg.branches
    cache_any = lc.get("k_cmp", lc.get("k_slc", lc.get("k_win")))
    G = cache_any.shape[1]
    h = Hq // G
    qg = q.reshape(B, G, h, Dk)
    info = {}
    o_cmp = o_slc = o_win = None

    if "cmp" in br or "slc" in br:
        k_cmp, v_cmp = lc["k_cmp"], lc["v_cmp"]
        Tc = k_cmp.shape[2]
        vis = jnp.arange(Tc) * cfg.stride_d + cfg.block_l - 1 <= t       # [Tc]
        p_cmp = masked_softmax(_scores(qg, k_cmp) / math.sqrt(Dk), vis)   # Eq. 8
        info["cmp"] = jnp.sum(vis)
        if "cmp" in br:
            o_cmp = _mix(p_cmp, v_cmp)

    if "slc" in br:
        k_slc, v_slc = lc["k_slc"], lc["v_slc"]
        lp = cfg.sel_block
        Ts = k_slc.shape[2] // lp
        scores = block_scores_decode(p_cmp, cfg, Ts).sum(axis=2)         # Eq. 10: sum over h
        ids = topn_decode(jax.lax.stop_gradient(scores), t, cfg)         # [B,G,n]
        safe = jnp.maximum(ids, 0)[..., None, None]
        kb = jnp.take_along_axis(k_slc.reshape(B, G, Ts, lp, -1), safe, axis=2)  # [B,G,n,l',D]
        vb = jnp.take_along_axis(v_slc.reshape(B, G, Ts, lp, -1), safe, axis=2)
        n = ids.shape[-1]
        tok = ids[..., None] * lp + jnp.arange(lp)                       # [B,G,n,l']
        valid = (ids[..., None] >= 0) & (tok <= t)
        o_slc = _attend_one(qg, kb.reshape(B, G, n * lp, -1), vb.reshape(B, G, n * lp, -1),
                            valid.reshape(B, G, 1, n * lp))
        info["slc"] = jnp.sum(valid[0, 0])
        info["ids"] = ids

    if "win" in br:
        k_win, v_win = lc["k_win"], lc["v_win"]
        W = k_win.shape[2]
        slot = jnp.arange(W)
        pos = t - jnp.mod(t - slot, W)          # newest position stored in each slot
        valid = (pos >= 0) & (pos > t - cfg.window)
        o_win = _attend_one(qg, k_win, v_win, valid)
        info["win"] = jnp.sum(valid)

    def flat(o):
        return None if o is None else o.reshape(B, Hq, -1)

    out = combine(flat(o_cmp), flat(o_slc), flat(o_win), gates, cfg, q.dtype)
    return (out, info) if return_info else out


def dense_decode_attention(q, k, v, t):
    """Causal attention of the query at position t: q [B,Hq,D], caches [B,G,S,D] -> [B,Hq,D]."""
    B, Hq, D = q.shape
    G = k.shape[1]
    valid = jnp.arange(k.shape[2]) <= t
    o = _attend_one(q.reshape(B, G, Hq // G, D), k, v, valid)
    return o.reshape(B, Hq, -1).astype(q.dtype)


# ---- model-level prefill and step -----------------------------------------------------------
def _append_nsa_layer(attn, lc: Cache, t, k_c, v_c, k_s, v_s, k_w, v_w) -> Cache:
    """Add token t ([B,1,G,D] tensors) to the caches; emit compressed block i when t = i*d+l-1."""
    cfg = attn.ncfg
    lc = dict(lc)
    if "k_slc" in lc:
        lc["k_slc"] = _set_token(lc["k_slc"], k_s, t)
        lc["v_slc"] = _set_token(lc["v_slc"], v_s, t)
    if "k_win" in lc:
        W = lc["k_win"].shape[2]
        lc["k_win"] = _set_token(lc["k_win"], k_w, t % W)
        lc["v_win"] = _set_token(lc["v_win"], v_w, t % W)
    if "k_cmp" in lc:
        l, d = cfg.block_l, cfg.stride_d
        lc["kc_raw"] = _set_token(lc["kc_raw"], k_c, t % l)
        lc["vc_raw"] = _set_token(lc["vc_raw"], v_c, t % l)
        start = t - (l - 1)                          # first token of the block ending at t
        emit = (start >= 0) & (jnp.mod(start, d) == 0)
        i = jnp.maximum(start, 0) // d

        def write(kv):
            kcache, vcache, kraw, vraw = kv
            order = jnp.mod(start + jnp.arange(l), l)          # ring slots in token order
            kb = jnp.swapaxes(kraw[:, :, order], 1, 2)          # [B,l,G,D], un-rotated
            vb = jnp.swapaxes(vraw[:, :, order], 1, 2)
            kc, vc = attn.compress_kv(kb, vb, offset=jnp.maximum(start, 0))  # [B,1,G,D]
            return _set_token(kcache, kc, i), _set_token(vcache, vc, i)

        lc["k_cmp"], lc["v_cmp"] = jax.lax.cond(
            emit, write, lambda kv: (kv[0], kv[1]),
            (lc["k_cmp"], lc["v_cmp"], lc["kc_raw"], lc["vc_raw"]))
    return lc


def _resolve_impl(model):
    from nsa_jax.model import resolve_nsa_impl
    return resolve_nsa_impl(model.xcfg.nsa_impl)


def prefill(model, tokens, cache: Cache, all_logits: bool = False):
    """Run the parallel forward over the prompt tokens [B,P] and fill the (empty) caches.

    Returns (logits, cache): float32 logits [B,P,V] if ``all_logits`` else [B,V] for the last
    prompt token. The per-layer computation is the training forward (``Block.__call__``).
    """
    B, P = tokens.shape
    positions = jnp.arange(P)
    x = model.embed(tokens)
    layers = []
    for blk, lc in zip(model.blocks, cache["layers"]):
        attn = blk.attn
        hN = blk.norm1(x)
        if model.mcfg.attention == "dense":
            q, k, v = attn.project(hN, positions)
            o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=attn.impl())
            a = attn.wo(o.reshape(B, P, -1))
            lc = dict(lc, k=lc["k"].at[:, :, :P].set(_gsd(k).astype(lc["k"].dtype)),
                      v=lc["v"].at[:, :, :P].set(_gsd(v).astype(lc["v"].dtype)))
        else:
            q, k_c, v_c, k_s, v_s, k_w, v_w, gates = attn.project_raw(hN, positions)
            k_cmp, v_cmp = attn.compress_kv(k_c, v_c)
            o = nsa_attention(q, k_cmp, v_cmp, k_s, v_s, k_w, v_w, gates, attn.ncfg,
                              impl=_resolve_impl(model))
            a = attn.wo(o.reshape(B, P, -1).astype(attn.dtype))
            lc = _fill_nsa_layer(lc, P, k_c, v_c, k_cmp, v_cmp, k_s, v_s, k_w, v_w)
        x = x + a
        x = x + blk.mlp(blk.norm2(x))
        layers.append(lc)
    hid = model.norm(x if all_logits else x[:, -1:])
    logits = model.head_logits(hid).astype(jnp.float32)
    if not all_logits:
        logits = logits[:, 0]
    return logits, {"pos": jnp.asarray(P, jnp.int32), "layers": layers}


def decode_step(model, cache: Cache, tokens):
    """Feed one token per sequence (tokens [B], at position ``cache['pos']``).

    Returns (float32 logits [B,V] for the next token, updated cache).
    """
    t = cache["pos"]
    B = tokens.shape[0]
    positions = t[None]
    x = model.embed(tokens[:, None])                    # [B,1,dim]
    layers = []
    for blk, lc in zip(model.blocks, cache["layers"]):
        attn = blk.attn
        hN = blk.norm1(x)
        if model.mcfg.attention == "dense":
            q, k, v = attn.project(hN, positions)
            lc = dict(lc, k=_set_token(lc["k"], k, t), v=_set_token(lc["v"], v, t))
            o = dense_decode_attention(q[:, 0], lc["k"], lc["v"], t)
            a = attn.wo(o.reshape(B, 1, -1))
        else:
            q, k_c, v_c, k_s, v_s, k_w, v_w, gates = attn.project_raw(hN, positions)
            lc = _append_nsa_layer(attn, lc, t, k_c, v_c, k_s, v_s, k_w, v_w)
            o = nsa_decode_attention(q[:, 0], lc, t, gates[:, 0], attn.ncfg)
            a = attn.wo(o.reshape(B, 1, -1).astype(attn.dtype))
        x = x + a
        x = x + blk.mlp(blk.norm2(x))
        layers.append(lc)
    logits = model.head_logits(model.norm(x))[:, 0].astype(jnp.float32)
    return logits, {"pos": t + 1, "layers": layers}


@functools.partial(jax.jit, static_argnames=("graphdef", "all_logits"), donate_argnames=("cache",))
def _prefill_jit(graphdef, state, tokens, cache, all_logits):
    return prefill(nnx.merge(graphdef, state), tokens, cache, all_logits)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def _step_jit(graphdef, state, cache, tokens):
    return decode_step(nnx.merge(graphdef, state), cache, tokens)


class Decoder:
    """Jitted prefill + decode for one model and fixed (batch, max_len).

    >>> dec = Decoder(model, batch=1, max_len=512)
    >>> logits = dec.prefill(prompt_ids)        # [B,V] for the next token
    >>> logits = dec.step(next_ids)             # one token per sequence, repeat
    """

    def __init__(self, model, batch: int, max_len: int):
        self.graphdef, self.state = nnx.split(model)
        self.model = model
        self.batch, self.max_len = batch, max_len
        self.cache = init_cache(model, batch, max_len)
        self.pos = 0

    def reset(self) -> None:
        self.cache = init_cache(self.model, self.batch, self.max_len)
        self.pos = 0

    def prefill(self, tokens, all_logits: bool = False):
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim != 2 or tokens.shape[0] != self.batch:
            raise DecodeError(f"prompt must have shape [batch={self.batch}, P], got "
                              f"{tuple(tokens.shape)}")
        P = tokens.shape[1]
        if P < 1:
            raise DecodeError("prompt must hold at least one token")
        if P > self.max_len:
            raise DecodeError(f"prompt of {P} tokens exceeds max_len={self.max_len}")
        if self.pos:
            self.reset()
        logits, self.cache = _prefill_jit(self.graphdef, self.state, tokens, self.cache,
                                          all_logits)
        self.pos = P
        return logits

    def step(self, tokens):
        tokens = jnp.asarray(tokens, jnp.int32).reshape(-1)
        if tokens.shape[0] != self.batch:
            raise DecodeError(f"step needs one token per sequence ({self.batch}), got "
                              f"{tokens.shape[0]}")
        if self.pos == 0:
            raise DecodeError("call prefill with a prompt before step")
        if self.pos >= self.max_len:
            raise DecodeError(f"cache full: max_len={self.max_len} tokens")
        logits, self.cache = _step_jit(self.graphdef, self.state, self.cache, tokens)
        self.pos += 1
        return logits


# ---- read counters --------------------------------------------------------------------------
def decode_reads(t: int, cfg: NSAConfig, convention: str = "exact") -> dict[str, int]:
    """Keys read by each branch when decoding position t (0-based; the context is N = t+1 tokens).

    ``exact`` (what :func:`nsa_decode_attention` attends to):
      * cmp: Tc = ⌊(N - l)/d⌋ + 1 complete compressed blocks (0 while N < l);
      * slc: min(n·l', N): n selected blocks of l' tokens, clipped to the valid tokens. This is
        exact when N <= n·l' or l' divides N; otherwise the current (forced) block is partial and
        it is the block-granular read a kernel does (keys past t are masked);
      * win: min(w, N).
    ``paper`` (Table 4 of arXiv 2502.11089, "expected number of memory access"): cmp counts one
      compressed token per stride, ⌊N/d⌋, i.e. it ignores the l/d - 1 incomplete trailing
      blocks; slc and win as above. At N = 65536 with l=32, d=16, l'=64, n=16, w=512 this gives
      4096 + 1024 + 512 = 5632 (Table 4), while the exact count is 4095 + 1024 + 512 = 5631.
    Ablated branches read 0. ``total`` is the sum.
    """
    if convention not in ("exact", "paper"):
        raise ValueError(f"convention must be 'exact' or 'paper', got {convention!r}")
    if t < 0:
        raise ValueError(f"t must be >= 0, got {t}")
    N = t + 1
    br = cfg.branches
    cmp = cfg.num_cmp_blocks(N) if convention == "exact" else N // cfg.stride_d
    out = {
        "cmp": cmp if "cmp" in br else 0,
        "slc": min(cfg.n_sel * cfg.sel_block, N) if "slc" in br else 0,
        "win": min(cfg.window, N) if "win" in br else 0,
    }
    out["total"] = out["cmp"] + out["slc"] + out["win"]
    return out


def dense_reads(t: int) -> int:
    """Keys read by dense attention at position t: the whole context, t+1."""
    return t + 1
