"""From logits to token ids: :func:`filter_logits` (temperature, vocabulary padding, top-k,
top-p), :func:`sample_ids` (plain: traced inside the jitted decode loop,
:func:`nsa_jax.decode_loop.decode_loop_jit`) and :func:`sample` (the same, jitted on its own;
temperature 0 is greedy)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def filter_logits(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  vocab_limit: int | None = None):
    """Scaled, filtered float32 logits [..., V]: ids >= ``vocab_limit`` (vocabulary padding),
    outside the top ``top_k`` (0 = off) or outside the nucleus ``top_p`` (1 = off) get -inf.

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``
    (the most likely token is always kept). Ties at the top-k / top-p threshold are all kept.
    """
    x = logits.astype(jnp.float32)
    V = x.shape[-1]
    if vocab_limit is not None and vocab_limit < V:
        x = jnp.where(jnp.arange(V) < vocab_limit, x, -jnp.inf)
    if temperature > 0:
        x = x / temperature
    if 0 < top_k < V:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if top_p < 1.0:
        srt = jnp.sort(x, axis=-1)[..., ::-1]
        p = jax.nn.softmax(srt, axis=-1)
        before = jnp.cumsum(p, axis=-1) - p          # mass of strictly more likely tokens
        keep = before < top_p                        # always true for the first token
        thr = jnp.min(jnp.where(keep, srt, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x < thr, -jnp.inf, x)
    return x


def sample_ids(logits, key, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               vocab_limit: int | None = None):
    """Next token ids [...] from logits [..., V]. ``temperature == 0``: greedy (argmax).

    A plain function, so that the per-token sampler (:func:`sample`) and the multi-token decode
    loop trace the same math."""
    x = filter_logits(logits, temperature, top_k, top_p, vocab_limit)
    if temperature == 0:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, x, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit,
                   static_argnames=("temperature", "top_k", "top_p", "vocab_limit"))
def sample(logits, key, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           vocab_limit: int | None = None):
    """:func:`sample_ids`, jitted (one call per token)."""
    return sample_ids(logits, key, temperature, top_k, top_p, vocab_limit)
