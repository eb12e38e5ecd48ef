"""Rotary position embedding (RoPE), rotate-half convention.

Where NSA applies it (see ``nsa_jax.model`` for the module that calls this):
  * queries: at their own position t (one rotation shared by all three branches);
  * selection and window keys: at their own position s, so q·k depends on t - s as in dense attention;
  * compressed keys: φ sees *un-rotated* keys (position inside the block comes from φ's learned
    intra-block embedding); the compressed key of block i is then rotated at the position of the
    block's last token, p_i = i*d + l - 1. A query t sees block i only when p_i <= t, so the relative
    offset t - p_i is always >= 0, and a decoder can rotate block i as soon as it is emitted.
  * values are never rotated.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_freqs(head_dim: int, theta: float) -> jax.Array:
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def cos_sin(positions: jax.Array, head_dim: int, theta: float = 10000.0):
    """RoPE's (cos, sin) of the angles at ``positions`` (int, any shape): float32
    positions.shape + [head_dim / 2] each. Callers that rotate several tensors at the same
    positions (the decode step) compute them once and pass them to :func:`rotate`."""
    ang = jnp.asarray(positions).astype(jnp.float32)[..., None] * rope_freqs(head_dim, theta)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10000.0) -> jax.Array:
    """x [B,T,H,D]; positions [T] or [B,T] (int). Rotation computed in float32."""
    cos, sin = cos_sin(positions, x.shape[-1], theta)            # [..., T, D/2]
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    return rotate(x, cos[:, :, None, :], sin[:, :, None, :])


@jax.custom_vjp
def rotate(x, cos, sin):
    """x [..., D] rotated by angles given as (cos, sin) [..., D/2] (broadcast against x's leading
    dims): [x1 cos - x2 sin | x2 cos + x1 sin] in float32, rounded to x's dtype. Callers that
    rotate several tensors at the same positions (the decode step) compute the angles once
    (:func:`cos_sin`)."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _rotate_fwd(x, cos, sin):
    return rotate(x, cos, sin), (cos, sin)


def _rotate_bwd(res, dy):
    """The transpose is the rotation by -angle: dx = [dy1 cos + dy2 sin | dy2 cos - dy1 sin],
    written as one elementwise select over dy viewed as [..., 2, D/2] (the partner half read
    through a reverse), so XLA forms it in one pass with whatever produced dy. Jax's autodiff of
    the split / concatenate ran it as two half-width float32 outputs and a concatenate (4.1 +
    0.9 ms per 64k 125M train step on an H200; bench/NOTES.md, eleventh session). The angles
    are positions, not parameters: no cotangent."""
    cos, sin = res                           # dy has x's dtype (the output's)
    H = dy.shape[-1] // 2
    own = dy.reshape(*dy.shape[:-1], 2, H).astype(jnp.float32)     # [..., (dy1, dy2), H]
    partner = jnp.flip(own, axis=-2)                               # [..., (dy2, dy1), H]
    first = jax.lax.broadcasted_iota(jnp.int32, own.shape, own.ndim - 2) == 0
    c, s = cos[..., None, :], sin[..., None, :]
    dx = own * c + jnp.where(first, partner, -partner) * s
    return dx.reshape(dy.shape).astype(dy.dtype), None, None


rotate.defvjp(_rotate_fwd, _rotate_bwd)


def cmp_positions(Tc: int, block_l: int, stride_d: int, offset: int = 0) -> jax.Array:
    """Position p_i = i*d + l - 1 at which compressed key i is rotated."""
    return offset + jnp.arange(Tc) * stride_d + block_l - 1
