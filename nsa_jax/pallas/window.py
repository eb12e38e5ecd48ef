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
        and v.shape[-1] == q.shape[-1]


def window_attention(q, k, v, cfg: NSAConfig, interpret: bool):
    """q [B,T,Hq,D], k/v [B,T,G,D] -> o float32 [B,T,Hq,Dv]."""
    if uses_cudnn(q, v, interpret):
        o = jax.nn.dot_product_attention(
            q, k.astype(q.dtype), v.astype(q.dtype), is_causal=True,
            scale=1.0 / math.sqrt(q.shape[-1]),
            local_window_size=(cfg.window - 1, 0), implementation="cudnn")
        return o.astype(jnp.float32)
    return reference.window_attention(q, k, v, cfg)
