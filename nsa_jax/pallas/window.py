"""Sliding-window branch (NSA §3.3.3): keys t - w < s <= t.

On a GPU with bf16/fp16 inputs this is cuDNN's fused attention with a local window
(``jax.nn.dot_product_attention(is_causal=True, local_window_size=(w - 1, 0),
implementation="cudnn")``), which skips the tiles outside the band in forward and backward.
Other inputs on a GPU (float32) run the document-local Pallas kernel (``local.py``) with the
window, its float32 dots at the precision ``KernelChoices.f32_dot`` names (IEEE by default, so
float32 runs do not silently drop to tf32). On the CPU it is masked attention in XLA over
``semantics.window_visible`` (O(T^2) memory; CPU shapes are small). ``KernelChoices.win_attn``
picks explicitly: "pallas" runs the document-local kernel for unpacked bf16 rows too (and in
interpret mode on the CPU); measured slower than cuDNN at the 125M shape at 2k-64k on an H100
(bench/NOTES.md, twenty-fifth session), so "auto" keeps cuDNN. "mosaic" runs the tiled Mosaic
GPU kernels on the window's block lists (``mosaic_window.py``; Hopper, bf16/fp16, head dims 64 /
128, even h, T and w multiples of 64).

Packed documents (``seg``, a ``semantics.SegmentLayout``): keys also satisfy s >= start(t).
On every device this is the document-local kernel with the window (interpret mode on the CPU):
O(T) memory, work O(T * (w + tile)). Replaced here: banded attention in XLA (float32 logits
[B, T/C, C, G, h, 2C], C = 512), whose fwd+bwd made packed NSA 0.41x / 0.62x of unpacked at
8k / 64k on an H200; cuDNN's packed THD layout (on an H200 with jax 0.11.2 it matched at
T = 2048 but asked for 390 GB at T = 8192).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas.common import (BlockSizes, choices_or_default, cudnn_applies,
                                   require_cudnn)
from nsa_jax.pallas.local import local_attention
from nsa_jax.pallas.mosaic_window import window_attention_mosaic, window_unsupported

def xla_precision(choices: KernelChoices | None):
    """XLA matmul precision of the window branch's float32 einsums by ``choices.f32_dot``."""
    return lax.Precision.DEFAULT if choices_or_default(choices).f32_dot == "tf32" \
        else lax.Precision.HIGHEST


def _masked_window(q, k, v, cfg: NSAConfig, precision):
    """Masked softmax attention over the window (float32), O(T^2) memory (CPU)."""
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


def window_attention(q, k, v, cfg: NSAConfig, interpret: bool, *,
                     choices: KernelChoices | None = None, seg=None,
                     block_sizes: BlockSizes | None = None):
    """q [B,T,Hq,D], k/v [B,T,G,D] -> o float32 [B,T,Hq,Dv]; ``seg``: packed rows' layout;
    ``block_sizes``: tiles of the document-local kernel (None = by shape). Unpacked rows go by
    ``choices.win_attn`` (an explicit "cudnn" that cannot run is one error naming the key)."""
    if seg is not None:
        return local_attention(q, k, v, seg.start, cfg.window, block_sizes,
                               interpret=interpret, choices=choices)
    impl = choices_or_default(choices).win_attn
    if impl == "mosaic":
        why = window_unsupported(q, k, v, cfg.window, interpret)
        if why is not None:
            raise ValueError(f"kernel.win_attn: 'mosaic' cannot run here: {why}; use 'cudnn', "
                             f"'pallas' or 'auto'")
        return window_attention_mosaic(q, k.astype(q.dtype), v.astype(q.dtype),
                                       cfg.window).astype(jnp.float32)
    if impl == "cudnn":
        require_cudnn("win_attn", q, v, interpret, "'pallas' or 'auto'")
    ok = cudnn_applies(q, v, interpret)
    if impl == "pallas" or (impl == "auto" and not ok and not interpret):
        return local_attention(q, k, v, None, cfg.window, block_sizes, interpret=interpret,
                               choices=choices)
    if ok:
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
