"""Sliding-window branch (NSA §3.3.3): keys t - w < s <= t.

On a GPU with bf16/fp16 inputs this is cuDNN's fused attention with a local window
(``jax.nn.dot_product_attention(is_causal=True, local_window_size=(w - 1, 0),
implementation="cudnn")``), which skips the tiles outside the band in forward and backward.
Elsewhere (CPU, float32) it is the reference's masked attention.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import reference
from nsa_jax.nsa.config import NSAConfig

_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def uses_cudnn(q, v, interpret: bool) -> bool:
    return (not interpret) and jnp.dtype(q.dtype) in _CUDNN_DTYPES and q.shape[-1] <= 128 \
        and q.shape[-1] % 8 == 0 and v.shape[-1] == q.shape[-1]


def window_attention(q, k, v, cfg: NSAConfig, interpret: bool):
    """q [B,T,Hq,D], k/v [B,T,G,D] -> o float32 [B,T,Hq,Dv]."""
    if uses_cudnn(q, v, interpret):
        T = q.shape[1]
        k, v = k.astype(q.dtype), v.astype(q.dtype)
        if T % 2:
            # cuDNN's masked (local-window) path rejects odd sequence lengths ("Unsupported
            # sequence length", seen on an H200 with a 3-token prompt). Attention is causal, so
            # one padding token at the end changes no earlier output.
            pad = ((0, 0), (0, 1), (0, 0), (0, 0))
            q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
        o = jax.nn.dot_product_attention(
            q, k, v, is_causal=True, scale=1.0 / math.sqrt(q.shape[-1]),
            local_window_size=(cfg.window - 1, 0), implementation="cudnn")
        return o[:, :T].astype(jnp.float32)
    return reference.window_attention(q, k, v, cfg)
