"""Next-token cross-entropy through the LM head, in chunks, with its gradient formed in one pass.

``chunked_cross_entropy(h, w_out, targets, chunk, loss_mask)`` returns the masked sum of
CE(softmax(h @ w_out), targets) and the mask's sum, without materialising the [B, T, V] logits:
the sequence is cut into chunks of ``chunk`` tokens and a ``lax.scan`` holds one chunk of logits at
a time.

Differentiated, it is a fused linear cross-entropy (a custom VJP). The loss is linear in its
cotangent g, so the forward pass of each chunk forms the logits once (``h.dtype`` x ``h.dtype`` ->
float32), their log-sum-exp and CE, and the gradient for g = 1:

    dlogits = (softmax(logits) - onehot(target)) * mask   (float32, then cast to h.dtype)
    dh      = dlogits @ w_out^T                            (h.dtype operands, f32 accumulation)
    dW     += h^T @ dlogits                                (summed over chunks in float32)

and the backward only scales dh and dW by g. That is three GEMMs per chunk where autodiff of a
rematerialised scan takes four, and the gradient GEMMs take operands in the compute dtype: with
bfloat16 activations they multiply a bf16 dlogits, as torch autocast and fused linear-CE kernels
do, rather than a float32 (tf32) one. With float32 activations every step stays float32. The
weight is cast to the compute dtype once, outside the scan. Without differentiation (eval) only
the logits and the CE are computed. Being a custom VJP, the loss has reverse-mode derivatives only
(``jax.grad``, not ``jax.jvp`` / ``jax.jacfwd``), and only into ``h`` and ``w_out``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _chunk_ce(hc, wc, tc):
    """[B, c, D] x [D, V] -> (float32 logits [B, c, V], log-sum-exp [B, c], CE [B, c])."""
    logits = jnp.einsum("bcd,dv->bcv", hc, wc, preferred_element_type=jnp.float32)
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
    lse = m + jnp.log(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1))
    tgt = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
    return logits, lse, lse - tgt


def _ce_sum(hs, w, ts, ms):
    """sum over chunks of sum(CE * mask). hs [n, B, c, D], ts [n, B, c], ms [n, B, c]."""
    wc = w.astype(hs.dtype)

    def body(tot, x):
        hc, tc, mc = x
        return tot + jnp.sum(_chunk_ce(hc, wc, tc)[2] * mc), None

    return jax.lax.scan(body, jnp.zeros((), jnp.float32), (hs, ts, ms))[0]


_fused_ce = jax.custom_vjp(_ce_sum)


def _fused_ce_fwd(hs, w, ts, ms):
    wc = w.astype(hs.dtype)
    D, V = w.shape

    def body(carry, x):
        tot, dw = carry
        hc, tc, mc = x
        logits, lse, ce = _chunk_ce(hc, wc, tc)
        # the column take_along_axis scored (a negative id wraps, as in the CE above)
        onehot = jnp.arange(V, dtype=tc.dtype) == jnp.where(tc < 0, tc + V, tc)[..., None]
        dlog = ((jnp.exp(logits - lse[..., None]) - onehot) * mc[..., None]).astype(hs.dtype)
        dh = jnp.einsum("bcv,dv->bcd", dlog, wc, preferred_element_type=jnp.float32)
        dw = dw + jnp.einsum("bcd,bcv->dv", hc, dlog, preferred_element_type=jnp.float32)
        return (tot + jnp.sum(ce * mc), dw), dh.astype(hs.dtype)

    (tot, dw), dhs = jax.lax.scan(body, (jnp.zeros((), jnp.float32),
                                         jnp.zeros((D, V), jnp.float32)), (hs, ts, ms))
    return tot, (dhs, dw.astype(w.dtype), ts, ms)


def _fused_ce_bwd(res, g):
    dhs, dw, ts, ms = res
    return ((dhs * g).astype(dhs.dtype), (dw * g).astype(dw.dtype),
            np.zeros(ts.shape, jax.dtypes.float0), jnp.zeros_like(ms))


_fused_ce.defvjp(_fused_ce_fwd, _fused_ce_bwd)


def chunked_cross_entropy(h, w_out, targets, chunk: int, loss_mask=None):
    """Sum and count of next-token cross-entropy without materialising [B,T,V] logits.

    h [B,T,D] final hidden states, w_out [D,V] the LM head, targets [B,T] int, loss_mask [B,T]
    (None: every target counts). Returns (sum of CE * mask, sum of mask), both float32. The
    gradient flows to ``h`` and ``w_out`` only (module docstring: one fused pass per chunk)."""
    B, T, D = h.shape
    n = -(-T // chunk)
    pad = n * chunk - T
    mask = jnp.ones((B, T), jnp.float32) if loss_mask is None else loss_mask.astype(jnp.float32)
    mask = jax.lax.stop_gradient(mask)
    if pad:
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        mask = jnp.pad(mask, ((0, 0), (0, pad)))
    hs = h.reshape(B, n, chunk, D).swapaxes(0, 1)
    ts = targets.astype(jnp.int32).reshape(B, n, chunk).swapaxes(0, 1)
    ms = mask.reshape(B, n, chunk).swapaxes(0, 1)
    return _fused_ce(hs, w_out, ts, ms), jnp.sum(mask)
