"""Sliding-window branch (NSA §3.3.3): keys t - w < s <= t.

On a GPU with bf16/fp16 inputs this is cuDNN's fused attention with a local window
(``jax.nn.dot_product_attention(is_causal=True, local_window_size=(w - 1, 0),
implementation="cudnn")``), which skips the tiles outside the band in forward and backward.
Elsewhere (CPU, float32) it is masked attention in XLA over ``semantics.window_visible``, with
its matmuls at the precision ``KernelChoices.f32_dot`` names (IEEE by default, so float32 runs
on a GPU do not silently drop to tf32).

Packed documents (``seg``, a ``semantics.SegmentLayout``): keys also satisfy s >= start(t).
On the cuDNN path that is cuDNN's packed (THD) layout, one segment per document
(``semantics.packed_segments``), with its sliding window (``sliding_window_length`` = w: keys
t - w < s <= t) and causal mask inside each segment; no [T, T] mask. The XLA path adds
``s >= start`` to its mask.
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


def _masked_window(q, k, v, cfg: NSAConfig, precision, start=None):
    """Masked softmax attention over the window (float32), O(T^2) memory; ``start`` [B,T]:
    packed rows' document starts."""
    B, T, Hq, Dk = q.shape
    G = k.shape[2]
    qg = q.reshape(B, T, G, Hq // G, Dk).astype(jnp.float32)
    s = jnp.einsum("btghd,bsgd->btghs", qg, k.astype(jnp.float32),
                   precision=precision) * (1.0 / math.sqrt(Dk))
    t = jnp.arange(T)
    if start is None:
        vis = semantics.window_visible(t[:, None], t[None, :], cfg.window)[None, :, None, None, :]
    else:
        vis = semantics.window_visible(t[None, :, None], t[None, None, :], cfg.window,
                                       start[:, :, None])[:, :, None, None, :]
    p = semantics.masked_softmax(s, vis)
    o = jnp.einsum("btghs,bsgd->btghd", p, v.astype(jnp.float32), precision=precision)
    return o.reshape(B, T, Hq, v.shape[-1])


def _cudnn_packed_window(q, k, v, cfg: NSAConfig, seg):
    """cuDNN fused attention over the packed (THD) layout with a sliding window of w."""
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as cudnn_attn
    lengths, offsets = semantics.packed_segments(seg.rel)
    return cudnn_attn(q, k.astype(q.dtype), v.astype(q.dtype), q_seqlen=lengths,
                      kv_seqlen=lengths, q_offsets=offsets, kv_offsets=offsets,
                      scale=1.0 / math.sqrt(q.shape[-1]), mask_type=MaskType.PADDING_CAUSAL,
                      sliding_window_length=cfg.window).astype(jnp.float32)


def window_attention(q, k, v, cfg: NSAConfig, interpret: bool, *,
                     choices: KernelChoices | None = None, seg=None):
    """q [B,T,Hq,D], k/v [B,T,G,D] -> o float32 [B,T,Hq,Dv]; ``seg``: packed rows' layout."""
    if seg is not None:
        if uses_cudnn(q, v, interpret):
            return _cudnn_packed_window(q, k, v, cfg, seg)
        return _masked_window(q, k, v, cfg, xla_precision(choices), seg.start)
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
