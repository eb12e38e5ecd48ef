"""A continuation chunk of a chunked prefill on the Pallas kernels: the C new tokens' queries per
row, at positions start .. start + C - 1, over KV caches that already hold them (forward only).
The jax.numpy twin, and the contract, is :mod:`nsa_jax.nsa.chunked` (its module docstring);
:meth:`nsa_jax.attention_modules.NSAAttention._extend` picks this one where ``exec.nsa_impl``
resolves to ``pallas``.

The training kernels take the chunk with its queries' positions moved past their row index:

* compressed attention (Eq. 8): where ``KernelChoices.cmp_attn`` resolves to "cudnn" (or its
  CPU twin "xla"), two plain attentions in the grouped layout (``cmp_grouped.cmp_chunk_grouped``:
  the blocks before the chunk's first grouped row, and a causal square over the chunk's own);
  "auto" takes cuDNN where it applies and the cache is longer than ``cmp_pallas_max_t``, as
  the training op does for T;
* else compressed attention and the group-summed block scores (Eq. 9-10): the packed-rows
  kernels (``compressed.cmp_forward``, ``scoring.cmp_block_scores``) with one document per row
  that starts at token 0 and whose query i sits at r = start + i (``offset_layout``): they
  already read a query's position from ``SegmentLayout.rel`` and its first compressed slot
  from ``cmp_lo``, so the cache's compressed keys are the slots 0.. and no kernel changes;
  the scores cover every selection block of the cache (``Ts``);
* top-n (Eq. 11): ``topn.topn_upto`` at positions r: the tournament kernel over the cache's Ts
  columns, whose first pass walks only the segments a row can see (the training buckets assume
  position <= row index; a full pass over Ts columns would make every chunk pay for the last
  one's);
* selection: the gather forward with ``offset`` (key position start + t for the causal mask of
  the query's own block) over the selection cache: the block-major one
  (``selection_block.sel_forward_block``) where the training's rule takes it (``nsa.block_forward``:
  groups of <= 8 heads in 16-bit), else the query-major one;
* window: the document-local kernel with ``offset`` = W over the span of the ring's last W tokens
  and the chunk's own (``cache_update.extend_nsa``), the span's keys before token 0 outside the
  "document" (``start`` = max(0, W - start)).

Dense attention (:func:`dense_chunk_pallas`) is the document-local kernel without a window,
offset ``start``, over the whole cache.

The caches are [B,G,S,D] (``nsa_jax.nsa.decoding``'s layout) and the kernels read [B,S,G,D]: each
chunk transposes a layer's caches once (a read and a write of them, against the chunk's reads of
them in the kernels).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas.cmp_grouped import cmp_chunk_grouped
from nsa_jax.pallas.common import (BlockSizes, choices_or_default, cudnn_applies, pad_dim,
                                   padded_dims, require_cudnn, use_interpret)
from nsa_jax.pallas.compressed import cmp_forward
from nsa_jax.pallas.local import local_forward
from nsa_jax.pallas.nsa import block_forward
from nsa_jax.pallas.scoring import cmp_block_scores
from nsa_jax.pallas.selection_block import sel_forward_block
from nsa_jax.pallas.selection_query import sel_forward
from nsa_jax.pallas.topn import topn_upto


def offset_layout(B: int, C: int, start, Tc: int, d: int) -> semantics.SegmentLayout:
    """The packed-rows layout that puts query i of every row at position start + i of one
    document from token 0 (its compressed blocks in slots 0..Tc-1)."""
    start = jnp.asarray(start, jnp.int32)
    rel = jnp.broadcast_to(start + jnp.arange(C, dtype=jnp.int32), (B, C))
    return semantics.SegmentLayout(
        start=jnp.broadcast_to(-start, (B, C)).astype(jnp.int32), rel=rel,
        cmp_lo=jnp.zeros((B, C), jnp.int32),
        cmp_src=jnp.broadcast_to(jnp.arange(Tc, dtype=jnp.int32) * d, (B, Tc)),
        cmp_ok=jnp.ones((B, Tc), bool))


def _keys(x, D: int):
    """A cache [B,G,S,D'] -> the kernels' [B,S,G,D] (head dim zero-padded to D)."""
    return pad_dim(jnp.swapaxes(x, 1, 2), D)


def chunk_cmp_attn(ch: KernelChoices, q, v_cmp, cache_len: int, interpret: bool) -> str:
    """``KernelChoices.cmp_attn`` for a continuation chunk over a cache of ``cache_len`` tokens:
    "auto" -> "cudnn" where cuDNN applies and cache_len > ``cmp_pallas_max_t``, else "pallas";
    an explicit "cudnn" that cannot run is one error naming the key."""
    c = ch.cmp_attn
    if c == "auto":
        ok = cudnn_applies(q, v_cmp, interpret)
        return "cudnn" if ok and cache_len > ch.cmp_pallas_max_t else "pallas"
    if c == "cudnn":
        require_cudnn("cmp_attn", q, v_cmp, interpret, "'pallas' or 'xla'")
    return c


def nsa_chunk_pallas(q, lc: dict, span, t, gates, cfg: NSAConfig,
                     choices: KernelChoices | None = None,
                     block_sizes: BlockSizes | None = None):
    """:func:`nsa_jax.nsa.chunked.nsa_chunk_attention` (same arguments: q [B,C,Hq,Dk] at
    positions t [C] = start + 0..C-1, start a multiple of l' and >= l) on the Pallas kernels
    (module docstring). -> [B,C,Hq,Dv] in q.dtype."""
    B, C, Hq, Dk = q.shape
    G = next(lc[k] for k in ("k_cmp", "k_slc", "k_win") if k in lc).shape[1]
    bs = block_sizes or BlockSizes.for_shape(Hq // G, Dk, jnp.dtype(q.dtype).itemsize)
    return _chunk_once(q, lc, span, t, gates, cfg, choices_or_default(choices), bs,
                       use_interpret())


def _chunk(q, lc: dict, span, t, gates, cfg: NSAConfig, ch: KernelChoices, bs: BlockSizes,
           interpret: bool):
    """:func:`nsa_chunk_pallas`'s body (its statics resolved)."""
    B, C, Hq, Dk = q.shape
    br = cfg.branches
    G = next(lc[k] for k in ("k_cmp", "k_slc", "k_win") if k in lc).shape[1]
    Dv = next(lc[k] for k in ("v_slc", "v_cmp", "v_win") if k in lc).shape[-1]
    Dkp, Dvp = padded_dims(Dk, Dv)
    scale = 1.0 / math.sqrt(Dk)
    start = jnp.asarray(t, jnp.int32)[0]
    qp = pad_dim(q, Dkp)
    o_cmp = o_slc = o_win = None
    if "cmp" in br or "slc" in br:
        kc = _keys(lc["k_cmp"], Dkp)
        lay = offset_layout(B, C, start, kc.shape[1], cfg.stride_d)
        cmp_attn = "pallas"
        if "cmp" in br:
            cmp_attn = chunk_cmp_attn(ch, q, lc["v_cmp"], kc.shape[1] * cfg.stride_d, interpret)
        if cmp_attn != "pallas":
            # kc: the scores' transposed keys, its head dim cut back to q's (a no-op at Dk = Dkp)
            o_c, lse_c = cmp_chunk_grouped(q, kc[..., :Dk], jnp.swapaxes(lc["v_cmp"], 1, 2),
                                           start, cfg, cmp_attn, ch.cmp_grouping)
        else:
            vc = _keys(lc["v_cmp"], Dvp) if "cmp" in br else None
            o_c, lse_c = cmp_forward(qp, kc, vc, cfg, bs, scale, interpret, choices=ch, seg=lay)
        if "cmp" in br:
            o_cmp = o_c[..., :Dv]
    if "slc" in br:
        ks, vs = _keys(lc["k_slc"], Dkp), _keys(lc["v_slc"], Dvp)
        Ts = ks.shape[1] // cfg.sel_block
        scores = cmp_block_scores(qp, kc, lse_c, cfg, bs, scale, interpret, choices=ch, seg=lay,
                                  Ts=Ts)
        ids = topn_upto(scores, cfg, interpret, lay.rel, start + (C - 1),
                        cfg.sel_block + C - 1, bs)
        fwd = sel_forward_block if block_forward(ch, Hq // G, q.dtype) else sel_forward
        o_s, _ = fwd(qp, ks, vs, ids, cfg, bs, scale, interpret, choices=ch, offset=start)
        o_slc = o_s[..., :Dv]
    if "win" in br:
        k_w, v_w, _ = span
        W = k_w.shape[2] - C
        first = jnp.broadcast_to(jnp.maximum(W - start, 0), (B, C)).astype(jnp.int32)
        o_w, _ = local_forward(qp, _keys(k_w, Dkp), _keys(v_w, Dvp), first, cfg.window, bs,
                               scale, interpret, choices=ch, offset=jnp.int32(W))
        o_win = o_w[..., :Dv]
    return semantics.combine(o_cmp, o_slc, o_win, gates, cfg, q.dtype)


# a jitted function of its own, as the training op (``pallas.nsa._nsa_once``): the layers of a
# chunk's call trace it, and lower its kernels, once
_chunk_once = jax.jit(_chunk, static_argnums=(5, 6, 7, 8))


def dense_chunk_pallas(q, k, v, t, choices: KernelChoices | None = None,
                       block_sizes: BlockSizes | None = None):
    """:func:`nsa_jax.nsa.chunked.dense_chunk_attention` (q [B,C,Hq,D] at positions t [C] =
    start + 0..C-1 over caches k, v [B,G,S,D] holding tokens 0..t) on the document-local
    kernel with a query offset. -> [B,C,Hq,D] in q.dtype."""
    B, C, Hq, Dk = q.shape
    G, Dv = k.shape[1], v.shape[-1]
    Dkp, Dvp = padded_dims(Dk, Dv)
    bs = block_sizes or BlockSizes.for_shape(Hq // G, max(Dk, Dv), jnp.dtype(q.dtype).itemsize)
    o, _ = local_forward(pad_dim(q, Dkp), _keys(k, Dkp), _keys(v, Dvp),
                         jnp.zeros((B, C), jnp.int32), None, bs, 1.0 / math.sqrt(Dk),
                         use_interpret(), choices=choices_or_default(choices),
                         offset=jnp.asarray(t, jnp.int32)[0])
    return o[..., :Dv].astype(q.dtype)
