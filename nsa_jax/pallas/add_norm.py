"""The decode step's residual add and the RMSNorm after it as one Pallas kernel.

In a decode step (one token per batch row) every residual add and every RMSNorm is a few
kilobytes of work, and XLA runs each norm as two kernels (the sum of squares, then the scaled
convert) beside the add's kernel: three launches of ~1.3-1.6 us each, twice per layer
(bench/NOTES.md, nineteenth session). :func:`add_rms_norm` does both in one: s = x + a (rounded
to x's dtype, as the model's ``x + a``), then ``flax.nnx.RMSNorm`` of s (statistics and scale in
float32: y = s * (rsqrt(mean(s^2) + eps) * scale), rounded to the norm's dtype). Each program
holds whole rows (the model dim padded to a power of two), so the row's sum needs no second pass.

:func:`add_rms_norm_reference` is the jax.numpy twin with the same roundings. Inference only: no
VJP (a decode step is never differentiated).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.pallas.common import cdiv, compiler_params, load, next_pow2, store, use_interpret

ROWS = 8          # rows per program


def _kernel(x_ref, a_ref, s_ref, xo_ref, ho_ref, *, bm, bd, eps, has_a):
    i = pl.program_id(0)
    M, D = x_ref.shape
    r = i * bm + jnp.arange(bm)
    c = jnp.arange(bd)
    ok = (r < M)[:, None] & (c < D)[None, :]
    rows, cols = pl.ds(i * bm, bm), pl.ds(0, bd)
    x = load(x_ref.at[rows, cols], ok, 0.0)
    if has_a:   # the model's x + a: float32 sum rounded to x's dtype
        x = (x.astype(jnp.float32) + load(a_ref.at[rows, cols], ok, 0.0).astype(jnp.float32))
        x = x.astype(xo_ref.dtype)
    xf = x.astype(jnp.float32)
    inv = lax.rsqrt(jnp.sum(xf * xf, axis=1) / D + eps)
    sc = load(s_ref.at[cols], c < D, 0.0).astype(jnp.float32)
    h = xf * (inv[:, None] * sc[None, :])
    ro = jnp.where(r < M, r, M)[:, None]            # masked rows -> out of bounds (dropped)
    co = jnp.where(c < D, c, D)[None, :]
    if has_a:
        store(xo_ref.at[ro, co], x, ok)
    store(ho_ref.at[ro, co], h, ok)


def add_rms_norm(x, a, scale, *, eps: float, dtype, rows: int = ROWS):
    """x [M, D] (the residual stream), a [M, D] or None, scale [D] (the norm's weight) ->
    (s = x + a in x's dtype, or x itself when a is None; RMSNorm(s) in ``dtype``)."""
    M, D = x.shape
    if scale.shape != (D,) or (a is not None and a.shape != x.shape):
        raise ValueError(f"add_rms_norm: x [M, D={D}], a [M, D], scale [D]; got a "
                         f"{None if a is None else a.shape}, scale {scale.shape}")
    bm, bd = rows, max(16, next_pow2(D))
    has_a = a is not None
    kern = functools.partial(_kernel, bm=bm, bd=bd, eps=eps, has_a=has_a)
    xo, ho = pl.pallas_call(
        kern, grid=(cdiv(M, bm),),
        out_shape=[jax.ShapeDtypeStruct((M, D) if has_a else (1, 1), x.dtype),
                   jax.ShapeDtypeStruct((M, D), dtype)],
        compiler_params=compiler_params(4, 1), interpret=use_interpret(),
        name="nsa_decode_add_norm" if has_a else "nsa_decode_norm",
    )(x, a if has_a else x, scale.astype(dtype))
    return (xo if has_a else x), ho


def add_rms_norm_reference(x, a, scale, *, eps: float, dtype):
    """The jax.numpy twin of :func:`add_rms_norm` (``x + a`` then ``nnx.RMSNorm`` with
    ``dtype``): the same roundings."""
    s = x if a is None else (x.astype(jnp.float32) + a.astype(jnp.float32)).astype(x.dtype)
    sf = s.astype(jnp.float32)
    inv = lax.rsqrt(jnp.mean(sf * sf, axis=-1, keepdims=True) + eps)
    return s, (sf * (inv * scale.astype(dtype).astype(jnp.float32))).astype(dtype)
