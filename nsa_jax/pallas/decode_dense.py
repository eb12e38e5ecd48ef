"""Dense causal attention of one new token per batch row over its KV cache, flash-decoding in
Pallas: the dense model's decode attention on the Pallas decode path, so that the NSA / dense
comparison gives dense the same treatment as NSA (issue 14).

The kernel twin of :func:`nsa_jax.nsa.decoding.dense_decode_attention`. It is the NSA decode
step's compressed-attention kernel with the visibility rule of the keys themselves (every key
up to t; ``decode._cmp_kernel`` with l = d = 1, no logits kept) and its finishing merge with
unit gates: programs over (row, KV group, key split), each with all h query heads of the group,
so each K/V tile is read once per group, writing partial softmax states that the finishing
kernel merges. In XLA the same attention was two GEMM fusions and three softmax fusions per layer,
reading the cache at about half the HBM bandwidth (bench/NOTES.md, twenty-seventh session).
"""
from __future__ import annotations

import math
import numbers

import jax.numpy as jnp

from nsa_jax.pallas.common import MIN_DOT, cdiv, next_pow2, use_interpret
from nsa_jax.pallas.decode import _cmp_call, _finish_call, _pad_last

KEYS = 64              # keys per tile
PROGRAMS = 2048        # (row, group, split) programs to aim for
MAX_SPLITS = 256       # splits per (row, group) at most (the finishing merge loads them at once)
MERGE_ELEMS = 16384    # ... and at most this many partial outputs (splits x Dv) per merged head


def dense_splits(B: int, G: int, S: int, bk: int = KEYS, dv: int = 64) -> int:
    """Key splits per (row, group) for a cache of S slots: about PROGRAMS programs in all, at
    most MAX_SPLITS (and MERGE_ELEMS / dv: the finishing kernel loads splits x dv partial outputs
    per head at once; 256 at the measured dv = 64) and one tile each at least. A split walks only
    the visible tiles (``decode._cmp_kernel`` divides the tiles up to t among the splits)."""
    cap = min(MAX_SPLITS, max(1, MERGE_ELEMS // dv))
    return int(max(1, min(cdiv(S, bk), cdiv(PROGRAMS, B * G), cap)))


def dense_decode_pallas(q, k, v, t, *, keys: int = KEYS, splits: int | None = None):
    """q [B,Hq,Dk] at positions t [B] over caches k [B,G,S,Dk], v [B,G,S,Dv] (slots 0..t[b]
    written) -> [B,Hq,Dv] in q's dtype. ``keys`` per tile (a power of two >= 16), ``splits``
    per (row, group) (an int in 1..MAX_SPLITS; default :func:`dense_splits`). Head dims that are
    not a power of two >= 16 are zero-padded (a copy of the caches: fine for tests, slow for real
    models)."""
    if q.ndim != 3 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"dense_decode_pallas: q [B,Hq,Dk], k [B,G,S,Dk] and v [B,G,S,Dv]; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}")
    B, Hq, Dk = q.shape
    G, S, Dv = k.shape[1], k.shape[2], v.shape[-1]
    if keys < MIN_DOT or keys & (keys - 1):
        raise ValueError(f"dense_decode_pallas: keys must be a power of two >= {MIN_DOT}, "
                         f"got {keys}")
    if splits is not None and (not isinstance(splits, numbers.Integral) or isinstance(splits, bool)
                               or not 1 <= splits <= MAX_SPLITS):
        raise ValueError(f"dense_decode_pallas: splits must be an int in 1..{MAX_SPLITS} (or "
                         f"None), got {splits!r}")
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or Hq % G or k.shape[-1] != Dk:
        raise ValueError(f"dense_decode_pallas: q [B,Hq,Dk] with Hq a multiple of G, k [B,G,S,Dk] "
                         f"and v [B,G,S,Dv]; got q {q.shape}, k {k.shape}, v {v.shape}")
    h = Hq // G
    Dkp, Dvp = max(MIN_DOT, next_pow2(Dk)), max(MIN_DOT, next_pow2(Dv))
    k, v = _pad_last(k, Dkp), _pad_last(v, Dvp)
    t = jnp.broadcast_to(jnp.asarray(t, jnp.int32), (B,))
    interpret = use_interpret()
    qg = _pad_last(q.reshape(B, G, h, Dk).astype(k.dtype), Dkp)
    ns = splits or dense_splits(B, G, S, keys, Dvp)
    parts = _cmp_call(t, qg, k, v, None, ns, keys, 1.0 / math.sqrt(Dk), interpret,
                      block=(1, 1), logits=False, name="nsa_decode_dense")
    ones = jnp.ones((B, Hq, 3), jnp.float32)
    o = _finish_call(ones, parts, None, 0, ("cmp",), q.dtype, interpret, B, G, h)
    return o[..., :Dv].reshape(B, Hq, Dv)
