"""The SwiGLU gate ``silu(a) * b`` with a custom VJP (the MLP of every block).

``swiglu(u)`` takes the input projection's output u = [a | b] (the two halves of the last axis,
as ``SwiGLU.w_in`` produces them) and returns silu(a) * b, computed exactly as the plain
expression. Its gradient is a custom VJP: du = [dh * b * silu'(a) | dh * silu(a)], with
silu'(a) = s (1 + a (1 - s)), s = sigmoid(a), formed in float32 and rounded once to u's dtype.

Why not jax's autodiff: the transpose of ``jnp.split`` is a concatenate, and inside the train
step XLA ran the two halves' gradients as separate passes (the silu product rule's two terms
summed in one, b's term in another) and a concatenate copying both into du: ~16 ms of
backward passes per 64k 125M train step on an H100 (bench/NOTES.md, eleventh session). Here du
is one elementwise select over u viewed as [..., 2, H], the partner half read through a
reverse, with one sigmoid per element: no concatenate. On an H200 at 64k (``bench/swiglu.py``)
it cut the MLP's forward + backward from 3.82-3.89 to 3.29 ms per layer. Two other forms were
slower: the same math ending in a concatenate compiled to the autodiff program again, and
evaluating both halves' expressions on every element (two sigmoids) took 3.49-3.50 ms.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _halves(u):
    H = u.shape[-1] // 2
    if u.shape[-1] != 2 * H:
        raise ValueError(f"swiglu: the last axis must hold [a | b] (even size), got {u.shape}")
    return H


def _gate(u):
    _halves(u)
    a, b = jnp.split(u, 2, axis=-1)
    return jax.nn.silu(a) * b


@jax.custom_vjp
def swiglu(u):
    """silu(a) * b for u = [a | b] on the last axis (module docstring)."""
    return _gate(u)


def _fwd(u):
    return _gate(u), u


def _bwd(u, dh):
    H = _halves(u)
    own = u.reshape(*u.shape[:-1], 2, H).astype(jnp.float32)   # [..., (a, b), H]
    partner = jnp.flip(own, axis=-2)                          # [..., (b, a), H]
    first = jax.lax.broadcasted_iota(jnp.int32, own.shape, own.ndim - 2) == 0
    a = jnp.where(first, own, partner)                        # a, on both halves
    b = jnp.where(first, partner, own)                        # b, on both halves
    s = jax.nn.sigmoid(a)                                     # one sigmoid per element
    d = dh.astype(jnp.float32)[..., None, :]
    # first half: dh * b * silu'(a) = dh * s * b (1 + a (1 - s)); second: dh * silu(a) = dh * s * a
    du = d * s * jnp.where(first, b * (1.0 + a * (1.0 - s)), a)
    return (du.reshape(u.shape).astype(u.dtype),)


swiglu.defvjp(_fwd, _bwd)
