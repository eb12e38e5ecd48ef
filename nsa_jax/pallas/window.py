"""Sliding-window branch (NSA §3.3.3): keys t - w < s <= t.

On a GPU with bf16/fp16 inputs this is cuDNN's fused attention with a local window
(``jax.nn.dot_product_attention(is_causal=True, local_window_size=(w - 1, 0),
implementation="cudnn")``), which skips the tiles outside the band in forward and backward.
Elsewhere (CPU, float32) it is masked attention in XLA over ``semantics.window_visible``, with
its matmuls at the precision ``KernelChoices.f32_dot`` names (IEEE by default, so float32 runs
on a GPU do not silently drop to tf32).

Packed documents (``seg``, a ``semantics.SegmentLayout``): keys also satisfy s >= start(t).
On every device this is banded attention in XLA (``_banded_window``): queries in chunks of
C >= w, each against the 2C keys that can hold its window, masked by ``window_visible`` with the
document start: O(T * 2C) memory, no [T, T] mask. (cuDNN's packed THD layout was tried first: on
an H200 with jax 0.11.2 it matched at T = 2048 but asked for 390 GB at T = 8192.)
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas.common import choices_or_default

_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def uses_cudnn(q, v, interpret: bool) -> bool:
    return (not interpret) and jnp.dtype(q.dtype) in _CUDNN_DTYPES and q.shape[-1] <= 128 \
        and q.shape[-1] % 8 == 0 and v.shape[-1] == q.shape[-1]


def xla_precision(choices: KernelChoices | None):
    """XLA matmul precision of the window branch's float32 einsums by ``choices.f32_dot``."""
    return lax.Precision.DEFAULT if choices_or_default(choices).f32_dot == "tf32" \
        else lax.Precision.HIGHEST


def _masked_window(q, k, v, cfg: NSAConfig, precision):
    """Masked softmax attention over the window (float32), O(T^2) memory (CPU, float32)."""
    B, T, Hq, Dk = q.shape
    G = k.shape[2]
    qg = q.reshape(B, T, G, Hq // G, Dk).astype(jnp.float32)
    s = jnp.einsum("btghd,bsgd->btghs", qg, k.astype(jnp.float32),
                   precision=precision) * (1.0 / math.sqrt(Dk))
    t = jnp.arange(T)
    vis = semantics.window_visible(t[:, None], t[None, :], cfg.window)[None, :, None, None, :]
    p = semantics.masked_softmax(s, vis)
    o = jnp.einsum("btghs,bsgd->btghd", p, v.astype(jnp.float32), precision=precision)
    return o.reshape(B, T, Hq, v.shape[-1])


def _banded_window(q, k, v, cfg: NSAConfig, precision, start):
    """Window attention of packed rows in query chunks of C = next_pow2(w) >= w: chunk c's
    queries [cC, (c+1)C) can only see keys in [cC - C, (c+1)C), so each chunk attends those 2C
    keys under ``window_visible`` with the document starts ``start`` [B,T]. float32 softmax."""
    B, T, Hq, Dk = q.shape
    G = k.shape[2]
    C = 1 << max(0, (cfg.window - 1).bit_length())
    n = -(-T // C)
    pad = n * C - T

    def blocks(x, front):
        x = jnp.pad(x, ((0, 0), (front, pad), (0, 0), (0, 0)))
        return x.reshape(B, x.shape[1] // C, C, *x.shape[2:])

    kb, vb = blocks(k, C), blocks(v, C)                        # [B, n+1, C, G, D]
    kk = jnp.concatenate([kb[:, :-1], kb[:, 1:]], axis=2)        # [B, n, 2C, G, D]
    vv = jnp.concatenate([vb[:, :-1], vb[:, 1:]], axis=2)
    qb = blocks(q, 0).reshape(B, n, C, G, Hq // G, Dk)
    s = jnp.einsum("bncghd,bnsgd->bncghs", qb.astype(jnp.float32), kk.astype(jnp.float32),
                   precision=precision) * (1.0 / math.sqrt(Dk))
    t = (jnp.arange(n)[:, None] * C + jnp.arange(C)[None, :])          # [n, C] query positions
    sk = (jnp.arange(n)[:, None] * C - C + jnp.arange(2 * C)[None, :])  # [n, 2C] key positions
    st = jnp.pad(start, ((0, 0), (0, pad))).reshape(B, n, C)
    vis = semantics.window_visible(t[None, :, :, None], sk[None, :, None, :], cfg.window,
                                   st[..., None]) & (sk >= 0)[None, :, None, :]
    p = semantics.masked_softmax(s, vis[:, :, :, None, None, :])
    o = jnp.einsum("bncghs,bnsgd->bncghd", p, vv.astype(jnp.float32), precision=precision)
    return o.reshape(B, n * C, Hq, v.shape[-1])[:, :T]


def window_attention(q, k, v, cfg: NSAConfig, interpret: bool, *,
                     choices: KernelChoices | None = None, seg=None):
    """q [B,T,Hq,D], k/v [B,T,G,D] -> o float32 [B,T,Hq,Dv]; ``seg``: packed rows' layout."""
    if seg is not None:
        return _banded_window(q, k, v, cfg, xla_precision(choices), seg.start)
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
    return _masked_window(q, k, v, cfg, xla_precision(choices))
