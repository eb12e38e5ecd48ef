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


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10000.0) -> jax.Array:
    """x [B,T,H,D]; positions [T] or [B,T] (int). Rotation computed in float32."""
    D = x.shape[-1]
    ang = positions.astype(jnp.float32)[..., None] * rope_freqs(D, theta)  # [..., T, D/2]
    if ang.ndim == 2:
        ang = ang[None]
    cos = jnp.cos(ang)[:, :, None, :]
    sin = jnp.sin(ang)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def cmp_positions(Tc: int, block_l: int, stride_d: int, offset: int = 0) -> jax.Array:
    """Position p_i = i*d + l - 1 at which compressed key i is rotated."""
    return offset + jnp.arange(Tc) * stride_d + block_l - 1
