"""Token compression φ (Eq. 7): one key (or value) per block of l tokens, stride d.

Compressed block i covers tokens [i*d, i*d + l), i = 0 .. Tc-1 with Tc = max(0, floor((T-l)/d) + 1).
φ is an MLP over the flattened block of l keys plus a learned intra-block position embedding
(l x D):  φ(x_i) = W2 · act(W1 · flatten(x_{i*d : i*d+l} + E_pos) + b1) + b2.

Since l is a multiple of d, a block is r = l/d consecutive stride-chunks. W1 acts linearly, so it
is applied chunk by chunk (no [B,Tc,l,G,D] gather is materialised) and W1·E_pos folds into the bias.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from nsa_jax.nsa.config import NSAConfig


def compress(x: jax.Array, pos_emb: jax.Array, w1: jax.Array, b1: jax.Array, w2: jax.Array,
             b2: jax.Array, cfg: NSAConfig, act=jax.nn.silu, src=None) -> jax.Array:
    """x [B,T,G,D] -> [B,Tc,G,Dout].

    pos_emb [l,D]; w1 [l*D, H] (flattened block row-major: token-major, then feature); b1 [H];
    w2 [H, Dout]; b2 [Dout]. Computes in x.dtype.

    ``src`` int32 [B,Tc] (packed documents: ``semantics.segment_layout(...).cmp_src``): slot c
    compresses tokens [src[c], src[c] + l) instead of [c*d, c*d + l); each of the r = l/d
    stride chunks is then one gather of Tc*d rows.
    """
    B, T, G, D = x.shape
    l, d = cfg.block_l, cfg.stride_d
    Tc = cfg.num_cmp_blocks(T)
    dt = x.dtype
    if Tc == 0:
        return jnp.zeros((B, 0, G, w2.shape[-1]), dt)
    r = l // d
    H = w1.shape[-1]
    w1r = w1.reshape(l, D, H).astype(dt)
    bias = b1.astype(jnp.float32) + jnp.einsum("lD,lDH->H", pos_emb.astype(jnp.float32),
                                               w1.reshape(l, D, H).astype(jnp.float32))
    if src is None:
        n_chunks = Tc - 1 + r
        chunks = x[:, : n_chunks * d].reshape(B, n_chunks, d, G, D)
        chunk = lambda m: chunks[:, m:m + Tc]
    else:
        def chunk(m):  # [B,Tc,d,G,D]: tokens src + m*d + e, e < d
            i = (jnp.asarray(src)[:, :, None] + m * d + jnp.arange(d)).reshape(B, Tc * d)
            i = jnp.minimum(i, T - 1)[:, :, None, None]
            return jnp.take_along_axis(x, i, axis=1).reshape(B, Tc, d, G, D)
    h = bias.astype(dt)
    for m in range(r):
        h = h + jnp.einsum("bcegD,eDH->bcgH", chunk(m), w1r[m * d:(m + 1) * d])
    h = act(h)
    return jnp.einsum("bcgH,HO->bcgO", h, w2.astype(dt)) + b2.astype(dt)


def compress_block(x: jax.Array, pos_emb: jax.Array, w1: jax.Array, b1: jax.Array, w2: jax.Array,
                   b2: jax.Array, act=jax.nn.silu) -> jax.Array:
    """φ of one block per batch row (Eq. 7 as written): x [B,G,l,D] (group-major, the caches'
    layout) -> [B,1,G,Dout].

    The decoder's form: one [B*G, l*D] @ [l*D, H] matmul, nothing precomputed per step. The
    position embedding is added in float32, then the block is rounded to x.dtype; equal to
    :func:`compress` on the same block (token-major there) up to float rounding."""
    B, G, l, D = x.shape
    dt = x.dtype
    blk = (x.astype(jnp.float32) + pos_emb.astype(jnp.float32)[None, None]).astype(dt)
    flat = blk.reshape(B, G, l * D)
    h = act(jnp.einsum("bgk,kh->bgh", flat, w1.astype(dt)) + b1.astype(dt))
    out = jnp.einsum("bgh,ho->bgo", h, w2.astype(dt)) + b2.astype(dt)
    return out[:, None]


def compress_naive(x, pos_emb, w1, b1, w2, b2, cfg: NSAConfig, act=jax.nn.silu):
    """Literal Eq. 7 (gather each block, flatten, MLP). Used by the tests as a cross-check."""
    B, T, G, D = x.shape
    Tc = cfg.num_cmp_blocks(T)
    blocks = jnp.stack([x[:, i * cfg.stride_d: i * cfg.stride_d + cfg.block_l] for i in range(Tc)],
                       axis=1)  # [B,Tc,l,G,D]
    blocks = blocks + pos_emb[None, None, :, None, :]
    flat = jnp.moveaxis(blocks, 3, 2).reshape(B, Tc, G, cfg.block_l * D)
    return act(flat @ w1 + b1) @ w2 + b2
